#include "cpkv/sim/machine.hpp"

#include <algorithm>
#include <bit>
#include <cstring>

#include <fmt/format.h>

#include "cpkv/model/content.hpp"
#include "cpkv/model/expected.hpp"
#include "cpkv/model/oracle.hpp"

namespace cpkv::sim {

namespace {
constexpr std::uint8_t kDensePoison = 0x5A;  // fresh dense buffers hold garbage, as a GPU allocation would

std::int64_t layer_tag(std::int64_t batch, std::int32_t layer) { return batch * 4096 + layer + 1; }

// The writers a token-granularity zigzag split gives (the token_split mutant): tokens are cut into
// 2*cp blocks by count, so a page can straddle two ranks.
std::int32_t token_writer(std::int64_t token_in_extend, std::int64_t extend_len, std::int32_t cp) {
  const std::int64_t blocks = 2 * std::int64_t{cp};
  const std::int64_t small = extend_len / blocks;
  const std::int64_t big_blocks = extend_len % blocks;
  const std::int64_t big_tokens = big_blocks * (small + 1);
  const std::int64_t block =
      token_in_extend < big_tokens ? token_in_extend / (small + 1) : big_blocks + (token_in_extend - big_tokens) / small;
  return static_cast<std::int32_t>(block < cp ? block : blocks - 1 - block);
}

// The reversed_request_order mutant: the layout of the batch with its requests in reverse order and
// their ids kept. The plan, the page inverse and the gathers are all built from it, so everything
// agrees with everything else, and an expectation read from the same layout agrees too; only an
// oracle that walks the requests itself (model/oracle.hpp) sees the slots out of order. (The
// legacy_span_ar plan assumes request r + 1's span follows request r's, so under that variant the
// bug is not self-consistent and any check sees it.)
model::BatchLayout reversed_layout(const model::Setting& setting, const model::Batch& batch) {
  model::Batch reversed = batch;
  std::reverse(reversed.requests.begin(), reversed.requests.end());
  model::BatchLayout layout = model::layout_batch(setting, reversed);
  const auto last = static_cast<std::int32_t>(batch.requests.size()) - 1;
  for (model::Slot& slot : layout.slots) slot.request = last - slot.request;
  for (model::CurrentPage& page : layout.current) page.request = last - page.request;
  // The per-request vectors are indexed by request id: put them back in id order.
  std::reverse(layout.request_first_slot.begin(), layout.request_first_slot.end());
  std::reverse(layout.request_first_current_slot.begin(), layout.request_first_current_slot.end());
  std::reverse(layout.request_first_current_index.begin(), layout.request_first_current_index.end());
  return layout;
}

// The barrier checker's shadow word: (batch + 1) in the high bits, the arrived ranks' mask below.
constexpr std::uint32_t kShadowMaskBits = 8;  // cp <= limits::cp_max = 8
static_assert(model::limits::cp_max <= static_cast<std::int32_t>(kShadowMaskBits));
std::uint64_t shadow_batch_tag(std::int64_t batch) { return static_cast<std::uint64_t>(batch + 1) << kShadowMaskBits; }
}  // namespace

std::string_view to_string(Op op) {
  switch (op) {
    case Op::probe: return "probe";
    case Op::choose_path: return "choose_path";
    case Op::batch_begin: return "batch_begin";
    case Op::layer_begin: return "layer_begin";
    case Op::zero_dense: return "zero_dense";
    case Op::local_prefix: return "local_prefix";
    case Op::zero_own: return "zero_own";
    case Op::fill: return "fill";
    case Op::pack: return "pack";
    case Op::gather: return "gather";
    case Op::publish: return "publish";
    case Op::arrive: return "arrive";
    case Op::wait: return "wait";
    case Op::coll_arrive: return "coll_arrive";
    case Op::coll_wait: return "coll_wait";
    case Op::reduce: return "reduce";
    case Op::store: return "store";
    case Op::unpack: return "unpack";
    case Op::layer_end: return "layer_end";
    case Op::batch_arrive: return "batch_arrive";
    case Op::batch_wait: return "batch_wait";
    case Op::batch_end: return "batch_end";
  }
  return "?";
}

RankMachine::RankMachine(const World& world, const model::Setting& setting, const SimOptions& options, std::int32_t rank)
    : world_(&world), setting_(&setting), options_(options), rank_(rank), capacity_(model::staging_capacity(setting)) {
  pool_populated_.assign(static_cast<std::size_t>(setting.pool_pages_per_rank()), false);
  row_buffer_.resize(world.geometry().row_bytes_max());
}

void RankMachine::begin_run() {
  program_.clear();
  pc_ = 0;
  program_.push_back({Op::probe});
  program_.push_back({Op::coll_arrive, -1, 0, 0, -1});
  program_.push_back({Op::coll_wait});
  program_.push_back({Op::choose_path});
}

void RankMachine::begin_batch(const model::Batch& batch, std::int64_t batch_index) {
  batch_ = batch;
  batch_index_ = batch_index;
  program_.clear();
  pc_ = 0;
  program_.push_back({Op::batch_begin});
  // step() marks the rank finished when a program ends; a new batch's program runs again, so a
  // deadlock or crash report must not call this rank finished while it is mid-batch.
  world_->position(rank_).state.store(static_cast<std::int32_t>(RankState::running));
  set_position(program_[0]);
}

std::int32_t RankMachine::staging_half(std::int32_t layer) const {
  return options_.mutant == Mutant::single_half ? 0 : model::parity_half(layer);
}
std::int32_t RankMachine::dense_half(std::int32_t layer) const { return staging_half(layer); }

void RankMachine::violation(std::int32_t invariant, std::int32_t layer, std::int64_t slot, const std::string& detail) const {
  Violation v;
  v.invariant = invariant;
  v.rank = rank_;
  v.batch = batch_index_;
  v.layer = layer;
  v.slot = slot;
  v.step = static_cast<std::int64_t>(steps_taken_);
  std::snprintf(v.detail, sizeof(v.detail), "%s", detail.c_str());
  world_->record(v);
}

// ---------------------------------------------------------------------------------------------
// Program construction: once per batch, from the batch's plan.

void RankMachine::build_batch_program() {
  layout_ = options_.mutant == Mutant::reversed_request_order ? reversed_layout(*setting_, batch_) : model::layout_batch(*setting_, batch_);
  oracle_.emplace(setting_->page_size, batch_);
  if (options_.mutant == Mutant::token_split) {
    for (model::CurrentPage& page : layout_.current) {
      const std::int64_t extend_len = batch_.requests[page.request].extend_len;
      page.writer = token_writer(page.page_in_request * setting_->page_size, extend_len, setting_->cp);
    }
  }
  // The plan: built once per batch and anchored on the batch, never on a buffer address.
  const std::uint8_t* dense_address = world_->dense_page(rank_, 0, 0, 0);
  const bool cache_hit = options_.mutant == Mutant::address_keyed_plan_cache
                             ? plan_cache_ && plan_cache_->dense_address == dense_address
                             : plan_cache_ && plan_cache_->batch_index == batch_index_;
  if (!cache_hit) {
    plan_cache_ = CachedPlan{batch_index_, dense_address, model::variant_plan(layout_, path_variant_, rank_)};
    ++plan_builds_this_batch_;
  }
  plan_ = plan_cache_->plan;
  // Checker (invariant 5): the plan in use must be the one this batch gives. It observes only.
  const model::VariantPlan fresh = model::variant_plan(layout_, path_variant_, rank_);
  if (fresh.gather1 != plan_.gather1 || fresh.gather2 != plan_.gather2 || fresh.own_current != plan_.own_current ||
      fresh.allreduce_ranges != plan_.allreduce_ranges || fresh.compact_pages != plan_.compact_pages) {
    violation(5, -1, -1, fmt::format("stale plan served for batch {}: {} gather slots planned, the batch has {}", batch_index_,
                                     std::max(plan_.gather1.size(), plan_.gather2.size()), layout_.slot_count));
  }

  // The page inverse, built once per batch: token -> destination row.
  const auto target = plan_.fill_to_staging ? model::InverseTarget::staging : model::InverseTarget::dense;
  inverse_page_begin_.assign(static_cast<std::size_t>(layout_.current_pages_total) + 1, 0);
  if (options_.mutant == Mutant::token_split) {
    inverse_ = {};
    for (std::int64_t i = 0; i < layout_.current_pages_total; ++i) {
      inverse_page_begin_[i] = static_cast<std::int64_t>(inverse_.tokens.size());
      const model::CurrentPage& page = layout_.current[i];
      const model::Request& req = batch_.requests[page.request];
      for (std::int32_t row = 0; row < page.rows_valid; ++row) {
        const std::int64_t in_extend = page.page_in_request * setting_->page_size + row;
        if (token_writer(in_extend, req.extend_len, setting_->cp) != rank_) continue;
        inverse_.tokens.push_back({page.request, req.prefix_len + in_extend});
        const std::int64_t base = target == model::InverseTarget::staging ? i : page.slot;
        inverse_.dest_row.push_back(base * setting_->page_size + row);
      }
    }
    inverse_page_begin_[layout_.current_pages_total] = static_cast<std::int64_t>(inverse_.tokens.size());
  } else {
    inverse_ = model::page_inverse(layout_, batch_, rank_, target);
    std::int64_t entry = 0;
    for (std::int64_t i = 0; i < layout_.current_pages_total; ++i) {
      inverse_page_begin_[i] = entry;
      if (layout_.current[i].writer == rank_) entry += layout_.current[i].rows_valid;
    }
    inverse_page_begin_[layout_.current_pages_total] = entry;
  }

  // The overflow verdict: batch-logical values only, so every rank reaches the same one.
  model::Verdict verdict = model::overflow_verdict(layout_.current_pages_total, capacity_.staging_slots);
  if (options_.mutant == Mutant::rank_local_overflow) {
    const auto own = static_cast<std::int64_t>(plan_.own_current.size());
    verdict = model::overflow_verdict(own * setting_->cp, capacity_.staging_slots);
  }
  world_->verdict(rank_).store(verdict.overflow ? 2 : 1);

  program_.push_back({Op::batch_arrive});
  program_.push_back({Op::batch_wait});
  if (!verdict.overflow) {
    for (std::int32_t layer = 0; layer < options_.layers; ++layer) append_layer(plan_, layer);
  } else {
    ++totals_.overflows;
  }
  program_.push_back({Op::batch_arrive});
  program_.push_back({Op::batch_wait});
  program_.push_back({Op::batch_end});
}

void RankMachine::append_barrier(std::int32_t layer) {
  program_.push_back({Op::arrive, layer});
  program_.push_back({Op::wait, layer});
}

void RankMachine::append_collective(std::int32_t layer, std::int64_t a, std::int64_t b, std::int32_t kind) {
  program_.push_back({Op::coll_arrive, layer, a, b, kind});
  program_.push_back({Op::coll_wait, layer});
  program_.push_back({Op::reduce, layer, a, b, kind});
  program_.push_back({Op::coll_arrive, layer, a, b, kind});
  program_.push_back({Op::coll_wait, layer});
  program_.push_back({Op::store, layer, a, b, kind});
}

void RankMachine::append_layer(const model::VariantPlan& plan, std::int32_t layer) {
  const bool skip_zero = options_.mutant == Mutant::skip_zero;
  program_.push_back({Op::layer_begin, layer});
  if (plan.zero_dense && !skip_zero) program_.push_back({Op::zero_dense, layer});
  for (std::int64_t slot : plan.local_prefix_slots) program_.push_back({Op::local_prefix, layer, slot});
  if (plan.zero_own_current && !skip_zero) {
    for (std::int64_t i : plan.own_current) program_.push_back({Op::zero_own, layer, i});
  }
  bool barrier_pending = plan.barrier && options_.mutant != Mutant::no_barrier;
  if (options_.mutant == Mutant::skip_idle_barrier && plan.own_current.empty()) barrier_pending = false;
  bool waited = false;
  if (barrier_pending && options_.mutant == Mutant::arrive_before_fill) program_.push_back({Op::arrive, layer});
  // Fill: every current page this rank writes rows of (under token_split, pages it shares too).
  for (std::int64_t i = 0; i < layout_.current_pages_total; ++i) {
    const std::int64_t begin = inverse_page_begin_[i];
    const std::int64_t end = inverse_page_begin_[i + 1];
    if (begin < end) program_.push_back({Op::fill, layer, i, begin, static_cast<std::int32_t>(end - begin)});
  }
  if (barrier_pending && options_.mutant == Mutant::arrive_before_fill) {
    program_.push_back({Op::wait, layer});
    waited = true;
  }
  if (plan.compact_allreduce) {
    for (std::int64_t i = 0; i < plan.compact_pages; ++i) program_.push_back({Op::pack, layer, i});
  }
  for (std::size_t s = 0; s < plan.gather1.size(); ++s) {
    const model::SlotDescriptor& d = plan.gather1[s];
    if (d.table_index != model::SlotDescriptor::kSkip) program_.push_back({Op::gather, layer, static_cast<std::int64_t>(s), d.source_page, d.table_index});
  }
  if (plan.publish) {
    for (std::int64_t i : plan.own_current) program_.push_back({Op::publish, layer, i});
  }
  if (barrier_pending && !waited) append_barrier(layer);
  for (std::size_t s = 0; s < plan.gather2.size(); ++s) {
    const model::SlotDescriptor& d = plan.gather2[s];
    if (d.table_index != model::SlotDescriptor::kSkip) program_.push_back({Op::gather, layer, static_cast<std::int64_t>(s), d.source_page, d.table_index});
  }
  for (std::size_t k = 0; k < setting_->kinds.size(); ++k) {
    if (!setting_->kind_active(k, layer)) continue;
    for (const model::SlotRange& range : plan.allreduce_ranges) append_collective(layer, range.slot_begin, range.slot_end, static_cast<std::int32_t>(k));
    if (plan.compact_allreduce) append_collective(layer, 0, -1, static_cast<std::int32_t>(k));
  }
  if (plan.compact_allreduce) {
    for (std::int64_t i = 0; i < plan.compact_pages; ++i) program_.push_back({Op::unpack, layer, i});
  }
  program_.push_back({Op::layer_end, layer});
}

// ---------------------------------------------------------------------------------------------
// Execution.

bool RankMachine::wait_satisfied(const Step& s) const {
  const std::int32_t cp = setting_->cp;
  switch (s.op) {
    case Op::wait:
      if (options_.mutant == Mutant::barrier_reset_race) return world_->reset_barrier().count.load(std::memory_order_acquire) >= static_cast<std::uint64_t>(cp);
      {
        // The planted off-by-one: compare against the previous phase, so a rank passes phase k once
        // every peer reached k - 1.
        const std::uint64_t needed = options_.mutant == Mutant::barrier_passes_early ? barriers_arrived_ - 1 : barriers_arrived_;
        for (std::int32_t p = 0; p < cp; ++p) {
          if (world_->barrier_counter(p).value.load(std::memory_order_acquire) < needed) return false;
        }
      }
      return true;
    case Op::coll_wait:
      for (std::int32_t p = 0; p < cp; ++p) {
        if (world_->collective_counter(p).value.load(std::memory_order_acquire) < collectives_arrived_) return false;
      }
      return true;
    case Op::batch_wait:
      for (std::int32_t p = 0; p < cp; ++p) {
        if (world_->batch_counter(p).value.load(std::memory_order_acquire) < batches_arrived_) return false;
      }
      return true;
    default:
      return true;
  }
}

bool RankMachine::runnable() const { return !finished() && wait_satisfied(program_[pc_]); }

void RankMachine::set_position(const Step& s) {
  RankPosition& pos = world_->position(rank_);
  pos.batch.store(batch_index_, std::memory_order_relaxed);
  pos.step.store(static_cast<std::int64_t>(pc_), std::memory_order_relaxed);
  pos.layer.store(s.layer, std::memory_order_relaxed);
  pos.op.store(static_cast<std::int32_t>(s.op), std::memory_order_relaxed);
  pos.phase.store(static_cast<std::int64_t>(barriers_arrived_), std::memory_order_relaxed);
}

std::string RankMachine::describe_position() const {
  if (finished()) return fmt::format("rank {}: finished batch {}", rank_, batch_index_);
  const Step& s = program_[pc_];
  std::string waiting;
  if (s.op == Op::wait) waiting = fmt::format(" for barrier phase {}", barriers_arrived_);
  if (s.op == Op::coll_wait) waiting = fmt::format(" for collective {}", collectives_arrived_);
  if (s.op == Op::batch_wait) waiting = fmt::format(" for batch barrier {}", batches_arrived_);
  return fmt::format("rank {}: batch {} layer {} step {} ({}{})", rank_, batch_index_, s.layer, pc_, to_string(s.op), waiting);
}

void RankMachine::step() {
  const Step s = program_[pc_];
  set_position(s);
  run_step(s);
  ++pc_;
  ++steps_taken_;
  if (finished()) {
    world_->position(rank_).state.store(static_cast<std::int32_t>(RankState::finished));
  } else {
    set_position(program_[pc_]);  // where the rank is now: the step it runs (or waits at) next
  }
}

std::uint8_t* RankMachine::fill_destination(std::int32_t layer, std::size_t kind, std::int64_t) const {
  return plan_.fill_to_staging ? world_->staging_page(rank_, staging_half(layer), kind, 0)
                               : world_->dense_page(rank_, dense_half(layer), kind, 0);
}

// Invariant 2: a write into a half that peers read must not land while a peer may still read that
// half for an earlier layer.
void RankMachine::check_write_to_shared_half(std::int32_t layer, std::int32_t half, std::int64_t slot, std::int64_t) const {
  for (std::int32_t p = 0; p < setting_->cp; ++p) {
    if (p == rank_) continue;
    const std::int64_t reading = world_->reading_layer(p).load(std::memory_order_acquire);
    if (reading < 0 || reading == layer || staging_half(static_cast<std::int32_t>(reading)) != half) continue;
    violation(2, layer, slot, fmt::format("rank {} writes half {} for layer {} while rank {} may still read it for layer {}",
                                          rank_, half, layer, p, reading));
  }
}

void RankMachine::check_read_stamp(const StagingStamp& stamp, std::int32_t writer, std::int32_t layer, std::int64_t slot) const {
  // Stamps carry (batch, layer): data of the same layer of an earlier batch is stale too.
  const std::int64_t stamped = stamp.layer.load(std::memory_order_acquire);
  const auto state = static_cast<StampState>(stamp.state.load(std::memory_order_acquire));
  if (stamped == layer_tag(batch_index_, layer) && (state == StampState::filled || state == StampState::published)) return;
  static constexpr const char* kStates[] = {"poisoned", "zeroed", "filled", "published"};
  const std::string held = stamped <= 0 ? std::string("nothing") : fmt::format("batch {} layer {}", (stamped - 1) / 4096, (stamped - 1) % 4096);
  violation(2, layer, slot, fmt::format("rank {} reads rank {}'s page for batch {} layer {} but it holds {} ({})", rank_, writer,
                                        batch_index_, layer, held, kStates[static_cast<int>(state)]));
}

void RankMachine::note_fill(std::int32_t layer, std::int64_t i) const {
  PageFillers& fillers = world_->fillers(staging_half(layer), i);
  std::uint64_t old = fillers.value.load(std::memory_order_acquire);
  std::uint64_t next = 0;
  do {
    const bool same_layer = (old >> 32) == static_cast<std::uint64_t>(layer_tag(batch_index_, layer)) && old != ~std::uint64_t{0};
    const std::uint64_t mask = (same_layer ? old & 0xffffffffULL : 0) | (1ULL << rank_);
    next = (static_cast<std::uint64_t>(layer_tag(batch_index_, layer)) << 32) | mask;
  } while (!fillers.value.compare_exchange_weak(old, next, std::memory_order_acq_rel));
  const std::uint64_t mask = next & 0xffffffffULL;
  if (std::popcount(mask) > 1) {
    violation(1, layer, layout_.current[i].slot, fmt::format("current page {} has {} writers on layer {} (rank mask 0x{:x})", i,
                                                            std::popcount(mask), layer, mask));
  }
}

void RankMachine::populate_pool() {
  const std::int32_t cp = setting_->cp;
  for (const model::Slot& slot : layout_.slots) {
    if (slot.kind != model::SlotKind::prefix || slot.page_or_index % cp != rank_) continue;
    const std::int64_t local = slot.page_or_index / cp;
    if (pool_populated_[local]) continue;
    pool_populated_[local] = true;
    for (std::int32_t layer = 0; layer < options_.layers; ++layer) {
      for (std::size_t k = 0; k < setting_->kinds.size(); ++k) {
        const std::uint32_t row_bytes = setting_->kinds[k].row_bytes;
        std::uint8_t* page = world_->pool_page(rank_, layer, k, local);
        for (std::int32_t row = 0; row < setting_->page_size; ++row) {
          const std::uint64_t key = model::prefix_row_key(options_.seed, layer, static_cast<std::uint32_t>(k), slot.page_or_index, row);
          for (std::uint32_t b = 0; b < row_bytes; ++b) page[row * row_bytes + b] = model::content_byte(key, b);
        }
      }
    }
  }
}

// Checker (invariant 5): the compose plan is built once per batch. More builds mean a per-layer
// rebuild; none means a plan served from an earlier batch's cache.
void RankMachine::check_plan_built_once(std::int32_t layer) {
  if (plan_builds_this_batch_ == 1) return;
  violation(5, layer, -1, fmt::format("batch {}: the compose plan was built {} times by layer {} (once per batch)", batch_index_,
                                      plan_builds_this_batch_, layer));
}

// Checker shadow (invariant 4): record this rank's arrival for (batch, layer, barrier use) in a word
// of its own, apart from the counters the barrier itself spins on.
void RankMachine::note_barrier_arrival(std::int32_t layer) {
  const std::int32_t use = barrier_uses_arrived_++;
  if (use >= kBarrierUsesPerLayerMax) {
    violation(4, layer, -1, fmt::format("rank {} arrives at barrier use {} of layer {}: the shadow holds {}", rank_, use, layer, kBarrierUsesPerLayerMax));
    return;
  }
  BarrierShadow& shadow = world_->barrier_shadow(layer, use);
  const std::uint64_t tag = shadow_batch_tag(batch_index_);
  std::uint64_t old = shadow.value.load(std::memory_order_acquire);
  std::uint64_t next = 0;
  do {
    const bool same_batch = (old >> kShadowMaskBits) == (tag >> kShadowMaskBits);
    next = (same_batch ? old : tag) | (std::uint64_t{1} << rank_);
  } while (!shadow.value.compare_exchange_weak(old, next, std::memory_order_acq_rel));
}

// Checker (invariant 4): a rank passing the barrier of (batch, layer, use) finds every rank's
// arrival for that very barrier in the shadow, whatever the counters it waited on said.
void RankMachine::check_barrier_pass(std::int32_t layer) {
  const std::int32_t use = barrier_uses_passed_++;
  if (use >= kBarrierUsesPerLayerMax) return;  // reported at the arrival
  const std::uint64_t value = world_->barrier_shadow(layer, use).value.load(std::memory_order_acquire);
  const std::uint64_t mask = (value >> kShadowMaskBits) == (shadow_batch_tag(batch_index_) >> kShadowMaskBits) ? value & 0xffu : 0;
  for (std::int32_t p = 0; p < setting_->cp; ++p) {
    if ((mask >> p) & 1u) continue;
    violation(4, layer, -1, fmt::format("rank {} passed the barrier of batch {} layer {} (use {}, phase {}) before rank {} arrived for it", rank_,
                                        batch_index_, layer, use, barriers_arrived_, p));
    return;
  }
}

void RankMachine::check_layer(std::int32_t layer) {
  if (!options_.check_bytes) return;
  const std::int32_t half = dense_half(layer);
  for (std::size_t k = 0; k < setting_->kinds.size(); ++k) {
    if (!setting_->kind_active(k, layer)) continue;
    const std::uint32_t row_bytes = setting_->kinds[k].row_bytes;
    const std::uint8_t* dense = world_->dense_page(rank_, half, k, 0);
    std::span<std::uint8_t> expected(row_buffer_.data(), row_bytes);
    // Rows are compared as they are recomputed (no whole expected buffer), keeping the first difference.
    model::Mismatch mismatch;
    // The default expectation comes from the plain oracle, which never reads the layout the gather
    // ran on; the layout's own expectation is kept only to show what that independence catches.
    const bool from_layout = options_.expected_from == ExpectedBytesFrom::batch_layout;
    const std::int64_t slot_count = from_layout ? layout_.slot_count : oracle_->slot_count();
    for (std::int64_t slot = 0; slot < slot_count; ++slot) {
      for (std::int32_t row = 0; row < setting_->page_size; ++row) {
        const std::uint8_t* actual = dense + (slot * setting_->page_size + row) * row_bytes;
        if (from_layout) {
          model::expected_row(layout_, options_.seed, layer, static_cast<std::uint32_t>(k), slot, row, expected);
        } else {
          oracle_->row(options_.seed, layer, static_cast<std::uint32_t>(k), slot, row, expected);
        }
        if (std::memcmp(actual, expected.data(), row_bytes) == 0) continue;
        for (std::uint32_t b = 0; b < row_bytes; ++b) {
          if (actual[b] == expected[b]) continue;
          if (mismatch.wrong_bytes == 0) {
            mismatch.slot = slot;
            mismatch.row = row;
            mismatch.byte = b;
            mismatch.expected = expected[b];
            mismatch.actual = actual[b];
          }
          ++mismatch.wrong_bytes;
        }
      }
    }
    if (mismatch.wrong_bytes == 0) continue;
    const std::string text = mismatch.describe(rank_, batch_index_, layer, setting_->kinds[k].name);
    ++totals_.mismatches;
    if (totals_.first_mismatch.empty()) totals_.first_mismatch = text;
    violation(6, layer, -1, text);
  }
}

void RankMachine::run_step(const Step& s) {
  const std::int32_t cp = setting_->cp;
  const std::int32_t P = setting_->page_size;
  const std::int32_t hs = s.layer >= 0 ? staging_half(s.layer) : 0;
  const std::int32_t hd = s.layer >= 0 ? dense_half(s.layer) : 0;
  const auto for_kinds = [&](auto&& body) {
    for (std::size_t k = 0; k < setting_->kinds.size(); ++k) {
      if (s.layer < 0 || setting_->kind_active(k, s.layer)) body(k, std::uint64_t{setting_->kinds[k].row_bytes} * P);
    }
  };
  const auto in_batch = [&](std::int64_t index, std::int64_t bound, const char* what) {
    if (index >= 0 && index < bound) return true;
    violation(5, s.layer, index, fmt::format("plan names {} {} outside this batch's [0, {})", what, index, bound));
    return false;
  };
  switch (s.op) {
    case Op::probe: {
      world_->ipc_probe(rank_).store(rank_ == options_.ipc_missing_rank ? 0 : 1);
      world_->position(rank_).state.store(static_cast<std::int32_t>(RankState::running));
      world_->position(rank_).pid.store(static_cast<std::int32_t>(::getpid()));
      break;
    }
    case Op::choose_path: {
      std::int32_t capable = world_->ipc_probe(rank_).load();
      if (options_.mutant != Mutant::unagreed_capability) {
        for (std::int32_t p = 0; p < cp; ++p) capable = std::min(capable, world_->ipc_probe(p).load());  // the agreed MIN
      }
      const bool needs_ipc = options_.variant == model::Variant::v2 || options_.variant == model::Variant::symm_dense ||
                             options_.variant == model::Variant::staging_publish || options_.variant == model::Variant::staging_direct;
      path_variant_ = needs_ipc && capable == 0 ? model::Variant::v2_fallback : options_.variant;
      world_->chosen_path(rank_).store(static_cast<std::int32_t>(path_variant_));
      break;
    }
    case Op::batch_begin: {
      plan_builds_this_batch_ = 0;
      build_batch_program();
      populate_pool();
      for (std::int32_t half = 0; half < 2; ++half) {
        for (std::size_t k = 0; k < setting_->kinds.size(); ++k) {
          std::memset(world_->dense_page(rank_, half, k, 0), kDensePoison, layout_.slot_count * world_->geometry().page_bytes(k));
        }
      }
      ++totals_.batches;
      break;
    }
    case Op::layer_begin:
      barrier_uses_arrived_ = 0;
      barrier_uses_passed_ = 0;
      if (options_.mutant == Mutant::plan_rebuilt_per_layer) {
        // The planted bug: the plan is rebuilt on every layer (the same plan, at a per-layer cost).
        plan_ = model::variant_plan(layout_, path_variant_, rank_);
        ++plan_builds_this_batch_;
      }
      check_plan_built_once(s.layer);
      break;
    case Op::zero_dense:
      for_kinds([&](std::size_t k, std::uint64_t page_bytes) { std::memset(world_->dense_page(rank_, hd, k, 0), 0, layout_.slot_count * page_bytes); });
      break;
    case Op::local_prefix: {
      if (!in_batch(s.a, layout_.slot_count, "slot")) break;
      const std::int64_t g = layout_.slots[s.a].page_or_index;
      for_kinds([&](std::size_t k, std::uint64_t page_bytes) {
        std::memcpy(world_->dense_page(rank_, hd, k, s.a), world_->pool_page(rank_, s.layer, k, g / cp), page_bytes);
      });
      break;
    }
    case Op::zero_own: {
      if (!in_batch(s.a, layout_.current_pages_total, "current page")) break;
      const std::int64_t slot = layout_.current[s.a].slot;
      if (plan_.fill_to_staging) {
        check_write_to_shared_half(s.layer, hs, s.a, 0);
        for_kinds([&](std::size_t k, std::uint64_t page_bytes) { std::memset(world_->staging_page(rank_, hs, k, s.a), 0, page_bytes); });
        StagingStamp& stamp = world_->stamp(rank_, hs, s.a);
        stamp.layer.store(layer_tag(batch_index_, s.layer), std::memory_order_release);
        stamp.state.store(static_cast<std::int32_t>(StampState::zeroed), std::memory_order_release);
      } else {
        if (path_variant_ == model::Variant::symm_dense) check_write_to_shared_half(s.layer, hd, slot, 0);
        for_kinds([&](std::size_t k, std::uint64_t page_bytes) { std::memset(world_->dense_page(rank_, hd, k, slot), 0, page_bytes); });
        StagingStamp& stamp = world_->dense_stamp(rank_, hd, slot);
        stamp.layer.store(layer_tag(batch_index_, s.layer), std::memory_order_release);
        stamp.state.store(static_cast<std::int32_t>(StampState::zeroed), std::memory_order_release);
      }
      break;
    }
    case Op::fill: {
      if (!in_batch(s.a, layout_.current_pages_total, "current page")) break;
      const bool shared = plan_.fill_to_staging || path_variant_ == model::Variant::symm_dense;
      const std::int64_t slot = layout_.current[s.a].slot;
      if (shared) check_write_to_shared_half(s.layer, plan_.fill_to_staging ? hs : hd, s.a, 0);
      for_kinds([&](std::size_t k, std::uint64_t) {
        const std::uint32_t row_bytes = setting_->kinds[k].row_bytes;
        std::uint8_t* base = fill_destination(s.layer, k, s.a);
        for (std::int64_t e = s.b; e < s.b + s.c; ++e) {
          const model::LocalToken& token = inverse_.tokens[e];
          const std::uint64_t key = model::current_row_key(options_.seed, s.layer, static_cast<std::uint32_t>(k), token.request, token.token);
          std::uint8_t* row = base + inverse_.dest_row[e] * row_bytes;
          for (std::uint32_t w = 0; w < row_bytes / 8; ++w) {
            const std::uint64_t word = model::content_word(key, w);
            std::memcpy(row + 8 * w, &word, 8);
          }
          for (std::uint32_t b = row_bytes / 8 * 8; b < row_bytes; ++b) row[b] = model::content_byte(key, b);
        }
      });
      StagingStamp& stamp = plan_.fill_to_staging ? world_->stamp(rank_, hs, s.a) : world_->dense_stamp(rank_, hd, slot);
      stamp.layer.store(layer_tag(batch_index_, s.layer), std::memory_order_release);
      stamp.state.store(static_cast<std::int32_t>(StampState::filled), std::memory_order_release);
      note_fill(s.layer, s.a);
      break;
    }
    case Op::pack: {
      if (!in_batch(s.a, layout_.current_pages_total, "current page")) break;
      const model::CurrentPage& page = layout_.current[s.a];
      for_kinds([&](std::size_t k, std::uint64_t page_bytes) {
        std::uint8_t* compact = world_->compact_page(rank_, k, s.a);
        if (page.writer == rank_) {
          std::memcpy(compact, world_->dense_page(rank_, hd, k, page.slot), page_bytes);
        } else {
          std::memset(compact, 0, page_bytes);
        }
      });
      break;
    }
    case Op::gather: {
      if (!in_batch(s.a, layout_.slot_count, "slot")) break;
      const std::int32_t table_index = s.c;
      if (table_index == model::SlotDescriptor::kZeroFill) {
        for_kinds([&](std::size_t k, std::uint64_t page_bytes) { std::memset(world_->dense_page(rank_, hd, k, s.a), 0, page_bytes); });
        break;
      }
      const std::int32_t source_rank = table_index % cp;
      if (table_index < cp) {
        if (!in_batch(s.b, setting_->pool_pages_per_rank(), "pool page")) break;
        for_kinds([&](std::size_t k, std::uint64_t page_bytes) {
          std::memcpy(world_->dense_page(rank_, hd, k, s.a), world_->pool_page(source_rank, s.layer, k, s.b), page_bytes);
          if (source_rank != rank_) totals_.bytes_gathered_from_peers += page_bytes;
        });
        break;
      }
      const bool from_symm_dense = path_variant_ == model::Variant::symm_dense;
      if (!in_batch(s.b, from_symm_dense ? layout_.slot_count : world_->current_capacity(), "source page")) break;
      if (source_rank != rank_) world_->reading_layer(rank_).store(s.layer, std::memory_order_release);
      check_read_stamp(from_symm_dense ? world_->dense_stamp(source_rank, hd, s.b) : world_->stamp(source_rank, hs, s.b), source_rank, s.layer, s.a);
      for_kinds([&](std::size_t k, std::uint64_t page_bytes) {
        const std::uint8_t* source = from_symm_dense ? world_->dense_page(source_rank, hd, k, s.b) : world_->staging_page(source_rank, hs, k, s.b);
        std::memcpy(world_->dense_page(rank_, hd, k, s.a), source, page_bytes);
        if (source_rank != rank_) totals_.bytes_gathered_from_peers += page_bytes;
      });
      break;
    }
    case Op::publish: {
      if (!in_batch(s.a, layout_.current_pages_total, "current page")) break;
      check_write_to_shared_half(s.layer, hs, s.a, 0);
      const std::int64_t slot = layout_.current[s.a].slot;
      for_kinds([&](std::size_t k, std::uint64_t page_bytes) {
        std::memcpy(world_->staging_page(rank_, hs, k, s.a), world_->dense_page(rank_, hd, k, slot), page_bytes);
      });
      StagingStamp& stamp = world_->stamp(rank_, hs, s.a);
      stamp.layer.store(layer_tag(batch_index_, s.layer), std::memory_order_release);
      stamp.state.store(static_cast<std::int32_t>(StampState::published), std::memory_order_release);
      break;
    }
    case Op::arrive: {
      note_barrier_arrival(s.layer);
      ++barriers_arrived_;
      ++totals_.barriers;
      world_->barrier_counter(rank_).value.store(barriers_arrived_, std::memory_order_release);
      if (options_.mutant == Mutant::barrier_reset_race) world_->reset_barrier().count.fetch_add(1, std::memory_order_acq_rel);
      break;
    }
    case Op::wait: {
      if (options_.mutant == Mutant::barrier_reset_race) {
        // The planted bug: the first rank through resets the shared count for reuse, so a peer that
        // has not yet seen the full count waits on a count that will never come back.
        world_->reset_barrier().count.store(0, std::memory_order_release);
      }
      check_barrier_pass(s.layer);
      break;
    }
    case Op::coll_arrive: {
      CollectiveLog& log = world_->collectives(rank_);
      const std::uint64_t bytes = s.b < 0 ? static_cast<std::uint64_t>(plan_.compact_pages) : static_cast<std::uint64_t>(s.b - s.a);
      const std::uint64_t signature = model::mix64(log.signature.load() ^ model::mix64((bytes << 8) ^ static_cast<std::uint64_t>(s.c + 1) ^ (s.b < 0 ? 1ULL << 62 : 0)));
      log.signature.store(signature, std::memory_order_relaxed);
      log.history[collectives_arrived_ % 4].store(signature, std::memory_order_release);
      ++collectives_arrived_;
      log.calls.store(collectives_arrived_, std::memory_order_relaxed);
      world_->collective_counter(rank_).value.store(collectives_arrived_, std::memory_order_release);
      break;
    }
    case Op::coll_wait: {
      // Checker (invariant 7): every rank issued the same collective with the same size.
      const std::uint64_t mine = world_->collectives(rank_).history[(collectives_arrived_ - 1) % 4].load(std::memory_order_acquire);
      for (std::int32_t p = 0; p < cp; ++p) {
        const std::uint64_t theirs = world_->collectives(p).history[(collectives_arrived_ - 1) % 4].load(std::memory_order_acquire);
        if (theirs != mine) {
          violation(7, s.layer, -1, fmt::format("collective {}: rank {} and rank {} issued different collectives (paths {} and {})", collectives_arrived_,
                                                rank_, p, model::to_string(static_cast<model::Variant>(world_->chosen_path(rank_).load())),
                                                model::to_string(static_cast<model::Variant>(world_->chosen_path(p).load()))));
          break;
        }
      }
      break;
    }
    case Op::reduce:
    case Op::store: {
      const auto k = static_cast<std::size_t>(s.c);
      const std::uint64_t page_bytes = world_->geometry().page_bytes(k);
      const bool compact = s.b < 0;
      const std::int64_t first = compact ? 0 : s.a;
      const std::int64_t pages = compact ? plan_.compact_pages : s.b - s.a;
      if (s.op == Op::reduce) ++totals_.collectives;  // one all-reduce per reduce step, empty ones included
      if (pages <= 0) break;
      const std::int64_t bound = compact ? world_->geometry().current_pages_max : world_->geometry().slot_count_max;
      if (!in_batch(first + pages - 1, bound, "collective page")) break;
      const std::uint64_t bytes = pages * page_bytes;
      std::uint8_t* scratch = world_->scratch(rank_);
      const auto buffer = [&](std::int32_t p) { return compact ? world_->compact_page(p, k, 0) : world_->dense_page(p, hd, k, first); };
      if (s.op == Op::reduce) {
        std::memcpy(scratch, buffer(0), bytes);
        for (std::int32_t p = 1; p < cp; ++p) {
          const std::uint8_t* other = buffer(p);
          for (std::uint64_t b = 0; b < bytes; ++b) scratch[b] = static_cast<std::uint8_t>(scratch[b] + other[b]);
        }
        totals_.bytes_reduced += bytes;
      } else {
        std::memcpy(buffer(rank_), scratch, bytes);
      }
      break;
    }
    case Op::unpack: {
      if (!in_batch(s.a, layout_.current_pages_total, "current page")) break;
      const std::int64_t slot = layout_.current[s.a].slot;
      for_kinds([&](std::size_t k, std::uint64_t page_bytes) {
        std::memcpy(world_->dense_page(rank_, hd, k, slot), world_->compact_page(rank_, k, s.a), page_bytes);
      });
      break;
    }
    case Op::layer_end:
      world_->reading_layer(rank_).store(-1, std::memory_order_release);
      ++totals_.layers;
      check_layer(s.layer);
      break;
    case Op::batch_arrive:
      ++batches_arrived_;
      world_->batch_counter(rank_).value.store(batches_arrived_, std::memory_order_release);
      break;
    case Op::batch_wait:
      // Checker (invariant 3): after the first batch barrier every rank has judged this batch.
      if (batches_arrived_ % 2 == 1) {
        const std::int32_t mine = world_->verdict(rank_).load();
        for (std::int32_t p = 0; p < cp; ++p) {
          const std::int32_t theirs = world_->verdict(p).load();
          if (theirs != mine) {
            violation(3, -1, -1, fmt::format("batch {}: rank {} judged {}, rank {} judged {}", batch_index_, rank_, mine == 2 ? "overflow" : "ok", p,
                                             theirs == 2 ? "overflow" : "ok"));
            break;
          }
        }
        // Checker (invariant 7): every rank took the same exchange path after the capability probe.
        const std::int32_t path = world_->chosen_path(rank_).load();
        for (std::int32_t p = 0; p < cp; ++p) {
          const std::int32_t theirs = world_->chosen_path(p).load();
          if (theirs != path) {
            violation(7, -1, -1, fmt::format("rank {} took path {}, rank {} took path {}", rank_, model::to_string(static_cast<model::Variant>(path)), p,
                                             model::to_string(static_cast<model::Variant>(theirs))));
            break;
          }
        }
      }
      break;
    case Op::batch_end:
      break;
  }
}

}  // namespace cpkv::sim

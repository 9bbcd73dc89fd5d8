#include "cpkv/sim/machine.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <unistd.h>

#include <fmt/format.h>

#include "cpkv/model/assert.hpp"
#include "cpkv/model/content.hpp"
#include "cpkv/model/expected.hpp"
#include "cpkv/model/oracle.hpp"
#include "cpkv/sim/attention_plan.hpp"

namespace cpkv::sim {

namespace {
constexpr std::uint8_t kDensePoison = 0x5A;  // fresh dense buffers hold garbage, as a GPU allocation would

// The writers a token-granularity zigzag split gives (the token_split mutant): tokens are cut into
// 2*cp blocks by count, so a page can straddle two ranks. The page split's formula, on tokens.
std::int32_t token_writer(std::int64_t token_in_extend, std::int64_t extend_len, std::int32_t cp) {
  return model::writer_in_request(model::SplitPolicy::zigzag, token_in_extend, extend_len, cp);
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
    case Op::all_gather: return "all_gather";
    case Op::reorder: return "reorder";
    case Op::layer_end: return "layer_end";
    case Op::batch_arrive: return "batch_arrive";
    case Op::batch_wait: return "batch_wait";
    case Op::batch_end: return "batch_end";
  }
  return "?";
}


namespace {
// The event-log operands of a step: its named operands in declaration order, 0 where it has fewer.
struct LogOperands {
  std::int64_t x = 0, y = 0, z = 0;
  LogOperands operator()(const NoOperands&) const { return {}; }
  LogOperands operator()(const SlotStep& o) const { return {o.slot, 0, 0}; }
  LogOperands operator()(const PageStep& o) const { return {o.current_index, 0, 0}; }
  LogOperands operator()(const FillStep& o) const { return {o.current_index, o.entry_begin, o.entry_count}; }
  LogOperands operator()(const GatherStep& o) const { return {o.slot, o.source_page, o.table_index}; }
  LogOperands operator()(const CollectiveStep& o) const { return {o.slot_begin, o.slot_end, o.kind}; }
};
}  // namespace

std::string to_string(const Step& step) {
  const LogOperands o = std::visit(LogOperands{}, step.operands);
  return fmt::format("{} {} {} {} {}", to_string(step.op), step.layer, o.x, o.y, o.z);
}

RankMachine::RankMachine(const World& world, const model::Setting& setting, const harness::RunOptions& options, std::int32_t rank)
    : world_(&world),
      setting_(&setting),
      options_(options),
      mutant_(options.mutant),
      rank_(rank),
      checker_(world, setting, rank, mutant_.halves()),
      capacity_(model::staging_capacity(setting)) {
  CPKV_ASSERT(rank >= 0);
  CPKV_ASSERT(rank < setting.cp);
  CPKV_ASSERT(options.layers >= 0);
  pool_populated_.assign(static_cast<std::size_t>(setting.pool_pages_per_rank()), false);
}

void RankMachine::begin_run() {
  program_.clear();
  pc_ = 0;
  program_.push_back({Op::probe});
  program_.push_back({Op::coll_arrive, -1, CollectiveStep{0, 0, -1}});
  program_.push_back({Op::coll_wait});
  program_.push_back({Op::choose_path});
  set_position(program_[0]);
}

void RankMachine::begin_batch(const model::Batch& batch, std::int64_t batch_index) {
  CPKV_ASSERT(batch_index >= 0);
  CPKV_ASSERT(batch_index > batch_index_);
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
  return mutant_.halves() == 1 ? 0 : model::parity_half(layer);
}
std::int32_t RankMachine::dense_half(std::int32_t layer) const { return staging_half(layer); }

// ---------------------------------------------------------------------------------------------
// Program construction: once per batch, from the batch's plan.

void RankMachine::build_batch_program() {
  CPKV_ASSERT(batch_index_ >= 0);
  CPKV_ASSERT(program_.size() == 1);
  build_layout();
  serve_plan();
  build_page_inverse();
  const bool overflow = judge_overflow();
  program_.push_back({Op::batch_arrive});
  program_.push_back({Op::batch_wait});
  // Section 12's variants have no staging: the verdict (published for the checker) rejects none of them.
  const bool rejected = overflow && plan_.token_split == model::TokenSplit::none;
  if (!rejected) {
    for (std::int32_t layer = 0; layer < options_.layers; ++layer) {
      if (plan_.token_split != model::TokenSplit::none) {
        append_allgather_layer(plan_, layer);
      } else {
        append_layer(plan_, layer);
      }
    }
    if (plan_.barrier && mutant_.arrives_once_more(rank_)) program_.push_back({Op::arrive, options_.layers - 1});
  } else {
    ++totals_.overflows;
  }
  program_.push_back({Op::batch_arrive});
  program_.push_back({Op::batch_wait});
  program_.push_back({Op::batch_end});
}

void RankMachine::build_layout() {
  CPKV_ASSERT(batch_index_ >= 0);
  CPKV_ASSERT(setting_->page_size >= 1);
  layout_ = mutant_.reverses_request_order() ? reversed_layout(*setting_, batch_) : model::layout_batch(*setting_, batch_);
  CPKV_ASSERT(layout_.current_pages_total == static_cast<std::int64_t>(layout_.current.size()));
  oracle_.emplace(setting_->page_size, batch_);
  if (!mutant_.splits_tokens()) return;
  for (model::CurrentPage& page : layout_.current) {
    const std::int64_t extend_len = batch_.requests[page.request].extend_len;
    page.writer = token_writer(page.page_in_request * setting_->page_size, extend_len, setting_->cp);
  }
}

// The plan: built once per batch and anchored on the batch, never on a buffer address.
void RankMachine::serve_plan() {
  CPKV_ASSERT(plan_builds_this_batch_ == 0);
  const std::uint8_t* dense_address = world_->dense_page(rank_, 0, 0, 0);
  CPKV_ASSERT(dense_address != nullptr);
  const bool cache_hit = mutant_.keys_plan_cache_on_address() ? plan_cache_ && plan_cache_->dense_address == dense_address
                                                              : plan_cache_ && plan_cache_->batch_index == batch_index_;
  // The checker compares what is served with a fresh build; a miss caches that same build.
  model::VariantPlan fresh = model::variant_plan(layout_, path_variant_, rank_);
  if (!cache_hit) {
    plan_cache_ = CachedPlan{batch_index_, dense_address, fresh};
    ++plan_builds_this_batch_;
  }
  plan_ = plan_cache_->plan;
  checker_.on_plan_served(plan_, fresh, layout_.slot_count);
}

// The page inverse, built once per batch: token -> destination row, with each current page's first
// entry (the rows of pages this rank writes).
void RankMachine::build_page_inverse() {
  const auto target = plan_.fill_to_staging ? model::InverseTarget::staging : model::InverseTarget::dense;
  inverse_page_begin_.assign(static_cast<std::size_t>(layout_.current_pages_total) + 1, 0);
  inverse_current_row_.clear();
  if (plan_.token_split != model::TokenSplit::none) {
    build_allgather_inverse();
  } else if (mutant_.splits_tokens()) {
    build_token_split_inverse(target);
  } else {
    inverse_ = model::page_inverse(layout_, batch_, rank_, target);
    std::int64_t entry = 0;
    for (std::int64_t i = 0; i < layout_.current_pages_total; ++i) {
      inverse_page_begin_[i] = entry;
      if (layout_.current[i].writer == rank_) entry += layout_.current[i].rows_valid;
    }
    inverse_page_begin_[layout_.current_pages_total] = entry;
  }
  CPKV_ASSERT(inverse_.tokens.size() == inverse_.dest_row.size());
  CPKV_ASSERT(inverse_page_begin_.back() == static_cast<std::int64_t>(inverse_.tokens.size()));
}

// The token_split mutant's inverse: a row belongs to the rank whose token block holds it.
void RankMachine::build_token_split_inverse(model::InverseTarget target) {
  CPKV_ASSERT(mutant_.splits_tokens());
  CPKV_ASSERT(inverse_page_begin_.size() == static_cast<std::size_t>(layout_.current_pages_total) + 1);
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
}

// A token-split variant's inverse (section 12), read off its plan: the rows whose gathered row is
// this rank's go to its send rows at their position among its tokens (gathered row - rank * R).
void RankMachine::build_allgather_inverse() {
  CPKV_ASSERT(plan_.token_split != model::TokenSplit::none);
  CPKV_ASSERT(plan_.allgather_rank_rows > 0);
  const std::int64_t page_size = setting_->page_size;
  const std::int64_t rows = plan_.allgather_rank_rows;
  const auto planned_rows = static_cast<std::int64_t>(plan_.reorder_source.size());
  inverse_ = {};
  for (std::int64_t i = 0; i < layout_.current_pages_total; ++i) {
    inverse_page_begin_[i] = static_cast<std::int64_t>(inverse_.tokens.size());
    // A plan served from another batch (a planted bug) may not cover this page: it then fills
    // nothing here, and the byte check and invariant 5 report it.
    if ((i + 1) * page_size > planned_rows) continue;
    const model::CurrentPage& page = layout_.current[i];
    const model::Request& req = batch_.requests[page.request];
    for (std::int32_t row = 0; row < page.rows_valid; ++row) {
      const std::int64_t source = plan_.reorder_source[i * page_size + row];
      if (source < 0 || source / rows != rank_) continue;
      inverse_.tokens.push_back({page.request, req.prefix_len + page.page_in_request * page_size + row});
      inverse_.dest_row.push_back(source - rank_ * rows);
      inverse_current_row_.push_back(i * page_size + row);
    }
  }
  inverse_page_begin_[layout_.current_pages_total] = static_cast<std::int64_t>(inverse_.tokens.size());
}

// The overflow verdict: batch-logical values only, so every rank reaches the same one. Published for
// the checker, which compares the ranks' verdicts at the batch barrier.
bool RankMachine::judge_overflow() {
  CPKV_ASSERT(capacity_.staging_slots >= 0);
  CPKV_ASSERT(layout_.current_pages_total >= 0);
  model::Verdict verdict = model::overflow_verdict(layout_.current_pages_total, capacity_.staging_slots);
  if (mutant_.judges_overflow_locally()) {
    const auto own = static_cast<std::int64_t>(plan_.own_current.size());
    verdict = model::overflow_verdict(own * setting_->cp, capacity_.staging_slots);
  }
  world_->verdict(rank_).store(verdict.overflow ? 2 : 1);
  return verdict.overflow;
}

void RankMachine::append_barrier(std::int32_t layer) {
  program_.push_back({Op::arrive, layer});
  program_.push_back({Op::wait, layer});
}

void RankMachine::append_collective(std::int32_t layer, std::int64_t slot_begin, std::int64_t slot_end, std::int32_t kind) {
  // No assertion on the range's order: under reversed_request_order the legacy_span_ar plan's ranges
  // come out reversed, and that bug must reach the checkers.
  CPKV_ASSERT(layer >= 0);
  CPKV_ASSERT(kind >= 0);
  const CollectiveStep range{slot_begin, slot_end, kind};
  program_.push_back({Op::coll_arrive, layer, range});
  program_.push_back({Op::coll_wait, layer});
  program_.push_back({Op::reduce, layer, range});
  program_.push_back({Op::coll_arrive, layer, range});
  program_.push_back({Op::coll_wait, layer});
  program_.push_back({Op::store, layer, range});
}

// Fill: every current page this rank writes rows of (under token_split, pages it shares too).
void RankMachine::append_fills(std::int32_t layer) {
  CPKV_ASSERT(layer >= 0);
  CPKV_ASSERT(inverse_page_begin_.size() == static_cast<std::size_t>(layout_.current_pages_total) + 1);
  for (std::int64_t i = 0; i < layout_.current_pages_total; ++i) {
    const std::int64_t begin = inverse_page_begin_[i];
    const std::int64_t end = inverse_page_begin_[i + 1];
    if (begin < end) program_.push_back({Op::fill, layer, FillStep{i, begin, static_cast<std::int32_t>(end - begin)}});
  }
}

void RankMachine::append_gathers(const std::vector<model::SlotDescriptor>& gathers, std::int32_t layer) {
  CPKV_ASSERT(layer >= 0);
  CPKV_ASSERT(layer < options_.layers);
  for (std::size_t s = 0; s < gathers.size(); ++s) {
    const model::SlotDescriptor& d = gathers[s];
    if (d.table_index != model::SlotDescriptor::kSkip) {
      program_.push_back({Op::gather, layer, GatherStep{static_cast<std::int64_t>(s), d.source_page, d.table_index}});
    }
  }
}

void RankMachine::append_layer(const model::VariantPlan& plan, std::int32_t layer) {
  CPKV_ASSERT(layer >= 0);
  CPKV_ASSERT(layer < options_.layers);
  const bool zero = !mutant_.skips_zero();
  program_.push_back({Op::layer_begin, layer});
  if (plan.zero_dense && zero) program_.push_back({Op::zero_dense, layer});
  for (std::int64_t slot : plan.local_prefix_slots) program_.push_back({Op::local_prefix, layer, SlotStep{slot}});
  if (plan.zero_own_current && zero) {
    for (std::int64_t i : plan.own_current) program_.push_back({Op::zero_own, layer, PageStep{i}});
  }
  const bool barrier = plan.barrier && !mutant_.skips_barrier(/*idle=*/plan.own_current.empty());
  const bool early = barrier && mutant_.arrive_before_fill();
  if (early) program_.push_back({Op::arrive, layer});
  append_fills(layer);
  if (early) program_.push_back({Op::wait, layer});
  if (plan.compact_allreduce) {
    for (std::int64_t i = 0; i < plan.compact_pages; ++i) program_.push_back({Op::pack, layer, PageStep{i}});
  }
  append_gathers(plan.gather1, layer);
  if (plan.publish) {
    for (std::int64_t i : plan.own_current) program_.push_back({Op::publish, layer, PageStep{i}});
  }
  if (barrier && !early) append_barrier(layer);
  append_gathers(plan.gather2, layer);
  for (std::size_t k = 0; k < setting_->kinds.size(); ++k) {
    if (!setting_->kind_active(k, layer)) continue;
    for (const model::SlotRange& range : plan.allreduce_ranges) append_collective(layer, range.slot_begin, range.slot_end, static_cast<std::int32_t>(k));
    if (plan.compact_allreduce) append_collective(layer, 0, CollectiveStep::kCompact, static_cast<std::int32_t>(k));
  }
  if (plan.compact_allreduce) {
    for (std::int64_t i = 0; i < plan.compact_pages; ++i) program_.push_back({Op::unpack, layer, PageStep{i}});
  }
  program_.push_back({Op::layer_end, layer});
}

// Section 12: the prefix from the pool, the token rows into this rank's send rows, then per kind one
// all-gather (between two collective barriers: every rank's rows are filled before it, and none is
// overwritten by the next layer's fill before every rank has read it) and the re-ordering.
void RankMachine::append_allgather_layer(const model::VariantPlan& plan, std::int32_t layer) {
  CPKV_ASSERT(layer >= 0);
  CPKV_ASSERT(plan.token_split != model::TokenSplit::none);
  program_.push_back({Op::layer_begin, layer});
  append_gathers(plan.gather1, layer);
  append_fills(layer);
  const std::int64_t rows = setting_->cp * plan.allgather_rank_rows;
  for (std::size_t k = 0; k < setting_->kinds.size(); ++k) {
    if (!setting_->kind_active(k, layer)) continue;
    const CollectiveStep gathered{0, rows, static_cast<std::int32_t>(k)};
    program_.push_back({Op::coll_arrive, layer, gathered});
    program_.push_back({Op::coll_wait, layer});
    program_.push_back({Op::all_gather, layer, gathered});
    program_.push_back({Op::coll_arrive, layer, gathered});
    program_.push_back({Op::coll_wait, layer});
    program_.push_back({Op::reorder, layer, CollectiveStep{0, layout_.current_pages_total, static_cast<std::int32_t>(k)}});
  }
  program_.push_back({Op::layer_end, layer});
}

// ---------------------------------------------------------------------------------------------
// Waiting.

bool RankMachine::all_ranks_reached(Counter& (World::*counter)(std::int32_t) const, std::uint64_t count) const {
  for (std::int32_t p = 0; p < setting_->cp; ++p) {
    if ((world_->*counter)(p).value.load(std::memory_order_acquire) < count) return false;
  }
  return true;
}

bool RankMachine::wait_satisfied(const Step& s) const {
  switch (s.op) {
    case Op::wait:
      if (mutant_.uses_reset_barrier()) {
        return world_->reset_barrier().count.load(std::memory_order_acquire) >= static_cast<std::uint64_t>(setting_->cp);
      }
      // The planted off-by-one (a lag of one phase): a rank passes phase k once every peer reached k - 1.
      return all_ranks_reached(&World::barrier_counter, barriers_arrived_ - mutant_.barrier_phase_lag());
    case Op::coll_wait: return all_ranks_reached(&World::collective_counter, collectives_arrived_);
    case Op::batch_wait: return all_ranks_reached(&World::batch_counter, batches_arrived_);
    default: return true;
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
  CPKV_ASSERT(!finished());
  CPKV_ASSERT(pc_ < program_.size());
  const Step s = program_[pc_];  // its position was published when it became the next step
  checker_.at(batch_index_, totals_.steps);
  run_step(s);
  ++pc_;
  ++totals_.steps;
  if (finished()) {
    world_->position(rank_).state.store(static_cast<std::int32_t>(RankState::finished));
  } else {
    set_position(program_[pc_]);  // where the rank is now: the step it runs (or waits at) next
  }
}

void RankMachine::populate_pool() {
  CPKV_ASSERT(setting_->cp >= 1);
  CPKV_ASSERT(pool_populated_.size() == static_cast<std::size_t>(setting_->pool_pages_per_rank()));
  for (const model::Slot& slot : layout_.slots) {
    if (slot.kind != model::SlotKind::prefix || slot.page_or_index % setting_->cp != rank_) continue;
    const std::int64_t local = slot.page_or_index / setting_->cp;
    if (pool_populated_[local]) continue;
    pool_populated_[local] = true;
    populate_pool_page(slot.page_or_index);
  }
}

// One own pool page, every simulated layer and kind (its content never changes).
void RankMachine::populate_pool_page(std::int64_t logical_page) {
  CPKV_ASSERT(logical_page >= 0);
  CPKV_ASSERT(logical_page % setting_->cp == rank_);
  for (std::int32_t layer = 0; layer < options_.layers; ++layer) {
    for (std::size_t k = 0; k < setting_->kinds.size(); ++k) {
      const std::uint32_t row_bytes = setting_->kinds[k].row_bytes;
      std::uint8_t* page = world_->pool_page(rank_, layer, k, logical_page / setting_->cp);
      for (std::int32_t row = 0; row < setting_->page_size; ++row) {
        const std::uint64_t key = model::prefix_row_key(options_.seed, layer, static_cast<std::uint32_t>(k), logical_page, row);
        for (std::uint32_t b = 0; b < row_bytes; ++b) page[row * row_bytes + b] = model::content_byte(key, b);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Execution: one function per op. The checker is told what happens; it never changes the course.

template <typename Body>
void RankMachine::for_active_kinds(std::int32_t layer, Body&& body) const {
  for (std::size_t k = 0; k < setting_->kinds.size(); ++k) {
    if (layer < 0 || setting_->kind_active(k, layer)) body(k, std::uint64_t{setting_->kinds[k].row_bytes} * setting_->page_size);
  }
}

// A plan index outside the batch is a plan bug (invariant 5): reported, and the step does nothing.
bool RankMachine::in_batch(std::int32_t layer, std::int64_t index, std::int64_t bound, const char* what) const {
  if (index >= 0 && index < bound) return true;
  checker_.on_plan_out_of_bounds(layer, index, bound, what);
  return false;
}

void RankMachine::stamp(StagingStamp& stamp, std::int32_t layer, StampState state) const {
  stamp.layer.store(layer_tag(batch_index_, layer), std::memory_order_release);
  stamp.state.store(static_cast<std::int32_t>(state), std::memory_order_release);
}

void RankMachine::run_step(const Step& s) {
  switch (s.op) {
    case Op::probe: return run_probe();
    case Op::choose_path: return run_choose_path();
    case Op::batch_begin: return run_batch_begin();
    case Op::layer_begin: return run_layer_begin(s.layer);
    case Op::zero_dense: return run_zero_dense(s.layer);
    case Op::local_prefix: return run_local_prefix(s.layer, std::get<SlotStep>(s.operands));
    case Op::zero_own: return run_zero_own(s.layer, std::get<PageStep>(s.operands));
    case Op::fill: return run_fill(s.layer, std::get<FillStep>(s.operands));
    case Op::pack: return run_pack(s.layer, std::get<PageStep>(s.operands));
    case Op::gather: return run_gather(s.layer, std::get<GatherStep>(s.operands));
    case Op::publish: return run_publish(s.layer, std::get<PageStep>(s.operands));
    case Op::arrive: return run_arrive(s.layer);
    case Op::wait: return run_wait(s.layer);
    case Op::coll_arrive: return run_coll_arrive(std::get<CollectiveStep>(s.operands));
    case Op::coll_wait: return checker_.on_collective_pass(s.layer, collectives_arrived_);
    case Op::reduce:
    case Op::store: return run_collective(s.op, s.layer, std::get<CollectiveStep>(s.operands));
    case Op::unpack: return run_unpack(s.layer, std::get<PageStep>(s.operands));
    case Op::all_gather: return run_all_gather(s.layer, std::get<CollectiveStep>(s.operands));
    case Op::reorder: return run_reorder(s.layer, std::get<CollectiveStep>(s.operands));
    case Op::layer_end: return run_layer_end(s.layer);
    case Op::batch_arrive: return run_batch_arrive();
    case Op::batch_wait: return run_batch_wait();
    case Op::batch_end: return end_batch();
  }
}

void RankMachine::run_probe() {
  CPKV_ASSERT(batch_index_ == -1);
  CPKV_ASSERT(options_.ipc_missing_rank < setting_->cp);
  world_->ipc_probe(rank_).store(rank_ == options_.ipc_missing_rank ? 0 : 1);
  world_->position(rank_).state.store(static_cast<std::int32_t>(RankState::running));
  world_->position(rank_).pid.store(static_cast<std::int32_t>(::getpid()));
}

void RankMachine::run_choose_path() {
  CPKV_ASSERT(batch_index_ == -1);
  CPKV_ASSERT(collectives_arrived_ == 1);
  std::int32_t capable = world_->ipc_probe(rank_).load();
  if (!mutant_.ignores_peer_capability()) {
    for (std::int32_t p = 0; p < setting_->cp; ++p) capable = std::min(capable, world_->ipc_probe(p).load());  // the agreed MIN
  }
  path_variant_ = model::path_variant(options_.variant, /*ipc_on_every_rank=*/capable != 0);
  world_->chosen_path(rank_).store(static_cast<std::int32_t>(path_variant_));
}

void RankMachine::run_batch_begin() {
  CPKV_ASSERT(batch_index_ >= 0);
  CPKV_ASSERT(pc_ == 0);
  plan_builds_this_batch_ = 0;
  build_batch_program();
  populate_pool();
  for (std::int32_t half = 0; half < 2; ++half) {
    for (std::size_t k = 0; k < setting_->kinds.size(); ++k) {
      std::memset(world_->dense_page(rank_, half, k, 0), kDensePoison, layout_.slot_count * world_->geometry().page_bytes(k));
    }
  }
  ++totals_.batches;
}

void RankMachine::run_layer_begin(std::int32_t layer) {
  CPKV_ASSERT(layer >= 0);
  CPKV_ASSERT(layer < options_.layers);
  if (mutant_.rebuilds_plan_per_layer()) {
    // The planted bug: the plan is rebuilt on every layer (the same plan, at a per-layer cost).
    plan_ = model::variant_plan(layout_, path_variant_, rank_);
    ++plan_builds_this_batch_;
  }
  checker_.on_layer_begin(layer, plan_builds_this_batch_);
}

void RankMachine::run_zero_dense(std::int32_t layer) {
  CPKV_ASSERT(layer >= 0);
  CPKV_ASSERT(layout_.slot_count >= 0);
  const std::int32_t half = dense_half(layer);
  for_active_kinds(layer, [&](std::size_t k, std::uint64_t page_bytes) {
    std::memset(world_->dense_page(rank_, half, k, 0), 0, layout_.slot_count * page_bytes);
  });
}

void RankMachine::run_local_prefix(std::int32_t layer, const SlotStep& op) {
  CPKV_ASSERT(layer >= 0);
  if (!in_batch(layer, op.slot, layout_.slot_count, "slot")) return;
  // No assertion that the page is this rank's: a planted bug (a stale cached plan) names other
  // slots here, and the byte check, not an abort, is what must catch it.
  CPKV_ASSERT(layer < options_.layers);
  const std::int64_t page = layout_.slots[op.slot].page_or_index;
  for_active_kinds(layer, [&](std::size_t k, std::uint64_t page_bytes) {
    std::memcpy(world_->dense_page(rank_, dense_half(layer), k, op.slot), world_->pool_page(rank_, layer, k, page / setting_->cp), page_bytes);
  });
}

void RankMachine::run_zero_own(std::int32_t layer, const PageStep& op) {
  CPKV_ASSERT(layer >= 0);
  if (!in_batch(layer, op.current_index, layout_.current_pages_total, "current page")) return;
  const std::int32_t hs = staging_half(layer);
  const std::int32_t hd = dense_half(layer);
  if (plan_.fill_to_staging) {
    checker_.on_shared_write(layer, hs, op.current_index);
    for_active_kinds(layer, [&](std::size_t k, std::uint64_t page_bytes) { std::memset(world_->staging_page(rank_, hs, k, op.current_index), 0, page_bytes); });
    stamp(world_->stamp(rank_, hs, op.current_index), layer, StampState::zeroed);
    return;
  }
  const std::int64_t slot = layout_.current[op.current_index].slot;
  CPKV_ASSERT(slot >= 0 && slot < layout_.slot_count);
  if (peers_read_dense()) checker_.on_shared_write(layer, hd, slot);
  for_active_kinds(layer, [&](std::size_t k, std::uint64_t page_bytes) { std::memset(world_->dense_page(rank_, hd, k, slot), 0, page_bytes); });
  stamp(world_->dense_stamp(rank_, hd, slot), layer, StampState::zeroed);
}

// Computes the rows this rank owns of one current page and writes them where the page inverse says.
void RankMachine::run_fill(std::int32_t layer, const FillStep& op) {
  CPKV_ASSERT(layer >= 0);
  if (!in_batch(layer, op.current_index, layout_.current_pages_total, "current page")) return;
  CPKV_ASSERT(op.entry_begin >= 0);
  CPKV_ASSERT(op.entry_begin + op.entry_count <= static_cast<std::int64_t>(inverse_.tokens.size()));
  const std::int32_t hs = staging_half(layer);
  const std::int32_t hd = dense_half(layer);
  const std::int64_t slot = layout_.current[op.current_index].slot;
  const bool token_rows = plan_.token_split != model::TokenSplit::none;  // section 12: into this rank's send rows
  if (plan_.fill_to_staging || peers_read_dense()) {
    checker_.on_shared_write(layer, plan_.fill_to_staging ? hs : hd, op.current_index);
  }
  for_active_kinds(layer, [&](std::size_t k, std::uint64_t) {
    const std::uint32_t row_bytes = setting_->kinds[k].row_bytes;
    std::uint8_t* base = token_rows              ? world_->compact_page(rank_, k, 0)
                         : plan_.fill_to_staging ? world_->staging_page(rank_, hs, k, 0)
                                                 : world_->dense_page(rank_, hd, k, 0);
    for (std::int64_t e = op.entry_begin; e < op.entry_begin + op.entry_count; ++e) {
      const model::LocalToken& token = inverse_.tokens[e];
      const std::uint64_t key = model::current_row_key(options_.seed, layer, static_cast<std::uint32_t>(k), token.request, token.token);
      std::uint8_t* row = base + inverse_.dest_row[e] * row_bytes;
      for (std::uint32_t w = 0; w < row_bytes / 8; ++w) {
        const std::uint64_t word = model::content_word(key, w);
        std::memcpy(row + 8 * w, &word, 8);
      }
      for (std::uint32_t b = row_bytes / 8 * 8; b < row_bytes; ++b) row[b] = model::content_byte(key, b);
    }
  });
  if (token_rows) {
    // Invariant 1 per token row: a page of a token split may have several writers, a row one.
    for (std::int64_t e = op.entry_begin; e < op.entry_begin + op.entry_count; ++e) checker_.on_token_fill(layer, inverse_current_row_[e], slot);
    return;
  }
  stamp(plan_.fill_to_staging ? world_->stamp(rank_, hs, op.current_index) : world_->dense_stamp(rank_, hd, slot), layer, StampState::filled);
  checker_.on_fill(hs, layer, op.current_index, slot);
}

void RankMachine::run_pack(std::int32_t layer, const PageStep& op) {
  CPKV_ASSERT(layer >= 0);
  CPKV_ASSERT(plan_.compact_allreduce);
  if (!in_batch(layer, op.current_index, layout_.current_pages_total, "current page")) return;
  const model::CurrentPage& page = layout_.current[op.current_index];
  for_active_kinds(layer, [&](std::size_t k, std::uint64_t page_bytes) {
    std::uint8_t* compact = world_->compact_page(rank_, k, op.current_index);
    if (page.writer == rank_) {
      std::memcpy(compact, world_->dense_page(rank_, dense_half(layer), k, page.slot), page_bytes);
    } else {
      std::memset(compact, 0, page_bytes);
    }
  });
}

// One slot of the gather: zeros, a pool page of some rank, or a page a rank filled (its staging, or
// its symmetric dense buffer).
void RankMachine::run_gather(std::int32_t layer, const GatherStep& op) {
  CPKV_ASSERT(layer >= 0);
  CPKV_ASSERT(op.table_index != model::SlotDescriptor::kSkip);
  if (!in_batch(layer, op.slot, layout_.slot_count, "slot")) return;
  const std::int32_t hd = dense_half(layer);
  if (op.table_index == model::SlotDescriptor::kZeroFill) {
    for_active_kinds(layer, [&](std::size_t k, std::uint64_t page_bytes) { std::memset(world_->dense_page(rank_, hd, k, op.slot), 0, page_bytes); });
    return;
  }
  if (op.table_index >= setting_->cp) return run_gather_shared(layer, op);
  if (!in_batch(layer, op.source_page, setting_->pool_pages_per_rank(), "pool page")) return;
  const std::int32_t source_rank = op.table_index % setting_->cp;
  for_active_kinds(layer, [&](std::size_t k, std::uint64_t page_bytes) {
    std::memcpy(world_->dense_page(rank_, hd, k, op.slot), world_->pool_page(source_rank, layer, k, op.source_page), page_bytes);
    if (source_rank != rank_) totals_.bytes_gathered_from_peers += page_bytes;
  });
}

void RankMachine::run_gather_shared(std::int32_t layer, const GatherStep& op) {
  CPKV_ASSERT(op.table_index >= setting_->cp);
  CPKV_ASSERT(op.slot >= 0 && op.slot < layout_.slot_count);
  const std::int32_t hs = staging_half(layer);
  const std::int32_t hd = dense_half(layer);
  const std::int32_t source_rank = op.table_index % setting_->cp;
  const bool from_dense = peers_read_dense();
  if (!in_batch(layer, op.source_page, from_dense ? layout_.slot_count : world_->current_capacity(), "source page")) return;
  if (source_rank != rank_) world_->reading_layer(rank_).store(layer, std::memory_order_release);
  checker_.on_staging_read(from_dense ? world_->dense_stamp(source_rank, hd, op.source_page) : world_->stamp(source_rank, hs, op.source_page),
                           source_rank, layer, op.slot);
  for_active_kinds(layer, [&](std::size_t k, std::uint64_t page_bytes) {
    const std::uint8_t* source =
        from_dense ? world_->dense_page(source_rank, hd, k, op.source_page) : world_->staging_page(source_rank, hs, k, op.source_page);
    std::memcpy(world_->dense_page(rank_, hd, k, op.slot), source, page_bytes);
    if (source_rank != rank_) totals_.bytes_gathered_from_peers += page_bytes;
  });
}

void RankMachine::run_publish(std::int32_t layer, const PageStep& op) {
  CPKV_ASSERT(layer >= 0);
  CPKV_ASSERT(plan_.publish);
  if (!in_batch(layer, op.current_index, layout_.current_pages_total, "current page")) return;
  const std::int32_t hs = staging_half(layer);
  checker_.on_shared_write(layer, hs, op.current_index);
  const std::int64_t slot = layout_.current[op.current_index].slot;
  for_active_kinds(layer, [&](std::size_t k, std::uint64_t page_bytes) {
    std::memcpy(world_->staging_page(rank_, hs, k, op.current_index), world_->dense_page(rank_, dense_half(layer), k, slot), page_bytes);
  });
  stamp(world_->stamp(rank_, hs, op.current_index), layer, StampState::published);
}

void RankMachine::run_arrive(std::int32_t layer) {
  CPKV_ASSERT(layer >= 0);
  CPKV_ASSERT(plan_.barrier);
  checker_.on_barrier_arrive(layer);
  ++barriers_arrived_;
  ++totals_.barriers;
  world_->barrier_counter(rank_).value.store(barriers_arrived_, std::memory_order_release);
  if (mutant_.uses_reset_barrier()) world_->reset_barrier().count.fetch_add(1, std::memory_order_acq_rel);
}

void RankMachine::run_wait(std::int32_t layer) {
  CPKV_ASSERT(layer >= 0);
  CPKV_ASSERT(barriers_arrived_ >= 1);
  if (mutant_.uses_reset_barrier()) {
    // The planted bug: the first rank through resets the shared count for reuse, so a peer that
    // has not yet seen the full count waits on a count that will never come back.
    world_->reset_barrier().count.store(0, std::memory_order_release);
  }
  checker_.on_barrier_pass(layer, barriers_arrived_);
}

// Announces one collective call: the running signature of (kind, bytes) every rank must agree on.
void RankMachine::run_coll_arrive(const CollectiveStep& op) {
  CPKV_ASSERT(op.kind >= -1);
  CPKV_ASSERT(collectives_arrived_ < std::numeric_limits<std::uint64_t>::max());
  CollectiveLog& log = world_->collectives(rank_);
  const bool compact = op.slot_end == CollectiveStep::kCompact;
  const std::uint64_t bytes = compact ? static_cast<std::uint64_t>(plan_.compact_pages) : static_cast<std::uint64_t>(op.slot_end - op.slot_begin);
  const std::uint64_t signature =
      model::mix64(log.signature.load() ^ model::mix64((bytes << 8) ^ static_cast<std::uint64_t>(op.kind + 1) ^ (compact ? 1ULL << 62 : 0)));
  log.signature.store(signature, std::memory_order_relaxed);
  log.history[collectives_arrived_ % std::size(log.history)].store(signature, std::memory_order_release);
  ++collectives_arrived_;
  log.calls.store(collectives_arrived_, std::memory_order_relaxed);
  world_->collective_counter(rank_).value.store(collectives_arrived_, std::memory_order_release);
}

// The all-reduce stand-in: reduce sums every rank's range into this rank's scratch, store copies the
// scratch back into this rank's own buffer.
void RankMachine::run_collective(Op op, std::int32_t layer, const CollectiveStep& range) {
  CPKV_ASSERT(op == Op::reduce || op == Op::store);
  CPKV_ASSERT(range.kind >= 0 && static_cast<std::size_t>(range.kind) < setting_->kinds.size());
  const auto k = static_cast<std::size_t>(range.kind);
  const bool compact = range.slot_end == CollectiveStep::kCompact;
  const std::int64_t first = compact ? 0 : range.slot_begin;
  const std::int64_t pages = compact ? plan_.compact_pages : range.slot_end - range.slot_begin;
  if (op == Op::reduce) ++totals_.collectives;  // one all-reduce per reduce step, empty ones included
  if (pages <= 0) return;
  const std::int64_t bound = compact ? world_->geometry().current_pages_max : world_->geometry().slot_count_max;
  if (!in_batch(layer, first + pages - 1, bound, "collective page")) return;
  const std::uint64_t bytes = pages * world_->geometry().page_bytes(k);
  std::uint8_t* scratch = world_->scratch(rank_);
  const std::int32_t hd = dense_half(layer);
  const auto buffer = [&](std::int32_t p) { return compact ? world_->compact_page(p, k, 0) : world_->dense_page(p, hd, k, first); };
  if (op == Op::store) {
    std::memcpy(buffer(rank_), scratch, bytes);
    return;
  }
  std::memcpy(scratch, buffer(0), bytes);
  for (std::int32_t p = 1; p < setting_->cp; ++p) {
    const std::uint8_t* other = buffer(p);
    for (std::uint64_t b = 0; b < bytes; ++b) scratch[b] = static_cast<std::uint8_t>(scratch[b] + other[b]);
  }
  totals_.bytes_reduced += bytes;
}

void RankMachine::run_unpack(std::int32_t layer, const PageStep& op) {
  CPKV_ASSERT(layer >= 0);
  CPKV_ASSERT(plan_.compact_allreduce);
  if (!in_batch(layer, op.current_index, layout_.current_pages_total, "current page")) return;
  const std::int64_t slot = layout_.current[op.current_index].slot;
  for_active_kinds(layer, [&](std::size_t k, std::uint64_t page_bytes) {
    std::memcpy(world_->dense_page(rank_, dense_half(layer), k, slot), world_->compact_page(rank_, k, op.current_index), page_bytes);
  });
}

// The all-gather stand-in (section 12): every rank's allgather_rank_rows send rows of one kind, its
// padding included, into this rank's scratch at rank * allgather_rank_rows.
void RankMachine::run_all_gather(std::int32_t layer, const CollectiveStep& op) {
  CPKV_ASSERT(plan_.token_split != model::TokenSplit::none);
  CPKV_ASSERT(op.kind >= 0 && static_cast<std::size_t>(op.kind) < setting_->kinds.size());
  const auto k = static_cast<std::size_t>(op.kind);
  const std::uint64_t row_bytes = setting_->kinds[k].row_bytes;
  const std::uint64_t rank_bytes = static_cast<std::uint64_t>(plan_.allgather_rank_rows) * row_bytes;
  ++totals_.collectives;
  if (!in_batch(layer, op.slot_end * static_cast<std::int64_t>(row_bytes) - 1, static_cast<std::int64_t>(world_->scratch_span(rank_).bytes), "gathered byte")) return;
  CPKV_ASSERT(plan_.allgather_rank_rows <= world_->geometry().current_pages_max * setting_->page_size);  // fits the send rows
  for (std::int32_t p = 0; p < setting_->cp; ++p) {
    std::memcpy(world_->scratch(rank_) + p * rank_bytes, world_->compact_page(p, k, 0), rank_bytes);
    if (p != rank_) totals_.bytes_gathered_from_peers += rank_bytes;
  }
}

// The re-ordering: every current slot of one kind from the gathered rows the plan names; a row past
// the end of a partial page is zero.
void RankMachine::run_reorder(std::int32_t layer, const CollectiveStep& op) {
  CPKV_ASSERT(plan_.token_split != model::TokenSplit::none);
  CPKV_ASSERT(op.kind >= 0 && static_cast<std::size_t>(op.kind) < setting_->kinds.size());
  const auto k = static_cast<std::size_t>(op.kind);
  const std::uint64_t row_bytes = setting_->kinds[k].row_bytes;
  const std::int64_t page_size = setting_->page_size;
  const std::uint8_t* gathered = world_->scratch(rank_);
  const std::int64_t gathered_rows = setting_->cp * plan_.allgather_rank_rows;
  // A plan served from another batch (a planted bug) may name rows this batch has not: reported
  // (invariant 5), and the step does nothing.
  if (!in_batch(layer, static_cast<std::int64_t>(plan_.reorder_source.size()) - 1, layout_.current_pages_total * page_size, "current row")) return;
  if (static_cast<std::int64_t>(plan_.reorder_source.size()) != layout_.current_pages_total * page_size) {
    return checker_.on_plan_out_of_bounds(layer, layout_.current_pages_total * page_size, static_cast<std::int64_t>(plan_.reorder_source.size()), "current row");
  }
  if (gathered_rows * static_cast<std::int64_t>(row_bytes) > static_cast<std::int64_t>(world_->scratch_span(rank_).bytes)) {
    return checker_.on_plan_out_of_bounds(layer, gathered_rows, static_cast<std::int64_t>(world_->scratch_span(rank_).bytes / row_bytes), "gathered row");
  }
  std::int64_t next_gathered = 0;  // the planted skipped re-ordering: the gathered rows in their order
  for (std::int64_t i = 0; i < layout_.current_pages_total; ++i) {
    std::uint8_t* page = world_->dense_page(rank_, dense_half(layer), k, layout_.current[i].slot);
    for (std::int64_t row = 0; row < page_size; ++row) {
      std::int64_t source = plan_.reorder_source[i * page_size + row];
      if (source >= 0 && mutant_.skips_reorder()) source = next_gathered++;
      if (source < 0) {
        std::memset(page + row * row_bytes, 0, row_bytes);
      } else {
        std::memcpy(page + row * row_bytes, gathered + source * row_bytes, row_bytes);
      }
    }
  }
}

// Closes the layer's staging read epoch and has the checker compare the dense half with the model.
void RankMachine::run_layer_end(std::int32_t layer) {
  CPKV_ASSERT(layer >= 0);
  CPKV_ASSERT(oracle_.has_value());
  world_->reading_layer(rank_).store(-1, std::memory_order_release);
  ++totals_.layers;
  world_->position(rank_).layers_done.fetch_add(1, std::memory_order_relaxed);
  if (!options_.check_bytes) return;
  const LayerCheck check = checker_.on_layer_end(layer, dense_half(layer), layout_, *oracle_, options_.seed, options_.expected_from);
  totals_.add_mismatches(check.mismatching_kinds, check.first_mismatch);
}

void RankMachine::end_batch() {
  // The attention plan the rank's kernels read once the batch's KV is composed: batch-logical like
  // the compose plan, built from the rank's own layout and checked once per batch, after the
  // layers, so a bug of the layout or the split is first what it breaks in the exchange.
  if (plan_.token_split == model::TokenSplit::none) {
    checker_.on_attention_plan(batch_, rank_attention_plan(layout_, batch_, rank_, mutant_));
  } else {
    // Section 12: the rank's queries are the tokens it computed, checked against the token split's oracle.
    const model::QuerySplit split = plan_.token_split == model::TokenSplit::zigzag ? model::QuerySplit::zigzag_tokens : model::QuerySplit::continuous_tokens;
    checker_.on_attention_plan(batch_, rank_attention_plan(layout_, batch_, rank_, mutant_, &plan_), split);
  }
  ++batches_ended_;
  world_->position(rank_).layers_done.store(batches_ended_ * options_.layers, std::memory_order_relaxed);
}

void RankMachine::run_batch_arrive() {
  CPKV_ASSERT(batch_index_ >= 0);
  CPKV_ASSERT(pc_ + 1 < program_.size());  // its wait follows
  ++batches_arrived_;
  world_->batch_counter(rank_).value.store(batches_arrived_, std::memory_order_release);
}

// After the first batch barrier every rank has judged this batch and chosen its path: the checker
// compares them.
void RankMachine::run_batch_wait() {
  CPKV_ASSERT(batch_index_ >= 0);
  CPKV_ASSERT(batches_arrived_ >= 1);
  if (batches_arrived_ % 2 == 1) checker_.on_batch_barrier_pass();
}

}  // namespace cpkv::sim

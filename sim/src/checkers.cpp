#include "cpkv/sim/checkers.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <span>

#include <fmt/format.h>

#include "cpkv/model/assert.hpp"
#include "cpkv/model/expected.hpp"

namespace cpkv::sim {

// Harness names this file uses unqualified (sim's headers do not re-export them).
using harness::Violation;
using harness::ExpectedBytesFrom;

namespace {
// The barrier checker's shadow word: (batch + 1) in the high bits, the arrived ranks' mask below.
constexpr std::uint32_t kShadowMaskBits = 8;
static_assert(model::limits::cp_max <= static_cast<std::int32_t>(kShadowMaskBits));
constexpr std::uint64_t kShadowMask = (std::uint64_t{1} << kShadowMaskBits) - 1;
std::uint64_t shadow_batch_tag(std::int64_t batch) { return static_cast<std::uint64_t>(batch + 1) << kShadowMaskBits; }

// The fillers word: the layer tag in the high half, the filling ranks' mask in the low half.
constexpr std::uint32_t kFillersMaskBits = 32;
constexpr std::uint64_t kFillersMask = (std::uint64_t{1} << kFillersMaskBits) - 1;

// Adds `rank` to the fillers of (batch, layer) `tag` (a new tag starts a new mask) and returns the
// ranks that filled under that tag so far.
std::uint64_t add_filler(PageFillers& fillers, std::int64_t tag_signed, std::int32_t rank) {
  const auto tag = static_cast<std::uint64_t>(tag_signed);
  std::uint64_t old = fillers.value.load(std::memory_order_acquire);
  std::uint64_t next = 0;
  do {
    const bool same_layer = (old >> kFillersMaskBits) == tag && old != ~std::uint64_t{0};
    next = (tag << kFillersMaskBits) | (same_layer ? old & kFillersMask : 0) | (std::uint64_t{1} << rank);
  } while (!fillers.value.compare_exchange_weak(old, next, std::memory_order_acq_rel));
  return next & kFillersMask;
}

std::string path_name(std::int32_t path) { return std::string(model::to_string(static_cast<model::Variant>(path))); }
const char* verdict_name(std::int32_t verdict) { return verdict == 2 ? "overflow" : "ok"; }
}  // namespace

StateChecker::StateChecker(const World& world, const model::Setting& setting, std::int32_t rank, std::int32_t halves)
    : world_(&world), setting_(&setting), rank_(rank), halves_(halves) {
  CPKV_ASSERT(rank >= 0);
  CPKV_ASSERT(rank < setting.cp);
  CPKV_ASSERT(halves == 1 || halves == 2);
  row_buffer_.resize(world.geometry().row_bytes_max());
}

void StateChecker::at(std::int64_t batch, std::uint64_t steps_taken) {
  CPKV_ASSERT(batch >= -1);
  CPKV_ASSERT(steps_taken >= steps_taken_);
  batch_ = batch;
  steps_taken_ = steps_taken;
}

std::int32_t StateChecker::half_of(std::int64_t layer) const {
  return halves_ == 1 ? 0 : model::parity_half(static_cast<std::int32_t>(layer));
}

void StateChecker::violation(std::int32_t invariant, std::int32_t layer, std::int64_t slot, const std::string& detail) const {
  CPKV_ASSERT(invariant >= 1);
  CPKV_ASSERT(invariant <= harness::kInvariants);
  Violation v;
  v.invariant = invariant;
  v.rank = rank_;
  v.batch = batch_;
  v.layer = layer;
  v.slot = slot;
  v.step = static_cast<std::int64_t>(steps_taken_);
  v.set_detail(detail);
  world_->record(v);
}

void StateChecker::on_plan_out_of_bounds(std::int32_t layer, std::int64_t index, std::int64_t bound, const char* what) const {
  CPKV_ASSERT(what != nullptr);
  CPKV_ASSERT(index < 0 || index >= bound);
  violation(5, layer, index, fmt::format("plan names {} {} outside this batch's [0, {})", what, index, bound));
}

// Invariant 5: the plan in use must be the one this batch gives.
void StateChecker::on_plan_served(const model::VariantPlan& served, const model::VariantPlan& fresh, std::int64_t slot_count) const {
  CPKV_ASSERT(slot_count >= 0);
  CPKV_ASSERT(batch_ >= 0);
  if (fresh.gather1 == served.gather1 && fresh.gather2 == served.gather2 && fresh.own_current == served.own_current &&
      fresh.allreduce_ranges == served.allreduce_ranges && fresh.compact_pages == served.compact_pages &&
      fresh.allgather_rank_rows == served.allgather_rank_rows && fresh.reorder_source == served.reorder_source) {
    return;
  }
  violation(5, -1, -1, fmt::format("stale plan served for batch {}: {} gather slots planned, the batch has {}", batch_,
                                   std::max(served.gather1.size(), served.gather2.size()), slot_count));
}

// Invariant 9: the rank's attention plan is section 11's for the tokens it computed (the split of
// section 2). The finding names the segment, request, tokens, field, expected and got.
void StateChecker::on_attention_plan(const model::Batch& batch, std::span<const model::AttentionSegment> segments, model::QuerySplit split) const {
  CPKV_ASSERT(batch_ >= 0);
  const auto finding = model::check_attention_plan(*setting_, batch, rank_, segments, split);
  if (finding) violation(9, -1, -1, finding->detail());
}

// Invariant 5: the compose plan is built once per batch. More builds mean a per-layer rebuild; none
// means a plan served from an earlier batch's cache.
void StateChecker::on_layer_begin(std::int32_t layer, std::int64_t plan_builds_this_batch) {
  CPKV_ASSERT(layer >= 0);
  CPKV_ASSERT(plan_builds_this_batch >= 0);
  barrier_uses_arrived_ = 0;
  barrier_uses_passed_ = 0;
  if (plan_builds_this_batch == 1) return;
  violation(5, layer, -1, fmt::format("batch {}: the compose plan was built {} times by layer {} (once per batch)", batch_,
                                      plan_builds_this_batch, layer));
}

// Invariant 2: a write into a half that peers read must not land while a peer may still read that
// half for an earlier layer.
void StateChecker::on_shared_write(std::int32_t layer, std::int32_t half, std::int64_t slot) const {
  CPKV_ASSERT(layer >= 0);
  CPKV_ASSERT(half >= 0 && half < 2);
  for (std::int32_t p = 0; p < setting_->cp; ++p) {
    if (p == rank_) continue;
    const std::int64_t reading = world_->reading_layer(p).load(std::memory_order_acquire);
    if (reading < 0 || reading == layer || half_of(reading) != half) continue;
    violation(2, layer, slot, fmt::format("rank {} writes half {} for layer {} while rank {} may still read it for layer {}",
                                          rank_, half, layer, p, reading));
  }
}

// Invariant 2: a page read must hold this batch's layer, filled or published. Stamps carry (batch,
// layer): data of the same layer of an earlier batch is stale too.
void StateChecker::on_staging_read(const StagingStamp& stamp, std::int32_t writer, std::int32_t layer, std::int64_t slot) const {
  CPKV_ASSERT(writer >= 0 && writer < setting_->cp);
  CPKV_ASSERT(layer >= 0);
  const std::int64_t stamped = stamp.layer.load(std::memory_order_acquire);
  const auto state = static_cast<StampState>(stamp.state.load(std::memory_order_acquire));
  if (stamped == layer_tag(batch_, layer) && (state == StampState::filled || state == StampState::published)) return;
  static constexpr const char* kStates[] = {"poisoned", "zeroed", "filled", "published"};
  const std::string held = stamped <= 0 ? std::string("nothing")
                                        : fmt::format("batch {} layer {}", (stamped - 1) / kLayerTagStride, (stamped - 1) % kLayerTagStride);
  violation(2, layer, slot, fmt::format("rank {} reads rank {}'s page for batch {} layer {} but it holds {} ({})", rank_, writer,
                                        batch_, layer, held, kStates[static_cast<int>(state)]));
}

// Invariant 1: the fillers of a current page, per half, as (layer tag, rank mask); more than one
// rank in the mask for the same layer is two writers.
void StateChecker::on_fill(std::int32_t half, std::int32_t layer, std::int64_t current_index, std::int64_t slot) const {
  CPKV_ASSERT(layer >= 0);
  CPKV_ASSERT(current_index >= 0);
  const std::uint64_t mask = add_filler(world_->fillers(half, current_index), layer_tag(batch_, layer), rank_);
  if (std::popcount(mask) <= 1) return;
  violation(1, layer, slot, fmt::format("current page {} has {} writers on layer {} (rank mask 0x{:x})", current_index,
                                        std::popcount(mask), layer, mask));
}

// Invariant 1 per token row (section 12): the fillers of one current row, as on_fill's per page.
void StateChecker::on_token_fill(std::int32_t layer, std::int64_t current_row, std::int64_t slot) const {
  CPKV_ASSERT(layer >= 0);
  CPKV_ASSERT(current_row >= 0);
  const std::uint64_t mask = add_filler(world_->row_fillers(current_row), layer_tag(batch_, layer), rank_);
  if (std::popcount(mask) <= 1) return;
  violation(1, layer, slot, fmt::format("current row {} (page {} row {}) has {} writers on layer {} (rank mask 0x{:x})", current_row,
                                        current_row / setting_->page_size, current_row % setting_->page_size, std::popcount(mask), layer, mask));
}

// Invariant 4 (shadow): record this rank's arrival for (batch, layer, barrier use) in a word of its
// own, apart from the counters the barrier itself spins on.
void StateChecker::on_barrier_arrive(std::int32_t layer) {
  CPKV_ASSERT(layer >= 0);
  CPKV_ASSERT(barrier_uses_arrived_ >= 0);
  const std::int32_t use = barrier_uses_arrived_++;
  if (use >= kBarrierUsesPerLayerMax) {
    violation(4, layer, -1, fmt::format("rank {} arrives at barrier use {} of layer {}: the shadow holds {}", rank_, use, layer, kBarrierUsesPerLayerMax));
    return;
  }
  BarrierShadow& shadow = world_->barrier_shadow(layer, use);
  const std::uint64_t tag = shadow_batch_tag(batch_);
  std::uint64_t old = shadow.value.load(std::memory_order_acquire);
  std::uint64_t next = 0;
  do {
    const bool same_batch = (old >> kShadowMaskBits) == (tag >> kShadowMaskBits);
    next = (same_batch ? old : tag) | (std::uint64_t{1} << rank_);
  } while (!shadow.value.compare_exchange_weak(old, next, std::memory_order_acq_rel));
}

// Invariant 4: a rank passing the barrier of (batch, layer, use) finds every rank's arrival for that
// very barrier in the shadow, whatever the counters it waited on said.
void StateChecker::on_barrier_pass(std::int32_t layer, std::uint64_t phase) {
  CPKV_ASSERT(layer >= 0);
  CPKV_ASSERT(barrier_uses_passed_ >= 0);
  const std::int32_t use = barrier_uses_passed_++;
  if (use >= kBarrierUsesPerLayerMax) return;  // reported at the arrival
  const std::uint64_t value = world_->barrier_shadow(layer, use).value.load(std::memory_order_acquire);
  const std::uint64_t mask = (value >> kShadowMaskBits) == (shadow_batch_tag(batch_) >> kShadowMaskBits) ? value & kShadowMask : 0;
  for (std::int32_t p = 0; p < setting_->cp; ++p) {
    if ((mask >> p) & 1u) continue;
    violation(4, layer, -1, fmt::format("rank {} passed the barrier of batch {} layer {} (use {}, phase {}) before rank {} arrived for it", rank_,
                                        batch_, layer, use, phase, p));
    return;
  }
}

// Invariant 7: every rank issued the same collective with the same size.
void StateChecker::on_collective_pass(std::int32_t layer, std::uint64_t call) const {
  CPKV_ASSERT(call >= 1);
  CPKV_ASSERT(layer >= -1);
  constexpr std::uint64_t kHistory = std::size(CollectiveLog{}.history);
  const std::uint64_t mine = world_->collectives(rank_).history[(call - 1) % kHistory].load(std::memory_order_acquire);
  for (std::int32_t p = 0; p < setting_->cp; ++p) {
    const std::uint64_t theirs = world_->collectives(p).history[(call - 1) % kHistory].load(std::memory_order_acquire);
    if (theirs == mine) continue;
    violation(7, layer, -1, fmt::format("collective {}: rank {} and rank {} issued different collectives (paths {} and {})", call, rank_, p,
                                        path_name(world_->chosen_path(rank_).load()), path_name(world_->chosen_path(p).load())));
    return;
  }
}

// Invariants 3 and 7: after the first batch barrier every rank has judged this batch, and every rank
// took the same exchange path after the capability probe.
void StateChecker::on_batch_barrier_pass() const {
  CPKV_ASSERT(batch_ >= 0);
  CPKV_ASSERT(setting_->cp >= 1);
  const std::int32_t mine = world_->verdict(rank_).load();
  for (std::int32_t p = 0; p < setting_->cp; ++p) {
    const std::int32_t theirs = world_->verdict(p).load();
    if (theirs == mine) continue;
    violation(3, -1, -1, fmt::format("batch {}: rank {} judged {}, rank {} judged {}", batch_, rank_, verdict_name(mine), p, verdict_name(theirs)));
    break;
  }
  const std::int32_t path = world_->chosen_path(rank_).load();
  for (std::int32_t p = 0; p < setting_->cp; ++p) {
    const std::int32_t theirs = world_->chosen_path(p).load();
    if (theirs == path) continue;
    violation(7, -1, -1, fmt::format("rank {} took path {}, rank {} took path {}", rank_, path_name(path), p, path_name(theirs)));
    break;
  }
}

// Invariant 6: rows are compared as they are recomputed (no whole expected buffer), keeping the first
// difference per kind. The default expectation comes from the plain oracle, which never reads the
// layout the gather ran on; the layout's own expectation is kept only to show what that catches.
LayerCheck StateChecker::on_layer_end(std::int32_t layer, std::int32_t half, const model::BatchLayout& layout,
                                      const model::spec::ByteOracle& oracle, std::uint64_t seed, ExpectedBytesFrom expected_from) {
  CPKV_ASSERT(layer >= 0);
  CPKV_ASSERT(half >= 0 && half < 2);
  LayerCheck result;
  const bool from_layout = expected_from == ExpectedBytesFrom::batch_layout;
  const std::int64_t slot_count = from_layout ? layout.slot_count : oracle.slot_count();
  for (std::size_t k = 0; k < setting_->kinds.size(); ++k) {
    if (!setting_->kind_active(k, layer)) continue;
    const std::uint32_t row_bytes = setting_->kinds[k].row_bytes;
    CPKV_ASSERT(row_bytes <= row_buffer_.size());
    const std::uint8_t* dense = world_->dense_page(rank_, half, k, 0);
    std::span<std::uint8_t> expected(row_buffer_.data(), row_bytes);
    model::Mismatch mismatch;
    for (std::int64_t slot = 0; slot < slot_count; ++slot) {
      for (std::int32_t row = 0; row < setting_->page_size; ++row) {
        const std::uint8_t* actual = dense + (slot * setting_->page_size + row) * row_bytes;
        if (from_layout) {
          model::expected_row(layout, seed, layer, static_cast<std::uint32_t>(k), slot, row, expected);
        } else {
          oracle.row(seed, layer, static_cast<std::uint32_t>(k), slot, row, expected);
        }
        model::add_row_mismatches(actual, expected, slot, row, mismatch);
      }
    }
    if (mismatch.wrong_bytes == 0) continue;
    const std::string text = mismatch.describe(rank_, batch_, layer, setting_->kinds[k].name);
    ++result.mismatching_kinds;
    if (result.first_mismatch.empty()) result.first_mismatch = text;
    violation(6, layer, -1, text);
  }
  return result;
}

void on_quiescence(const World& world) {
  const std::int32_t cp = world.geometry().cp;
  for (std::int32_t p = 1; p < cp; ++p) {
    const auto a = world.barrier_counter(0).value.load();
    const auto b = world.barrier_counter(p).value.load();
    const auto ca = world.collective_counter(0).value.load();
    const auto cb = world.collective_counter(p).value.load();
    if (a == b && ca == cb) continue;
    Violation v;
    v.invariant = 4;
    v.rank = p;
    v.set_detail(fmt::format("flags not drained at quiescence: rank 0 arrived {} barriers / {} collectives, rank {} {} / {}", a, ca, p, b, cb));
    world.record(v);
    return;
  }
}

}  // namespace cpkv::sim

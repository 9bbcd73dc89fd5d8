// The state checker of one simulated rank. The step machine hands it events as the protocol runs
// (a shared write, a staging read, a fill, a barrier arrival and pass, a collective pass, the batch
// barrier pass where verdicts and paths are compared, a layer's end); the checker reads the shared
// World and its own shadow state and records Violations (PROTOCOL.md section 9). It observes and
// never steers: nothing the machine does depends on what it finds. The group's last event,
// quiescence, is the runners' to hand over (on_quiescence): no single rank sees the group stop.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cpkv/model/attention.hpp"
#include "cpkv/model/batch.hpp"
#include "cpkv/model/limits.hpp"
#include "cpkv/model/oracle.hpp"
#include "cpkv/model/plan.hpp"
#include "cpkv/model/setting.hpp"
#include "cpkv/sim/world.hpp"

namespace cpkv::sim {

// Stamps and fillers name a (batch, layer) in one word: batch * stride + layer + 1 (0: nothing yet).
// The stride only has to exceed the layers a batch simulates (limits::layer_count_max is below it).
inline constexpr std::int64_t kLayerTagStride = 4096;
static_assert(model::limits::layer_count_max < kLayerTagStride);
inline std::int64_t layer_tag(std::int64_t batch, std::int32_t layer) { return batch * kLayerTagStride + layer + 1; }

// Where the end-of-layer byte check takes its expected bytes: the plain oracle written from the
// specification (model/oracle.hpp, the default), or the BatchLayout the gather itself runs on
// (kept to show what the plain oracle adds: a self-consistent layout bug passes it).

// What the byte check of one layer found (invariant 6), for the rank's totals.
struct LayerCheck {
  std::int64_t mismatching_kinds = 0;
  std::string first_mismatch;  // the first kind's description, empty when every kind matched
};

class StateChecker {
 public:
  // halves: staging halves in rotation under this run (2, or 1 under the single_half mutant), to
  // tell which half a peer's open read epoch holds.
  StateChecker(const World& world, const model::Setting& setting, std::int32_t rank, std::int32_t halves);

  // Where the rank is, for the Violations it records: the batch and the steps taken before this one.
  void at(std::int64_t batch, std::uint64_t steps_taken);

  // The plan names an index outside the batch (invariant 5); the machine skips the step.
  void on_plan_out_of_bounds(std::int32_t layer, std::int64_t index, std::int64_t bound, const char* what) const;
  // The plan in use differs from the one this batch gives (invariant 5).
  void on_plan_served(const model::VariantPlan& served, const model::VariantPlan& fresh, std::int64_t slot_count) const;
  // The attention plan the rank hands its attention kernels this batch (invariant 9), checked
  // against the plain oracle of PROTOCOL.md section 11 (model/attention.hpp).
  // split: the rank's queries are the page split's, or (section 12's variants) the token split's.
  void on_attention_plan(const model::Batch& batch, std::span<const model::AttentionSegment> segments,
                         model::QuerySplit split = model::QuerySplit::pages) const;
  // A layer starts: the plan must have been built exactly once this batch (invariant 5).
  void on_layer_begin(std::int32_t layer, std::int64_t plan_builds_this_batch);
  // A write into a half that peers read (invariant 2).
  void on_shared_write(std::int32_t layer, std::int32_t half, std::int64_t slot) const;
  // A read of a peer's staging (or symmetric dense) page, carrying the page's stamp (invariant 2).
  void on_staging_read(const StagingStamp& stamp, std::int32_t writer, std::int32_t layer, std::int64_t slot) const;
  // This rank filled rows of a current page (invariant 1: one writer per page and layer).
  void on_fill(std::int32_t half, std::int32_t layer, std::int64_t current_index, std::int64_t slot) const;
  // Section 12's token split: this rank computed current row `current_row` (current index * P +
  // row) of the batch (invariant 1 per token row: a page may have several writers, a row one).
  void on_token_fill(std::int32_t layer, std::int64_t current_row, std::int64_t slot) const;
  // The counting barrier: arrival, then pass (invariant 4). phase: the rank's barrier arrivals so far.
  void on_barrier_arrive(std::int32_t layer);
  void on_barrier_pass(std::int32_t layer, std::uint64_t phase);
  // A collective passed: every rank issued the same call (invariant 7). call: the rank's calls so far.
  void on_collective_pass(std::int32_t layer, std::uint64_t call) const;
  // The first batch barrier passed: every rank judged the batch alike (invariant 3) and took the
  // same exchange path (invariant 7).
  void on_batch_barrier_pass() const;
  // A layer ended: the dense half must hold what the requests give (invariant 6).
  LayerCheck on_layer_end(std::int32_t layer, std::int32_t half, const model::BatchLayout& layout,
                          const model::spec::ByteOracle& oracle, std::uint64_t seed, harness::ExpectedBytesFrom expected_from);

 private:
  void violation(std::int32_t invariant, std::int32_t layer, std::int64_t slot, const std::string& detail) const;
  std::int32_t half_of(std::int64_t layer) const;

  const World* world_;  // pointers, not references: checkers are copied with their machines (explorer snapshots)
  const model::Setting* setting_;
  std::int32_t rank_;
  std::int32_t halves_;
  std::int64_t batch_ = -1;
  std::uint64_t steps_taken_ = 0;
  std::int32_t barrier_uses_arrived_ = 0;  // barriers arrived at / passed in the current layer
  std::int32_t barrier_uses_passed_ = 0;
  std::vector<std::uint8_t> row_buffer_;  // one expected row, recomputed per row
};

// Quiescence: every rank has stopped after a run that ended normally. Every rank must have arrived
// at every barrier and collective the same number of times, so the flags are drained (invariant 4);
// the first rank that differs from rank 0 is recorded.
void on_quiescence(const World& world);

}  // namespace cpkv::sim

// One simulated rank as a step machine. A batch becomes a flat program of steps (zero, fill, gather,
// barrier arrive and wait, collective phases, ...) built from the model's VariantPlan; each step is
// one atomic action on the shared World. The same machine runs under the scheduled runner (one
// process, a schedule picks who steps next) and free-running (one process or thread per rank).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cpkv/model/batch.hpp"
#include "cpkv/model/oracle.hpp"
#include "cpkv/model/plan.hpp"
#include "cpkv/model/setting.hpp"
#include "cpkv/model/staging.hpp"
#include "cpkv/sim/mutant.hpp"
#include "cpkv/sim/world.hpp"

namespace cpkv::sim {

enum class Op : std::uint8_t {
  probe,          // write this rank's IPC capability probe
  choose_path,    // read every probe, choose the exchange path (agreed MIN)
  batch_begin,    // populate own pool pages, poison the dense buffers, judge overflow
  layer_begin,
  zero_dense,     // zero the whole dense half (all-reduce variants)
  local_prefix,   // a = slot: copy the own pool page into the dense slot
  zero_own,       // a = current index: zero the page the fill writes
  fill,           // a = current index, b = first row, c = end row: compute rows, write them via the page inverse
  pack,           // a = current index: compact[a] = own ? dense page : zeros
  gather,         // a = slot, b = source page, c = table index
  publish,        // a = current index: staging[a] = dense page
  arrive,         // protocol counting barrier: announce arrival
  wait,           // protocol counting barrier: pass once every rank arrived (blocks)
  coll_arrive,    // collective (NCCL stand-in) barrier
  coll_wait,      // (blocks)
  reduce,         // a = slot begin, b = slot end (or -1: compact), c = kind: scratch = sum over ranks
  store,          // a, b, c as reduce: own buffer = scratch
  unpack,         // a = current index: dense slot = compact[a]
  layer_end,      // check the dense half against the model; close the staging read epoch
  batch_arrive,   // harness barrier between batches (pool populated; not part of the protocol)
  batch_wait,     // (blocks)
  batch_end,
};
std::string_view to_string(Op op);

struct Step {
  Op op = Op::batch_end;
  std::int32_t layer = -1;
  std::int64_t a = 0;
  std::int64_t b = 0;
  std::int32_t c = 0;
};

// The run options are the harness's (harness/run.hpp), shared with the GPU backend.
using harness::ExpectedBytesFrom;
using SimOptions = harness::RunOptions;

// What one rank did, summed over the run.
struct RankTotals {
  std::int64_t batches = 0;
  std::int64_t layers = 0;
  std::int64_t barriers = 0;
  std::int64_t collectives = 0;
  std::int64_t overflows = 0;
  std::int64_t mismatches = 0;
  std::uint64_t bytes_gathered_from_peers = 0;
  std::uint64_t bytes_reduced = 0;
  std::string first_mismatch;
};

class RankMachine {
 public:
  RankMachine(const World& world, const model::Setting& setting, const SimOptions& options, std::int32_t rank);

  // Start of the run: the capability probe and the path choice.
  void begin_run();
  // Start a batch: its program is built lazily at its batch_begin step.
  void begin_batch(const model::Batch& batch, std::int64_t batch_index);

  // Could the next step run now? False when it waits on a flag, or when the program is done.
  bool runnable() const;
  bool finished() const { return pc_ >= program_.size(); }
  // Runs the next step. Precondition: runnable().
  void step();

  std::int32_t rank() const { return rank_; }
  std::int64_t batch_index() const { return batch_index_; }
  const Step* next_step() const { return finished() ? nullptr : &program_[pc_]; }
  std::string describe_position() const;
  const RankTotals& totals() const { return totals_; }
  std::uint64_t steps_taken() const { return steps_taken_; }

 private:
  void build_batch_program();
  void append_layer(const model::VariantPlan& plan, std::int32_t layer);
  void append_barrier(std::int32_t layer);
  void append_collective(std::int32_t layer, std::int64_t a, std::int64_t b, std::int32_t kind);
  void run_step(const Step& s);
  bool wait_satisfied(const Step& s) const;

  std::int32_t staging_half(std::int32_t layer) const;
  std::int32_t dense_half(std::int32_t layer) const;
  std::uint8_t* fill_destination(std::int32_t layer, std::size_t kind, std::int64_t current_index) const;
  void check_write_to_shared_half(std::int32_t layer, std::int32_t half, std::int64_t slot, std::int64_t step) const;
  void check_read_stamp(const StagingStamp& stamp, std::int32_t writer, std::int32_t layer, std::int64_t slot) const;
  void note_fill(std::int32_t layer, std::int64_t current_index) const;
  void check_layer(std::int32_t layer);
  void check_plan_built_once(std::int32_t layer);
  void note_barrier_arrival(std::int32_t layer);
  void check_barrier_pass(std::int32_t layer);
  void populate_pool();
  void violation(std::int32_t invariant, std::int32_t layer, std::int64_t slot, const std::string& detail) const;
  void set_position(const Step& s);

  const World* world_;  // pointers, not references: machines are copied and assigned (explorer snapshots)
  const model::Setting* setting_;
  SimOptions options_;
  std::int32_t rank_;
  model::StagingCapacity capacity_;

  // The current batch and what is built once per batch from it.
  model::Batch batch_;
  std::int64_t batch_index_ = -1;
  model::BatchLayout layout_;
  std::optional<model::spec::ByteOracle> oracle_;  // what every dense row must hold, from the requests alone
  model::VariantPlan plan_;
  model::PageInverse inverse_;
  std::vector<std::int64_t> inverse_page_begin_;  // per current index: first inverse entry (own pages)
  model::Variant path_variant_ = model::Variant::staging_direct;  // after the capability choice

  // The plan cache. Correct: anchored on the batch (its index). Mutant: keyed on a buffer address.
  struct CachedPlan {
    std::int64_t batch_index = -1;
    const std::uint8_t* dense_address = nullptr;
    model::VariantPlan plan;
  };
  std::optional<CachedPlan> plan_cache_;
  std::int64_t plan_builds_this_batch_ = 0;

  std::vector<Step> program_;
  std::size_t pc_ = 0;
  std::uint64_t steps_taken_ = 0;
  std::uint64_t barriers_arrived_ = 0;
  std::int32_t barrier_uses_arrived_ = 0;  // barriers arrived at / passed in the current layer (checker shadow)
  std::int32_t barrier_uses_passed_ = 0;
  std::uint64_t collectives_arrived_ = 0;
  std::uint64_t batches_arrived_ = 0;
  std::vector<bool> pool_populated_;  // own local pages already written (content never changes)
  RankTotals totals_;
  std::vector<std::uint8_t> row_buffer_;
};

}  // namespace cpkv::sim

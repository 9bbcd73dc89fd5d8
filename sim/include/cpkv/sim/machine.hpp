// One simulated rank as a step machine. A batch becomes a flat program of steps (zero, fill, gather,
// barrier arrive and wait, collective phases, ...) built from the model's VariantPlan; each step is
// one atomic action on the shared World. The same machine runs under the scheduled runner (one
// process, a schedule picks who steps next) and free-running (one process or thread per rank).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <string>
#include <variant>
#include <vector>

#include "cpkv/model/batch.hpp"
#include "cpkv/model/oracle.hpp"
#include "cpkv/model/plan.hpp"
#include "cpkv/model/setting.hpp"
#include "cpkv/model/staging.hpp"
#include "cpkv/sim/checkers.hpp"
#include "cpkv/sim/mutant.hpp"
#include "cpkv/sim/world.hpp"

namespace cpkv::sim {

enum class Op : std::uint8_t {
  probe,          // write this rank's IPC capability probe
  choose_path,    // read every probe, choose the exchange path (agreed MIN)
  batch_begin,    // populate own pool pages, poison the dense buffers, judge overflow
  layer_begin,
  zero_dense,     // zero the batch's slots of the dense half, every kind active on the layer (all-reduce variants)
  local_prefix,   // SlotStep: copy the own pool page into the dense slot
  zero_own,       // PageStep: zero the page the fill writes
  fill,           // FillStep: compute the page's rows this rank owns, write them via the page inverse
  pack,           // PageStep: compact[i] = own ? dense page : zeros
  gather,         // GatherStep: copy one source page into a dense slot
  publish,        // PageStep: staging[i] = dense page
  arrive,         // protocol counting barrier: announce arrival
  wait,           // protocol counting barrier: pass once every rank arrived (blocks)
  coll_arrive,    // CollectiveStep: collective (NCCL stand-in) barrier
  coll_wait,      // (blocks)
  reduce,         // CollectiveStep: scratch = sum over ranks of the range
  store,          // CollectiveStep: own buffer's range = scratch
  unpack,         // PageStep: dense slot = compact[i]
  all_gather,     // CollectiveStep: scratch = every rank's send rows (its compact buffer), padded (section 12)
  reorder,        // CollectiveStep: every current slot of the kind from the gathered rows, zero past a page's end
  layer_end,      // check the dense half against the model; close the staging read epoch
  batch_arrive,   // harness barrier between batches (pool populated; not part of the protocol)
  batch_wait,     // (blocks)
  batch_end,
};
std::string_view to_string(Op op);

// The operands of each op, by name. Ops not listed above take none.
struct NoOperands {};
struct SlotStep {  // local_prefix
  std::int64_t slot = 0;
};
struct PageStep {  // zero_own, pack, publish, unpack
  std::int64_t current_index = 0;
};
struct FillStep {
  std::int64_t current_index = 0;
  std::int64_t entry_begin = 0;  // the page's first entry in the page inverse
  std::int32_t entry_count = 0;  // its entries (rows this rank writes)
};
struct GatherStep {
  std::int64_t slot = 0;         // dense slot written
  std::int64_t source_page = 0;  // pool local page (table index < cp) or the source's current index / dense slot
  std::int32_t table_index = 0;  // the slot descriptor's table index (source rank = table_index % cp)
};
struct CollectiveStep {
  // Dense slots [slot_begin, slot_end), or the compact buffer when slot_end == kCompact; for
  // all_gather the gathered rows [0, cp * allgather_rank_rows), for reorder the current pages.
  static constexpr std::int64_t kCompact = -1;
  std::int64_t slot_begin = 0;
  std::int64_t slot_end = 0;
  std::int32_t kind = 0;  // buffer kind; -1 for the run's capability collective
};

struct Step {
  Op op = Op::batch_end;
  std::int32_t layer = -1;
  std::variant<NoOperands, SlotStep, PageStep, FillStep, GatherStep, CollectiveStep> operands = NoOperands{};
};
// "op layer x y z": the op, its layer and its operands in declaration order (0 where it has fewer);
// the scheduled runner's event log is written in this form.
std::string to_string(const Step& step);

// The run options are the harness's (harness/run.hpp), shared with the GPU backend.

class RankMachine {
 public:
  RankMachine(const World& world, const model::Setting& setting, const harness::RunOptions& options, std::int32_t rank);

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
  // The staging and dense half a layer uses (its parity, PROTOCOL.md section 6; 0 under single_half).
  std::int32_t half(std::int32_t layer) const { return layer < 0 ? 0 : staging_half(layer); }
  const Step* next_step() const { return finished() ? nullptr : &program_[pc_]; }
  std::string describe_position() const;
  // What this rank did, summed over the run (steps included): the harness's one Totals.
  const harness::Totals& totals() const { return totals_; }
  std::uint64_t steps_taken() const { return totals_.steps; }
  // For the explorer's dependency relation (properties/src/footprint.cpp): the program, where the
  // rank is in it, its arrivals so far, and the plan and path the program was built from.
  const std::vector<Step>& program() const { return program_; }
  std::size_t pc() const { return pc_; }
  std::uint64_t barriers_arrived() const { return barriers_arrived_; }
  std::uint64_t collectives_arrived() const { return collectives_arrived_; }
  std::uint64_t batches_arrived() const { return batches_arrived_; }
  const model::VariantPlan& plan() const { return plan_; }
  model::Variant path_variant() const { return path_variant_; }

 private:
  // Program construction, once per batch.
  void build_batch_program();
  void build_layout();
  void serve_plan();
  void build_page_inverse();
  void build_token_split_inverse(model::InverseTarget target);
  void build_allgather_inverse();
  bool judge_overflow();
  void append_layer(const model::VariantPlan& plan, std::int32_t layer);
  void append_allgather_layer(const model::VariantPlan& plan, std::int32_t layer);
  void append_fills(std::int32_t layer);
  void append_gathers(const std::vector<model::SlotDescriptor>& gathers, std::int32_t layer);
  void append_barrier(std::int32_t layer);
  void append_collective(std::int32_t layer, std::int64_t slot_begin, std::int64_t slot_end, std::int32_t kind);

  // Execution: run_step dispatches to one function per op.
  bool wait_satisfied(const Step& s) const;
  bool all_ranks_reached(Counter& (World::*counter)(std::int32_t) const, std::uint64_t count) const;
  void run_step(const Step& s);
  void run_probe();
  void run_choose_path();
  void run_batch_begin();
  void run_layer_begin(std::int32_t layer);
  void run_zero_dense(std::int32_t layer);
  void run_local_prefix(std::int32_t layer, const SlotStep& op);
  void run_zero_own(std::int32_t layer, const PageStep& op);
  void run_fill(std::int32_t layer, const FillStep& op);
  void run_pack(std::int32_t layer, const PageStep& op);
  void run_gather(std::int32_t layer, const GatherStep& op);
  void run_gather_shared(std::int32_t layer, const GatherStep& op);
  void run_publish(std::int32_t layer, const PageStep& op);
  void run_arrive(std::int32_t layer);
  void run_wait(std::int32_t layer);
  void run_coll_arrive(const CollectiveStep& op);
  void run_collective(Op op, std::int32_t layer, const CollectiveStep& op_range);
  void run_unpack(std::int32_t layer, const PageStep& op);
  void run_all_gather(std::int32_t layer, const CollectiveStep& op);
  void run_reorder(std::int32_t layer, const CollectiveStep& op);
  void run_layer_end(std::int32_t layer);
  void run_batch_arrive();
  void end_batch();
  void run_batch_wait();

  template <typename Body>
  void for_active_kinds(std::int32_t layer, Body&& body) const;
  bool in_batch(std::int32_t layer, std::int64_t index, std::int64_t bound, const char* what) const;
  void stamp(StagingStamp& stamp, std::int32_t layer, StampState state) const;
  std::int32_t staging_half(std::int32_t layer) const;
  std::int32_t dense_half(std::int32_t layer) const;
  void populate_pool();
  void populate_pool_page(std::int64_t logical_page);
  void set_position(const Step& s);

  const World* world_;  // pointers, not references: machines are copied and assigned (explorer snapshots)
  const model::Setting* setting_;
  harness::RunOptions options_;
  MutantPolicy mutant_;
  std::int32_t rank_;
  StateChecker checker_;
  model::StagingCapacity capacity_;

  // The current batch and what is built once per batch from it.
  model::Batch batch_;
  std::int64_t batch_index_ = -1;
  model::BatchLayout layout_;
  std::optional<model::spec::ByteOracle> oracle_;  // what every dense row must hold, from the requests alone
  model::VariantPlan plan_;
  model::PageInverse inverse_;
  std::vector<std::int64_t> inverse_page_begin_;  // per current index: first inverse entry (own pages)
  std::vector<std::int64_t> inverse_current_row_;  // token-split variants: per inverse entry, its current row (index * P + row)
  model::Variant path_variant_ = model::Variant::staging_direct;  // after the capability choice
  // Peers read this rank's current pages from its dense buffer (symmetric memory), not from staging.
  bool peers_read_dense() const { return model::info(path_variant_).peer_pages == model::PeerPages::dense; }

  // The plan cache. Correct: anchored on the batch (its index). A planted bug: keyed on a buffer address.
  struct CachedPlan {
    std::int64_t batch_index = -1;
    const std::uint8_t* dense_address = nullptr;
    model::VariantPlan plan;
  };
  std::optional<CachedPlan> plan_cache_;
  std::int64_t plan_builds_this_batch_ = 0;

  std::vector<Step> program_;
  std::size_t pc_ = 0;
  std::uint64_t barriers_arrived_ = 0;
  std::uint64_t collectives_arrived_ = 0;
  std::uint64_t batches_arrived_ = 0;
  std::int64_t batches_ended_ = 0;
  std::vector<bool> pool_populated_;  // own local pages already written (content never changes)
  harness::Totals totals_;  // steps: the steps taken so far
};

}  // namespace cpkv::sim

// The shared world of one simulated CP group: what the GPUs would share through CUDA IPC (pool slabs,
// staging regions with two parity halves, symmetric dense buffers, barrier flags, collective scratch)
// plus the checkers' shadow state, carved at fixed offsets in one harness::SharedRegion. Every process maps the
// region at its own address, so everything here is an offset, never a pointer.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cpkv/harness/run.hpp"
#include "cpkv/model/setting.hpp"
#include "cpkv/model/staging.hpp"
#include "cpkv/harness/shared_region.hpp"

namespace cpkv::sim {

static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "shared atomics must be lock-free");
static_assert(std::atomic<std::int64_t>::is_always_lock_free, "shared atomics must be lock-free");
static_assert(std::atomic<std::int32_t>::is_always_lock_free, "shared atomics must be lock-free");

// Sizes the world must hold for a whole trace (the largest batch), fixed before the ranks start.
struct WorldGeometry {
  std::int32_t cp = 1;
  std::int32_t page_size = 1;
  std::int32_t layers = 1;                 // layers simulated
  std::vector<std::uint32_t> row_bytes;    // per buffer kind
  std::int64_t staging_slots = 0;          // registered capacity (per half, per kind)
  std::int64_t pool_pages_per_rank = 0;    // local pages of each rank's slab
  std::int64_t slot_count_max = 0;         // dense slots of the largest batch
  std::int64_t current_pages_max = 0;      // current pages of the largest batch
  // Logical pool pages some batch references (sorted): only their pages of the pool slabs are ever
  // written, so only they are reserved. Unknown (nullopt): the whole pool is reserved.
  std::optional<std::vector<std::int64_t>> pool_pages_touched;

  std::uint64_t page_bytes(std::size_t kind) const { return std::uint64_t{row_bytes[kind]} * page_size; }
  std::uint64_t page_bytes_all_kinds() const;
  std::uint32_t row_bytes_max() const;
};

WorldGeometry geometry_for(const model::Setting& setting, std::int32_t layers, std::int64_t slot_count_max,
                           std::int64_t current_pages_max);

// Where a rank is, for deadlock reports: written by the rank, read by whoever reports.
struct alignas(64) RankPosition {
  std::atomic<std::int64_t> batch{-1};
  std::atomic<std::int64_t> step{0};
  std::atomic<std::int32_t> layer{-1};
  std::atomic<std::int32_t> op{0};
  std::atomic<std::int64_t> phase{0};       // protocol barrier arrivals so far
  std::atomic<std::int32_t> state{0};       // RankState
  std::atomic<std::int32_t> pid{0};
  // Layers this rank has ended, over batches: each layer's end adds one, each batch's end sets it
  // to (batches ended) x (layers per batch), so a rejected batch counts as its layers passed. For
  // the progress bar (sim/runner.cpp layers_done).
  std::atomic<std::int64_t> layers_done{0};
};

enum class RankState : std::int32_t { idle = 0, running = 1, finished = 2, failed = 3, raised_overflow = 4 };

// One counter per rank, monotonic: rank r's arrivals. Barrier k is passed when every counter >= k
// (RankMachine::wait_satisfied). Reusable without reset and phase-safe by construction: a counter
// only grows, so a fast rank's next arrival cannot undo a slow rank's view of this one (PROTOCOL.md
// section 5, step 3).
struct alignas(64) Counter {
  std::atomic<std::uint64_t> value{0};
};

// The barrier_reset_race mutant's scheme: one shared count that the last arriver resets.
struct alignas(64) ResetBarrier {
  std::atomic<std::uint64_t> count{0};
  std::atomic<std::uint64_t> generation{0};
};

// Checker shadow state for one staging slot (owner rank, half, current index).
struct StagingStamp {
  std::atomic<std::int64_t> layer{-1};   // layer of the last write
  std::atomic<std::int32_t> state{0};    // StampState
};
enum class StampState : std::int32_t { poisoned = 0, zeroed = 1, filled = 2, published = 3 };


// A record of one collective call, to prove every rank issued the same sequence (invariant 7).
// history[k % 4] is the running signature after call k: a rank can be at most one call ahead of a
// peer that is passing call k, so four entries never alias.
struct alignas(64) CollectiveLog {
  std::atomic<std::uint64_t> calls{0};
  std::atomic<std::uint64_t> signature{0};  // running hash of (kind, bytes) of every call
  std::atomic<std::uint64_t> history[4] = {};
};

// The barrier checker's shadow of one barrier use (invariant 4): which ranks arrived for it, kept
// apart from the counters the ranks spin on, so the check is not the wait condition restated.
// value = ((batch + 1) << 8) | bitmask of the ranks that arrived for (batch, layer, use); one
// entry per (layer, use): batches are separated by the harness barrier, so an entry is only
// overwritten by a later batch once every rank has left this one.
struct alignas(8) BarrierShadow {
  std::atomic<std::uint64_t> value{0};
};
// Barriers one rank passes per layer (each of model::barrier_variants() passes one); room for two.
inline constexpr std::int32_t kBarrierUsesPerLayerMax = 2;

// The current pages' fillers per parity half: (layer << 32) | bitmask of ranks that filled rows.
struct alignas(8) PageFillers {
  std::atomic<std::uint64_t> value{~std::uint64_t{0}};
};

// What a rank reports back to whoever launched it (harness/run.hpp, shared with the GPU backend).

class World {
 public:
  World(const WorldGeometry& geometry, std::uint64_t seed);

  // Bytes of shared memory a world of this geometry reserves (pools: only the pages touched).
  static std::uint64_t reserved_bytes(const WorldGeometry& geometry);
  // Throws harness::SharedMemoryFull (needed and free, one line) if /dev/shm cannot hold that now.
  static void check_space(const WorldGeometry& geometry);

  const WorldGeometry& geometry() const { return geometry_; }
  const harness::SharedRegion& region() const { return region_; }
  std::uint64_t seed() const { return seed_; }

  // Memory a GPU would share through IPC, by rank.
  std::uint8_t* pool_page(std::int32_t rank, std::int32_t layer, std::size_t kind, std::int64_t local_page) const;
  std::uint8_t* staging_page(std::int32_t rank, std::int32_t half, std::size_t kind, std::int64_t slot) const;
  std::uint8_t* dense_page(std::int32_t rank, std::int32_t half, std::size_t kind, std::int64_t slot) const;
  std::uint8_t* compact_page(std::int32_t rank, std::size_t kind, std::int64_t index) const;
  // Collective receive buffer: row_bytes_max x max(P * slots, current pages * (P + 2 cp)) (an
  // all-reduce's range, or one kind's all-gathered token rows).
  std::uint8_t* scratch(std::int32_t rank) const;

  Counter& barrier_counter(std::int32_t rank) const;
  Counter& collective_counter(std::int32_t rank) const;
  Counter& batch_counter(std::int32_t rank) const;
  ResetBarrier& reset_barrier() const;
  RankPosition& position(std::int32_t rank) const;
  std::atomic<std::int32_t>& ipc_probe(std::int32_t rank) const;
  std::atomic<std::int32_t>& chosen_path(std::int32_t rank) const;
  std::atomic<std::int32_t>& verdict(std::int32_t rank) const;   // per batch: 1 ok, 2 overflow
  std::atomic<std::int64_t>& reading_layer(std::int32_t rank) const;  // open staging read epoch or -1
  CollectiveLog& collectives(std::int32_t rank) const;
  harness::Totals& totals(std::int32_t rank) const;
  BarrierShadow& barrier_shadow(std::int32_t layer, std::int32_t use) const;
  PageFillers& fillers(std::int32_t half, std::int64_t current_index) const;
  // Section 12's token-split variants: the fillers of one current row (current index * P + row),
  // where writer exclusivity (invariant 1) is per token row.
  PageFillers& row_fillers(std::int64_t current_row) const;
  StagingStamp& stamp(std::int32_t rank, std::int32_t half, std::int64_t slot) const;
  StagingStamp& dense_stamp(std::int32_t rank, std::int32_t half, std::int64_t slot) const;

  // Current indices the shadow arrays hold per half: max(staging_slots, current_pages_max).
  std::int64_t current_capacity() const { return static_cast<std::int64_t>(off_.stamps_per_half); }

  // Violations, recorded by the checkers (checkers.hpp) from any rank; at most kViolationsMax are kept.
  static constexpr std::int32_t kViolationsMax = 64;
  void record(const harness::Violation& violation) const;
  std::vector<harness::Violation> violations() const;
  // The prefix of the kept ones already written whole, for a reader while ranks still run (the
  // count is bumped before a slot is filled).
  std::vector<harness::Violation> whole_violations() const;
  std::int64_t violation_count() const;
  std::int64_t violation_count(std::int32_t invariant) const;  // 1..9, every one, kept or not

  // Resets the per-run shadow and flag state to the start of a run (not the data buffers).
  void reset_flags() const;

  // The region by object, as offsets into region(), for the explorer's state hash and undo log
  // (properties/src/explorer.cpp): what a step can read later, apart from positions (written for
  // reports only), totals (published by the runners) and the violation records (a finding ends
  // an exploration).
  struct ByteSpan {
    std::uint64_t offset = 0;
    std::uint64_t bytes = 0;
  };
  std::vector<ByteSpan> flag_spans() const;  // counters, probes, verdicts, epochs, logs, stamps, shadows, fillers
  ByteSpan pool_span(std::int32_t rank) const;
  ByteSpan staging_span(std::int32_t rank) const;  // both halves
  ByteSpan dense_span(std::int32_t rank, std::int32_t half) const;
  ByteSpan compact_span(std::int32_t rank) const;
  ByteSpan scratch_span(std::int32_t rank) const;
  ByteSpan record_span() const;  // the violation counts (an exploration that goes on past a finding restores them)

 private:
  struct Header;
  struct Offsets {
    std::uint64_t header, positions, barrier, collective, batch, reset, probes, paths, verdicts, reading, colllog,
        stamps, dense_stamps, arrivals, fillers, row_fillers, totals, violations, pool, staging, dense, compact, scratch, total;
    std::uint64_t pool_rank, staging_rank, dense_rank, dense_half, compact_rank, scratch_rank, stamps_per_half;
    std::vector<std::uint64_t> pool_kind, dense_kind, compact_kind;
  };
  static model::ArenaCarve carve_for(const WorldGeometry& geometry);
  static Offsets carve_world(const WorldGeometry& geometry, const model::ArenaCarve& carve);
  static std::vector<harness::SharedRegion::ByteRange> reserved_ranges(const WorldGeometry& geometry, const Offsets& off);
  Header* header() const;

  WorldGeometry geometry_;
  std::uint64_t seed_;
  model::ArenaCarve carve_;
  Offsets off_;
  harness::SharedRegion region_;
};

}  // namespace cpkv::sim

// Exhaustive exploration of the interleavings of the rank step machines, with a visited-state set
// keyed on a 128-bit fingerprint of everything a future step can read: every byte of the World's
// flags, shadows and buffers (positions, totals and the violation records aside: nothing a step
// reads), and every rank machine's steps taken and batch (a machine's own state is a function of
// them: its program is built from the batch alone, and its only read that steers it, the path
// choice, runs in the fixed prologue). Two paths into the same fingerprint have the same futures,
// so each transition out of each distinct state is executed and checked once. Independent steps
// are explored in one order only (persistent sets over the locations each step reads and writes,
// properties/footprint.hpp, plus sleep sets); docs/properties.md argues why that loses no
// violation and no deadlock, and Explorer.ReducedAndFullAgree* check it.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "cpkv/model/batch.hpp"
#include "cpkv/model/plan.hpp"
#include "cpkv/model/setting.hpp"
#include "cpkv/sim/machine.hpp"
#include "cpkv/sim/mutant.hpp"
#include "cpkv/sim/world.hpp"

namespace cpkv::properties {

enum class Reduction { none, partial_order };
// full_state: the sound key above. program_counters: the old key (the vector of steps taken), kept
// to show what it misses (Explorer.OldKeyMissesWhatTheStateKeyFinds).
enum class StateKey { full_state, program_counters };
// idle_ranks: states that differ only by a permutation of the idle ranks (no page to write, no
// referenced prefix page, no query token, in every batch) are one state (docs/properties.md,
// "Symmetry"); findings then stand for their orbit (canonical_findings). Applied with the
// partial-order reduction only (Reduction::none explores every interleaving).
enum class Symmetry { none, idle_ranks };

struct ExploreOptions {
  model::Setting setting;
  std::vector<model::Batch> batches;     // run one after another, as the scheduled runner does
  model::Variant variant = model::Variant::staging_direct;
  std::int32_t ipc_missing_rank = -1;    // this rank's IPC probe fails (the capability fallback)
  std::int32_t layers = 2;
  harness::Mutant mutant = harness::Mutant::none;
  std::uint64_t states_max = 3'000'000;  // stop (incomplete) past this many distinct states
  double seconds_max = 120.0;            // ... or past this much CPU time of the exploring thread
  Reduction reduction = Reduction::partial_order;
  StateKey key = StateKey::full_state;
  Symmetry symmetry = Symmetry::idle_ranks;
  // Test-only, planted symmetry bugs (the comparison with and without symmetry must catch them):
  // these ranks put in the idle ranks' orbit though they are not idle; the idle ranks' barrier
  // shadow bits cleared but left out of their parts (an orbit fingerprint that forgets the mask
  // bits); the idle ranks' machine positions left out of their parts; the sleep sets stored as
  // they are, not mapped through the canonical permutation.
  std::uint8_t plant_symmetric_ranks = 0;
  bool plant_forget_shadow_bits = false;
  bool plant_forget_positions = false;
  bool plant_unmapped_sleep = false;
  // 0: exhaustive (a table of 128-bit fingerprints). k > 0: bitstate (supertrace) hashing over 2^k
  // bits, three bits per state: for settings past exhaustive reach; a state whose three bits are
  // all set is taken as visited, so coverage is partial (ExploreResult::coverage_estimate).
  std::int32_t bitstate_log2 = 0;
  // Go on past a violation and collect every distinct finding (the reduced-versus-full checks).
  bool collect_all = false;
  // Check after every step that it changed no byte outside the objects its footprint names, and
  // that the undo log restores every byte (tests).
  bool verify_footprints = false;
  // Test-only: called after every step with the rank that took it (a planted order-dependent write;
  // every object is then saved in the undo log).
  std::function<void(sim::World&, const std::vector<sim::RankMachine>&, std::uint32_t)> after_step;
};

struct ExploreResult {
  std::uint64_t states = 0;       // distinct states visited (fingerprints)
  std::uint64_t transitions = 0;  // steps executed
  bool complete = false;          // every interleaving explored (no limit hit, no violation)
  double seconds = 0.0;       // CPU seconds of the exploring thread (load-independent)
  double wall_seconds = 0.0;  // wall-clock seconds
  bool found = false;             // a violation or deadlock was reached
  std::string finding;            // what was found
  std::vector<std::uint32_t> schedule;  // choices that reach it, for `cpkv replay --schedule FILE`
  std::set<std::string> findings;        // collect_all: every distinct violation and deadlock
  double coverage_estimate = 1.0;        // bitstate: estimated share of the reachable states visited
  std::uint8_t symmetric_ranks = 0;      // the ranks canonicalised (a mask; 0: no symmetry applied)
  double states_per_second() const { return seconds > 0 ? static_cast<double>(states) / seconds : 0.0; }  // per CPU second
};

ExploreResult explore(const ExploreOptions& options);

// The idle ranks of a setting (a mask): in every batch no current page to write, no referenced
// prefix page to own, no query token, not the capability fallback's failing probe; none under a
// token-split variant or a planted bug that moves the writers (reversed_request_order,
// token_split), rank 0 not under unmatched_arrival (its extra arrival).
std::uint8_t idle_ranks(const ExploreOptions& options);

// Findings up to a permutation of `ranks`: every "rank N" with N in `ranks` reads "rank *", and a
// deadlock's per-rank positions are sorted, so two findings of one orbit read the same.
std::set<std::string> canonical_findings(const std::set<std::string>& findings, std::uint8_t ranks);

// The exploration workload of `cpkv explore` and the explorer tests: small enough to explore
// exhaustively, rich enough to matter: a prefix page, a full and a partial current page, a
// page-exact request, both buffer kinds, F and S layers, page 2.
model::Setting exploration_setting(std::int32_t cp);
model::Batch exploration_batch();

// The shapes `cpkv explore` proves (a table: one row per shape): every variant with a barrier, a
// rank with nothing to write (and, in the exploration batch, idle ranks from cp 4 on), an
// overflowing batch followed by a normal one, two batches in a row (the plan cache's test), every
// rank writing two pages, and the capability fallback (one rank's IPC probe fails).
struct ExploreShape {
  std::string name;
  model::Setting setting;
  std::vector<model::Batch> batches;
  model::Variant variant = model::Variant::staging_direct;
  std::int32_t ipc_missing_rank = -1;
  std::string describe() const;  // the batches, in one line
};
std::vector<ExploreShape> exploration_shapes(std::int32_t cp);
ExploreOptions options_for(const ExploreShape& shape, std::int32_t layers, harness::Mutant mutant);

}  // namespace cpkv::properties

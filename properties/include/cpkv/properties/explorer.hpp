// Exhaustive exploration of every interleaving of the rank step machines for small settings, with a
// visited-state set. A state is the vector of every rank's program counter: everything the checkers of
// invariants 2 and 4 look at when a step runs (stamps, read epochs, barrier counters) is a function of
// it, so two paths that reach the same vector have the same futures as far as those checks go, and
// every transition out of every reachable state is executed and checked once. Data bytes are not a
// function of it (a stale read leaves different bytes), so byte exactness is not proved this way.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cpkv/model/batch.hpp"
#include "cpkv/model/plan.hpp"
#include "cpkv/model/setting.hpp"
#include "cpkv/sim/mutant.hpp"

namespace cpkv::properties {

struct ExploreOptions {
  model::Setting setting;
  std::vector<model::Batch> batches;     // run one after another, as the scheduled runner does
  model::Variant variant = model::Variant::staging_direct;
  std::int32_t ipc_missing_rank = -1;    // this rank's IPC probe fails (the capability fallback)
  std::int32_t layers = 2;
  harness::Mutant mutant = harness::Mutant::none;
  std::uint64_t states_max = 3'000'000;  // stop (incomplete) past this many distinct states
  double seconds_max = 120.0;            // ... or past this much time
};

struct ExploreResult {
  std::uint64_t states = 0;       // distinct program-counter vectors visited
  std::uint64_t transitions = 0;  // steps executed
  bool complete = false;          // every interleaving explored (no limit hit, no violation)
  double seconds = 0.0;
  bool found = false;             // a violation or deadlock was reached
  std::string finding;            // what was found
  std::vector<std::uint32_t> schedule;  // choices that reach it, for `cpkv replay --schedule FILE`
};

ExploreResult explore(const ExploreOptions& options);

// The exploration workload of `cpkv explore` and the explorer tests: small enough to explore
// exhaustively, rich enough to matter: a prefix page, a full and a partial current page, a
// page-exact request, both buffer kinds, F and S layers, page 2.
model::Setting exploration_setting(std::int32_t cp);
model::Batch exploration_batch();

// The shapes `cpkv explore` proves for small groups: every variant with a barrier, a rank with
// nothing to write, an overflowing batch followed by a normal one, two batches in a row (the plan
// cache's test), and the capability fallback (one rank's IPC probe fails).
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

// The mutation report: the property suite run against each planted bug.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <rapidcheck.h>

#include "cpkv/properties/properties.hpp"

namespace cpkv::properties {

struct PropertyOutcome {
  bool passed = false;
  std::int32_t cases = 0;     // successful cases before the failure (or all of them)
  std::string message;        // RapidCheck's result text (counterexample and reason on failure)
  std::int32_t invariant = 0; // on failure: the invariant that fired (the property's own, or, free-running, the report's)
  Coverage coverage;          // the cases drawn until the first failure
};

// The seed a property runs under: `seed` mixed with its name, so properties that share a generator
// draw different cases from the one suite seed (RC_PARAMS="seed=S" reproduces every property).
std::uint64_t property_seed(std::uint64_t seed, const Property& property);

// Runs one property with `mutant` under `params` (seed, case count, size). Prints nothing.
PropertyOutcome check_property(const Property& property, harness::Mutant mutant, const rc::detail::TestParams& params);

// The property's coverage targets it missed in `outcome`, one line each; empty unless the run used
// the suite's fixed seed and at least kCoverageCasesMin cases (targets are shares of that sample).
inline constexpr int kCoverageCasesMin = 100;
std::vector<std::string> coverage_misses(const Property& property, const PropertyOutcome& outcome, const rc::detail::TestParams& params);

// The suite's fixed seed (the session date the suite was written), used unless RC_PARAMS has one.
inline constexpr std::uint64_t kSuiteSeed = 20261130;

// The suite's parameters: RapidCheck's configuration (RC_PARAMS overrides seed and max_success).
rc::detail::TestParams suite_params();

struct MutantRow {
  harness::Mutant mutant = harness::Mutant::none;
  bool caught = false;
  std::string caught_by;          // the first property that failed
  std::int32_t invariant = 0;     // the invariant that fired in it
  std::vector<std::string> also_caught_by;  // every later property that failed too
  std::int64_t counterexample_size = 0;  // requests + schedule choices of the shrunk case
  double seconds = 0.0;           // time until caught
  std::string replay;             // the cpkv replay line of the shrunk counterexample
  std::string timeline;           // its timeline beside it (Chrome trace events), or empty
  std::string message;
  std::vector<std::pair<std::string, Coverage>> coverage;  // per property run, in order
};

// Hunts every mutant of kAllMutants (and `none`, which must pass every property, in full). A mutant
// meets every property with a few cases first, then, if it survived, with params' count; the first
// property to fail is the row's, with the invariant that fired in it. New mutants need only their
// entry in kAllMutants. `every_property`: keep running the scheduled properties after the first
// catch, in full, to show every invariant that sees the bug (slower).
// `mutants`: the rows to hunt, in order (default: suite_rows(), every one).
std::vector<MutantRow> mutation_table(const rc::detail::TestParams& params, bool every_property,
                                      const std::function<void(const MutantRow&)>& on_row);
std::vector<MutantRow> mutation_table(const rc::detail::TestParams& params, bool every_property,
                                      const std::function<void(const MutantRow&)>& on_row, const std::vector<harness::Mutant>& mutants);

// The suite's rows: `none` (row 0), then every planted bug the simulator holds in kMutantTable's
// order (rows 1..). A shard K/N of the suite (K 1-based, 1 <= K <= N) holds the rows i with
// i % N == K - 1, so shard 1 holds `none`.
std::vector<harness::Mutant> suite_rows();
std::vector<std::size_t> shard_rows(std::size_t k, std::size_t n);

}  // namespace cpkv::properties

// What the generated cases of one property run covered (cp, page sizes, split policies, variants,
// overflow, idle ranks, shared prefix pages, several batches, capability fallback, vacuous cases),
// the coverage targets a property must meet under the suite's fixed seed, and the printed table.
// Counting is separate from checking: a property notes each case it draws; nothing here steers one.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace cpkv::properties {

struct Case;

struct Coverage {
  std::int64_t cases = 0;
  std::map<std::int32_t, std::int64_t> cp;          // cases per cp
  std::map<std::int32_t, std::int64_t> page_size;   // cases per P
  std::map<std::string, std::int64_t> split;        // cases per split policy
  std::map<std::string, std::int64_t> variant;      // cases per variant
  std::int64_t batches = 0;
  std::int64_t batches_overflowing = 0;   // by PROTOCOL.md section 4, computed from the requests
  std::int64_t idle_rank = 0;             // an admitted batch leaves some rank with no page to write
  std::int64_t shared_prefix = 0;         // a prefix page id appears twice in one batch
  std::int64_t several_batches = 0;
  std::int64_t capability_fallback = 0;   // a rank's IPC probe fails under a variant that needs IPC
  // Every batch overflows: no rank exchanges anything and the case passes vacuously. (cp = 1, a
  // single rank with no peer, is the other vacuous shape: the cp rows show it, about 0.5% of cases.)
  std::int64_t nothing_exchanged = 0;
  std::int64_t adversarial_schedule = 0;  // the schedule lets one rank run ahead in bursts
  std::int64_t layers_4_or_more = 0;

  void add(const Case& c);
  double share(std::int64_t count) const { return cases > 0 ? static_cast<double>(count) / static_cast<double>(cases) : 0.0; }
  double share_of(const std::map<std::string, std::int64_t>& counts, const std::string& key) const;
  double overflow_share() const;  // of batches, not cases
};

// One target on one property's coverage: share() must lie in [min, max].
struct CoverageTarget {
  std::string what;
  std::function<double(const Coverage&)> share;
  double min = 0.0;
  double max = 1.0;
};
// The targets every sim property meets: cp = 8 in at least 10% of cases, each split policy in at
// least 25%, and at most 2% of cases where nothing is exchanged.
std::vector<CoverageTarget> common_targets();

// One line per target that `coverage` misses: "6_byte_exactness: cp = 8 in 7% of cases (target >= 10%)".
std::vector<std::string> missed_targets(const std::string& property, const std::vector<CoverageTarget>& targets, const Coverage& coverage);

// Rows are measures, columns are property runs (name, coverage).
std::string coverage_table(const std::vector<std::pair<std::string, Coverage>>& columns);

// The case noter of the running property: check_property resets it; a property body notes each case
// it draws until the body first fails (shrinking re-runs the body on smaller cases, which would
// skew the counts).
void reset_coverage();
void note_case(const Case& c);
void stop_counting();
const Coverage& current_coverage();

}  // namespace cpkv::properties

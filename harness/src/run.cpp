#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "cpkv/harness/run.hpp"
#include "cpkv/model/batch.hpp"

namespace cpkv::harness {

void Totals::add_mismatches(std::int64_t kinds, std::string_view description) {
  mismatches += kinds;
  if (first_mismatch[0] != '\0' || description.empty()) return;
  const std::size_t n = std::min(description.size(), sizeof(first_mismatch) - 1);
  std::memcpy(first_mismatch, description.data(), n);
  first_mismatch[n] = '\0';
}

void add_rank(RunReport& report, const Totals& rank) {
  report.ranks.push_back(rank);
  report.steps += rank.steps;
}

std::int64_t RunReport::mismatches() const {
  std::int64_t sum = 0;
  for (const Totals& t : ranks) sum += t.mismatches;
  return sum;
}

std::string describe(const Violation& v) {
  static constexpr const char* kNames[] = {"?",
                                           "page-writer exclusivity",
                                           "parity-half reuse safety",
                                           "overflow determinism",
                                           "barrier phase safety",
                                           "plan invariance",
                                           "byte exactness",
                                           "capability agreement",
                                           "liveness",
                                           "attention plan exactness"};
  // Where, in words: a field that does not apply (-1) is left out, not printed as -1 (issue 25,
  // item 4); a violation seen only once the group stopped says so.
  std::string where;
  if (v.rank >= 0) where += fmt::format(" rank {}", v.rank);
  if (v.batch >= 0) where += fmt::format(" batch {}", v.batch);
  if (v.layer >= 0) where += fmt::format(" layer {}", v.layer);
  if (v.slot >= 0) where += fmt::format(" slot {}", v.slot);
  if (v.step >= 0) where += fmt::format(" step {}", v.step);
  if (v.batch < 0 && v.layer < 0 && v.step < 0) where += " at the end of the run";
  return fmt::format("invariant {} ({}):{}: {}", v.invariant, kNames[std::clamp(v.invariant, 0, kInvariants)], where, v.detail);
}

}  // namespace cpkv::harness

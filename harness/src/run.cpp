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

std::string violation_line(std::int32_t invariant, std::int32_t rank, std::int64_t batch, std::int32_t layer, std::int64_t slot, std::int64_t step,
                           std::string_view detail) {
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
  if (rank >= 0) where += fmt::format(" rank {}", rank);
  if (batch >= 0) where += fmt::format(" batch {}", batch);
  if (layer >= 0) where += fmt::format(" layer {}", layer);
  if (slot >= 0) where += fmt::format(" slot {}", slot);
  if (step >= 0) where += fmt::format(" step {}", step);
  if (batch < 0 && layer < 0 && step < 0) where += " at the end of the run";
  return fmt::format("invariant {} ({}):{}: {}", invariant, kNames[std::clamp(invariant, 0, kInvariants)], where, detail);
}

void Violation::set_detail(std::string_view text) {
  const std::size_t n = std::min(text.size(), sizeof detail - 1);
  std::memcpy(detail, text.data(), n);
  detail[n] = '\0';
}

std::string describe(const Violation& v) { return violation_line(v.invariant, v.rank, v.batch, v.layer, v.slot, v.step, v.text()); }

}  // namespace cpkv::harness

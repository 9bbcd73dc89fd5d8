#include "cpkv/sim/mutant.hpp"

#include "cpkv/sim/runner.hpp"

namespace cpkv::sim {

// Harness names this file uses unqualified (sim's headers do not re-export them).
using harness::RunReport;

// Violations are kept in the order they were recorded (one shared counter hands out the indices), so
// the first kept one is the earliest; a deadlock or a dead rank is only known once nothing moves.
std::int32_t first_invariant_fired(const RunReport& report) {
  if (!report.violations.empty()) return report.violations.front().invariant;
  if (!report.failure.empty()) return 8;
  return 0;
}

}  // namespace cpkv::sim

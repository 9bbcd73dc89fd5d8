#include "cpkv/sim/mutant.hpp"

#include "cpkv/sim/runner.hpp"

namespace cpkv::sim {

std::string_view to_string(Mutant mutant) {
  switch (mutant) {
    case Mutant::none: return "none";
    case Mutant::single_half: return "single_half";
    case Mutant::no_barrier: return "no_barrier";
    case Mutant::arrive_before_fill: return "arrive_before_fill";
    case Mutant::rank_local_overflow: return "rank_local_overflow";
    case Mutant::address_keyed_plan_cache: return "address_keyed_plan_cache";
    case Mutant::token_split: return "token_split";
    case Mutant::skip_zero: return "skip_zero";
    case Mutant::unagreed_capability: return "unagreed_capability";
    case Mutant::barrier_reset_race: return "barrier_reset_race";
    case Mutant::skip_idle_barrier: return "skip_idle_barrier";
    case Mutant::barrier_passes_early: return "barrier_passes_early";
    case Mutant::plan_rebuilt_per_layer: return "plan_rebuilt_per_layer";
    case Mutant::reversed_request_order: return "reversed_request_order";
    case Mutant::unmatched_arrival: return "unmatched_arrival";
  }
  return "?";
}

std::optional<Mutant> parse_mutant(std::string_view text) {
  if (text == "none") return Mutant::none;
  for (Mutant m : kAllMutants) {
    if (to_string(m) == text) return m;
  }
  return std::nullopt;
}

// Violations are kept in the order they were recorded (one shared counter hands out the indices), so
// the first kept one is the earliest; a deadlock or a dead rank is only known once nothing moves.
std::int32_t first_invariant_fired(const RunReport& report) {
  if (!report.violations.empty()) return report.violations.front().invariant;
  if (!report.failure.empty()) return 8;
  return 0;
}

}  // namespace cpkv::sim

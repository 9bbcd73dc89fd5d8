#include "cpkv/sim/mutant.hpp"

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

}  // namespace cpkv::sim

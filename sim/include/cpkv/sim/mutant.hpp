// Planted bugs (PROTOCOL.md section 9). Each is a run-time switch on the simulated protocol, off by
// default; the only way to turn one on is to pass it explicitly in SimOptions (the CLI's --mutant),
// and a run with a mutant prints a banner saying so.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

#include "cpkv/harness/run.hpp"

namespace cpkv::sim {

using Mutant = harness::Mutant;  // harness/run.hpp: the switch travels in the run options

inline constexpr std::array<Mutant, 13> kAllMutants = {
    Mutant::single_half,          Mutant::no_barrier,             Mutant::arrive_before_fill,
    Mutant::rank_local_overflow,  Mutant::address_keyed_plan_cache, Mutant::token_split,
    Mutant::skip_zero,            Mutant::unagreed_capability,    Mutant::barrier_reset_race,
    Mutant::skip_idle_barrier,    Mutant::barrier_passes_early,   Mutant::plan_rebuilt_per_layer,
    Mutant::reversed_request_order,
};

std::string_view to_string(Mutant mutant);
std::optional<Mutant> parse_mutant(std::string_view text);

}  // namespace cpkv::sim

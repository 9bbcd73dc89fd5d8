// Planted bugs (PROTOCOL.md section 9). Each is a run-time switch on the simulated protocol, off by
// default; the only way to turn one on is to pass it explicitly in SimOptions (the CLI's --mutant),
// and a run with a mutant prints a banner saying so.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace cpkv::sim {

enum class Mutant : std::uint8_t {
  none,
  single_half,               // every layer uses staging half 0 (invariant 2)
  no_barrier,                // the counting barrier is skipped (invariant 2)
  arrive_before_fill,        // arrive at the barrier before the fill, wait after it (invariant 2)
  rank_local_overflow,       // overflow judged on this rank's own pages (invariant 3)
  address_keyed_plan_cache,  // plan cache keyed on the dense buffer address (invariant 5)
  token_split,               // in-seq split at token granularity: a page can get two writers (invariant 1)
  skip_zero,                 // the zero step is skipped: stale tails survive (invariant 6)
  unagreed_capability,       // each rank takes its own IPC probe, not the group's MIN (invariant 7)
  barrier_reset_race,        // one shared count reset by the first leaver (invariants 4 and 8)
  skip_idle_barrier,         // a rank with no page to write skips the barrier (invariants 4 and 8)
  barrier_passes_early,      // the barrier waits for the previous phase only: a rank passes one phase early (invariant 4)
  plan_rebuilt_per_layer,    // the compose plan is rebuilt on every layer instead of once per batch (invariant 5)
  reversed_request_order,    // the layout itself puts requests in reverse order: self-consistent, only a plain oracle sees it (invariant 6)
};

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

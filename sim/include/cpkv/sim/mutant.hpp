// Planted bugs (PROTOCOL.md section 9). Each is a run-time switch on the simulated protocol, off by
// default; the only way to turn one on is to pass it explicitly in harness::RunOptions (the CLI's --mutant),
// and a run with a mutant prints a banner saying so.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

#include "cpkv/harness/attention_mutant.hpp"
#include "cpkv/harness/run.hpp"
#include "cpkv/model/attention_bug.hpp"

namespace cpkv::sim {


// The one place the step machine learns which bug is planted: it asks these named questions and
// never compares against a harness::Mutant itself. Every answer is the correct protocol's for harness::Mutant::none.
class MutantPolicy {
 public:
  explicit MutantPolicy(harness::Mutant mutant = harness::Mutant::none) : mutant_(mutant) {}
  harness::Mutant mutant() const { return mutant_; }

  // Staging and dense halves in rotation: 2 (parity), 1 under single_half.
  std::int32_t halves() const { return mutant_ == harness::Mutant::single_half ? 1 : 2; }
  // Does a rank skip the layer's counting barrier? idle: it writes no current page this layer.
  bool skips_barrier(bool idle) const {
    return mutant_ == harness::Mutant::no_barrier || (mutant_ == harness::Mutant::skip_idle_barrier && idle);
  }
  // Arrive before the fill and wait after it, instead of both after the publish.
  bool arrive_before_fill() const { return mutant_ == harness::Mutant::arrive_before_fill; }
  // The barrier is one shared count that the first leaver resets, not monotonic per-rank counters.
  bool uses_reset_barrier() const { return mutant_ == harness::Mutant::barrier_reset_race; }
  // How many phases behind its own the barrier lets a rank pass on (0: none).
  std::uint64_t barrier_phase_lag() const { return mutant_ == harness::Mutant::barrier_passes_early ? 1 : 0; }
  // Does each rank take its own IPC probe instead of the group's agreed MIN?
  bool ignores_peer_capability() const { return mutant_ == harness::Mutant::unagreed_capability; }
  // Is the zero step (dense half, own current pages) left out?
  bool skips_zero() const { return mutant_ == harness::Mutant::skip_zero; }
  // Is overflow judged on this rank's own current pages instead of the batch's?
  bool judges_overflow_locally() const { return mutant_ == harness::Mutant::rank_local_overflow; }
  // Is the plan cache keyed on the dense buffer address instead of the batch?
  bool keys_plan_cache_on_address() const { return mutant_ == harness::Mutant::address_keyed_plan_cache; }
  // Is the plan rebuilt at every layer instead of once per batch?
  bool rebuilds_plan_per_layer() const { return mutant_ == harness::Mutant::plan_rebuilt_per_layer; }
  // Is the in-sequence split cut at token granularity (a page can get two writers)?
  bool splits_tokens() const { return mutant_ == harness::Mutant::token_split; }
  // Does the layout put the batch's requests in reverse order?
  bool reverses_request_order() const { return mutant_ == harness::Mutant::reversed_request_order; }
  // Does this rank arrive at the barrier once more after a batch's last layer (a closing arrival no
  // peer makes and no one waits for)? Nothing blocks and no pass is early: only the flags, one phase
  // apart once the group stops, show it.
  bool arrives_once_more(std::int32_t rank) const { return mutant_ == harness::Mutant::unmatched_arrival && rank == 0; }
  // The attention plan (PROTOCOL.md section 11): which of invariant 9's bugs it holds
  // (model::apply_attention_bug applies it, for the GPU plugin too).
  model::AttentionBug attention_bug() const { return harness::attention_bug(mutant_); }
  // Section 12: does the re-ordering after the all-gather copy the gathered rows in gathered order
  // (padding included) instead of each current row from the gathered row the plan names?
  bool skips_reorder() const { return mutant_ == harness::Mutant::allgather_skipped_reorder; }

 private:
  harness::Mutant mutant_;
};

}  // namespace cpkv::sim

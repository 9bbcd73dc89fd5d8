// The one place the fused plugin (gpu/fused/) learns which planted bug is switched on (as sim::MutantPolicy is
// for the step machine): it asks these named questions and never compares against a Mutant itself.
// Every answer is the correct protocol's for Mutant::none. The bugs it holds are the rows of
// harness::kMutantTable marked kGpuHolds; a spin on one rank opens the race window so each bug
// shows on every run.
#pragma once

#include <cstdint>

#include "cpkv/harness/mutants.hpp"
#include "cpkv/model/staging.hpp"

namespace cpkv::cuda {

class GpuMutantPolicy {
 public:
  GpuMutantPolicy(harness::Mutant mutant, std::int32_t rank, std::int32_t cp) : mutant_(mutant), rank_(rank), cp_(cp) {}

  // Every layer uses staging half 0 instead of the layer's parity half (in process its dense half
  // too; the fused plugin's dense buffers are the host's, verified at the parity half).
  bool single_half() const { return mutant_ == harness::Mutant::single_half; }
  // The half layer l's staging (and, in process, its dense buffer) is carved from: its parity half,
  // or half 0 under single_half.
  std::int32_t half_of(std::int32_t l) const { return single_half() ? 0 : model::parity_half(l); }
  // The counting barrier inside the compose launch is left out.
  bool skips_barrier() const { return mutant_ == harness::Mutant::no_barrier; }
  // How many phases behind its own the barrier lets a rank pass on (0: none).
  std::int32_t barrier_phase_lag() const { return mutant_ == harness::Mutant::barrier_passes_early ? 1 : 0; }
  // The zero step (the dense all-reduce variants' zeroing of the dense half, own partial pages' tails) is left out.
  bool skips_zero() const { return mutant_ == harness::Mutant::skip_zero; }
  // The last rank's fill is delayed, so a reader that does not wait for it reads stale bytes.
  bool slow_producer() const {
    return (mutant_ == harness::Mutant::no_barrier || mutant_ == harness::Mutant::barrier_passes_early) && rank_ == cp_ - 1;
  }
  // Rank 0 reads late, so a peer reusing the half it reads overwrites it first.
  bool slow_reader() const { return mutant_ == harness::Mutant::single_half && rank_ == 0; }

 private:
  harness::Mutant mutant_;
  std::int32_t rank_;
  std::int32_t cp_;
};

}  // namespace cpkv::cuda

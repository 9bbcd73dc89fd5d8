// The simulator's backends (free-running processes or threads, or scheduled step machines) behind
// the harness's one Backend interface (harness/run.hpp), which the GPU backend (gpu/) fills too.
#pragma once

#include <memory>
#include <string>

#include "cpkv/harness/request.hpp"
#include "cpkv/sim/runner.hpp"

namespace cpkv::sim {


// `recording` (recording.hpp): the files each run appends to as it goes; each run is the timeline's
// next process.
std::unique_ptr<harness::Backend> make_free_backend(RanksAs ranks_as, FaultOptions faults, RunLimits limits, Recording recording = {});
std::unique_ptr<harness::Backend> make_scheduled_backend(Schedule schedule, RunLimits limits, Recording recording = {});

// Registers "sim": free-running ranks (ranks_as processes or threads; swarm draws every fault knob
// from the seed) or step machines under a schedule; every planted bug; the /dev/shm space checked
// before any rank starts.
void register_backends(harness::Registry& registry);

// The free-running fault knobs a request runs with: the fixed defaults, or (swarm) every knob drawn
// from the seed.
FaultOptions fault_options(const harness::ReplayRequest& request);

}  // namespace cpkv::sim

// The simulator's backends (free-running processes or threads, or scheduled step machines) behind
// the harness's one Backend interface (harness/run.hpp), which the GPU backend (gpu/) fills too.
#pragma once

#include <memory>
#include <string>

#include "cpkv/sim/runner.hpp"

namespace cpkv::sim {

using harness::Backend;  // the one interface (harness/run.hpp)

std::unique_ptr<Backend> make_free_backend(RanksAs ranks_as, FaultOptions faults, RunLimits limits);
std::unique_ptr<Backend> make_scheduled_backend(Schedule schedule, RunLimits limits, bool record_events);

}  // namespace cpkv::sim

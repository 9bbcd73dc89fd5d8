// The one backend interface: run every batch of a source through one exchange variant and report
// what happened (bytes, barriers, verdicts, mismatches against the model, invariant violations).
// The rank simulator (free-running processes or threads, or scheduled step machines) and the CUDA
// backend (kernels/cuda_backend.hpp) fill it; `cpkv replay` and the tests drive any of them.
#pragma once

#include <memory>
#include <string>

#include "cpkv/sim/runner.hpp"

namespace cpkv::sim {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual RunReport run(const BatchSource& source, const SimOptions& options) = 0;
};

std::unique_ptr<Backend> make_free_backend(RanksAs ranks_as, FaultOptions faults, RunLimits limits);
std::unique_ptr<Backend> make_scheduled_backend(Schedule schedule, RunLimits limits, bool record_events);

}  // namespace cpkv::sim

#include "cpkv/sim/backend.hpp"

namespace cpkv::sim {

namespace {

class FreeBackend final : public Backend {
 public:
  FreeBackend(RanksAs ranks_as, FaultOptions faults, RunLimits limits) : ranks_as_(ranks_as), faults_(faults), limits_(limits) {}
  std::string name() const override { return ranks_as_ == RanksAs::processes ? "sim/processes" : "sim/threads"; }
  RunReport run(const BatchSource& source, const SimOptions& options) override { return run_free(source, options, ranks_as_, faults_, limits_); }

 private:
  RanksAs ranks_as_;
  FaultOptions faults_;
  RunLimits limits_;
};

class ScheduledBackend final : public Backend {
 public:
  ScheduledBackend(Schedule schedule, RunLimits limits, bool record_events)
      : schedule_(std::move(schedule)), limits_(limits), record_events_(record_events) {}
  std::string name() const override { return "sim/scheduled"; }
  RunReport run(const BatchSource& source, const SimOptions& options) override {
    return run_scheduled(source, options, schedule_, limits_, record_events_);
  }

 private:
  Schedule schedule_;
  RunLimits limits_;
  bool record_events_;
};

}  // namespace

std::unique_ptr<Backend> make_free_backend(RanksAs ranks_as, FaultOptions faults, RunLimits limits) {
  return std::make_unique<FreeBackend>(ranks_as, faults, limits);
}

std::unique_ptr<Backend> make_scheduled_backend(Schedule schedule, RunLimits limits, bool record_events) {
  return std::make_unique<ScheduledBackend>(std::move(schedule), limits, record_events);
}

}  // namespace cpkv::sim

#include "cpkv/sim/backend.hpp"

#include <fmt/format.h>

#include "cpkv/model/plan.hpp"

#include "cpkv/sim/world.hpp"

namespace cpkv::sim {

// Harness names this file uses unqualified (sim's headers do not re-export them).
using harness::RunReport;
using harness::BatchSource;

namespace {

// Each run (a variant) is its own process in the timeline, named by mode and variant.
Recording next_run(Recording& recording, std::string_view mode, model::Variant variant) {
  Recording run = recording;
  run.label = fmt::format("{} {}", mode, model::to_string(variant));
  ++recording.timeline_pid;
  return run;
}

class FreeBackend final : public harness::Backend {
 public:
  FreeBackend(RanksAs ranks_as, FaultOptions faults, RunLimits limits, Recording recording)
      : ranks_as_(ranks_as), faults_(faults), limits_(limits), recording_(std::move(recording)) {}
  std::string name() const override { return std::string(mode_name(ranks_as_)); }
  RunReport run(const BatchSource& source, const harness::RunOptions& options) override {
    return run_free(source, options, ranks_as_, faults_, limits_, next_run(recording_, mode_name(ranks_as_), options.variant));
  }

 private:
  RanksAs ranks_as_;
  FaultOptions faults_;
  RunLimits limits_;
  Recording recording_;
};

class ScheduledBackend final : public harness::Backend {
 public:
  ScheduledBackend(Schedule schedule, RunLimits limits, Recording recording)
      : schedule_(std::move(schedule)), limits_(limits), recording_(std::move(recording)) {}
  std::string name() const override { return std::string(kScheduledMode); }
  RunReport run(const BatchSource& source, const harness::RunOptions& options) override {
    return run_scheduled(source, options, schedule_, limits_, next_run(recording_, kScheduledMode, options.variant));
  }

 private:
  Schedule schedule_;
  RunLimits limits_;
  Recording recording_;
};

}  // namespace

std::unique_ptr<harness::Backend> make_free_backend(RanksAs ranks_as, FaultOptions faults, RunLimits limits, Recording recording) {
  return std::make_unique<FreeBackend>(ranks_as, faults, limits, std::move(recording));
}

std::unique_ptr<harness::Backend> make_scheduled_backend(Schedule schedule, RunLimits limits, Recording recording) {
  return std::make_unique<ScheduledBackend>(std::move(schedule), limits, std::move(recording));
}

}  // namespace cpkv::sim

namespace cpkv::sim {

FaultOptions fault_options(const harness::ReplayRequest& request) {
  if (request.swarm) return swarm_faults(request.seed);
  FaultOptions faults;
  faults.seed = request.seed;
  return faults;
}

namespace {

// The schedule a request names, parsed once by the entry's check.
std::shared_ptr<const Schedule> schedule_of(const harness::CheckedRequest& c) {
  return std::static_pointer_cast<const Schedule>(c.backend_state);
}

void check_sim_request(harness::CheckedRequest& c) {
  const harness::ReplayRequest& r = c.request;
  if (r.ranks_as && *r.ranks_as != "processes" && *r.ranks_as != "threads") {
    throw harness::RequestError("ranks_as", fmt::format("'{}' is not processes or threads", *r.ranks_as));
  }
  if (r.swarm && r.schedule) throw harness::RequestError("swarm", "fault knobs exist only for free-running ranks (no schedule)");
  if (r.event_log && !r.schedule) throw harness::RequestError("event_log", "only scheduled runs (a schedule) have an event log");
  // Scheduled runs count steps of the schedule on a timeline; free-running ones, the host's wall
  // clock, and their header names the fault knobs.
  if (!r.schedule) {
    c.backend_line = fmt::format("{}: {}", r.swarm ? "swarm knobs" : "fault knobs", describe(fault_options(r)));
    return;
  }
  c.timeline_clock = harness::TimelineClock::steps;
  std::optional<Schedule> schedule = named_schedule(*r.schedule, r.seed);
  if (!schedule) {
    try {
      schedule = read_schedule_file(*r.schedule);
    } catch (const std::exception& e) {
      throw harness::RequestError("schedule", e.what());
    }
  }
  c.backend_state = std::make_shared<const Schedule>(*std::move(schedule));
}

RunLimits limits_of(const harness::ReplayRequest& r, const harness::ProgressFunction& progress) {
  RunLimits limits;
  if (r.wait_ms_max) limits.wait_ms_max = *r.wait_ms_max;
  if (r.stuck_ms_max) limits.stuck_ms_max = *r.stuck_ms_max;
  limits.on_progress = progress;
  return limits;
}

// A /dev/shm too small is one line before any output, not a SIGBUS mid-run.
void check_sim_space(const harness::BatchSource& source, const harness::SourceShape& shape, std::int32_t layers) {
  harness::RunOptions sized;
  sized.layers = layers;
  World::check_space(world_geometry(source, sized, shape));
}

std::unique_ptr<harness::Backend> replay_sim(const harness::CheckedRequest& c, const harness::BatchSource& source, const harness::ScannedSource& scanned,
                                             const harness::ProgressFunction& progress) {
  check_sim_space(source, scanned.scan.shape, scanned.layers);
  const harness::ReplayRequest& r = c.request;
  Recording recording;
  recording.event_log_path = r.event_log.value_or("");
  recording.timeline_path = r.timeline.value_or("");
  if (const auto schedule = schedule_of(c)) return make_scheduled_backend(*schedule, limits_of(r, progress), std::move(recording));
  const RanksAs ranks_as = r.ranks_as.value_or("processes") == "threads" ? RanksAs::threads : RanksAs::processes;
  return make_free_backend(ranks_as, fault_options(r), limits_of(r, progress), std::move(recording));
}

}  // namespace

void register_backends(harness::Registry& registry) {
  harness::BackendEntry sim;
  sim.name = "sim";
  sim.summary = "the rank simulator: cp fake ranks over real shared memory, free-running (processes or threads) or under a schedule";
  sim.options = harness::kTakesRanksAs | harness::kTakesSchedule | harness::kTakesSwarm | harness::kTakesWaitMsMax | harness::kTakesStuckMsMax |
                harness::kTakesIpcFault | harness::kTakesEventLog | harness::kTakesTimeline;
  sim.mutants = harness::kSimulatorHolds;
  sim.check = check_sim_request;
  sim.replay = replay_sim;
  registry.add(std::move(sim));
}

}  // namespace cpkv::sim

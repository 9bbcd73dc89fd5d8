// Running a trace through the simulated group: scheduled (one process, a schedule picks which rank
// steps next, so a run is a pure function of batches, variant and schedule) or free-running (one
// process or thread per rank, with seeded delays at named fault points). Both bound every wait.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cpkv/harness/launch.hpp"
#include "cpkv/harness/run.hpp"
#include "cpkv/harness/source.hpp"
#include "cpkv/model/batch.hpp"
#include "cpkv/model/setting.hpp"
#include "cpkv/sim/machine.hpp"
#include "cpkv/sim/world.hpp"

namespace cpkv::sim {

// The batch source, the report and the run options are the harness's, shared with the GPU backend.
using harness::BatchCursor;
using harness::BatchSource;
using harness::measure;
using harness::SourceShape;

// The geometry of the world a run of `source` with `options` carves (every sim mode).
WorldGeometry world_geometry(const BatchSource& source, const SimOptions& options, const SourceShape& shape);

enum class ScheduleKind : std::uint8_t { random, round_robin, list };
struct Schedule {
  ScheduleKind kind = ScheduleKind::random;
  std::vector<std::uint32_t> choices;  // list: choice i picks runnable[choices[i] % runnable]; then round-robin
  std::uint64_t seed = 1;              // random
};
// Reads a schedule file: whitespace-separated non-negative integers. Throws std::runtime_error with
// file and position on bad input.
Schedule read_schedule_file(const std::string& path);

enum class RanksAs : std::uint8_t { processes, threads };

struct FaultOptions {
  std::uint64_t seed = 1;
  std::int32_t delay_us_max = 200;        // longest injected delay
  double flag_write_delay_probability = 0.05;   // before a flag write (arrive)
  double gather_delay_probability = 0.002;      // inside the gather
  std::int32_t slow_producer_delay_us = 2000;   // the rotating slow producer's delay before its fill
  std::int32_t kill_rank = -1;                  // this rank SIGKILLs itself (processes only: a crash) ...
  std::uint64_t kill_after_steps = 0;           // ... after this many steps
};

struct RunLimits {
  std::int64_t wait_ms_max = 20000;         // any single wait (free-running)
  std::int64_t run_ms_max = 300000;         // the whole run (free-running, from the launcher)
  // Processes: the launcher's watchdog ends a run in which no rank made progress this long; 0 means
  // twice wait_ms_max, so the ranks' own wait bound reports first and the watchdog is the backstop
  // for a rank stuck outside a wait.
  std::int64_t stuck_ms_max = 0;
  std::uint64_t steps_max = 200'000'000;    // scheduled: total steps
  // Called on the launching thread with the batches every rank has finished (about every 100 ms
  // while ranks run free, after every batch when scheduled); for a progress bar. May be empty.
  std::function<void(std::int64_t batches_done)> on_progress;
};

using harness::RunReport;

RunReport run_scheduled(const BatchSource& source, const SimOptions& options, const Schedule& schedule,
                        const RunLimits& limits, bool record_events = false);

RunReport run_free(const BatchSource& source, const SimOptions& options, RanksAs ranks_as,
                   const FaultOptions& faults, const RunLimits& limits);

// Exit codes of a free-running rank process (the harness's).
inline constexpr int kRankExitOk = harness::kRankExitOk;
inline constexpr int kRankExitDeadlock = harness::kRankExitDeadlock;
inline constexpr int kRankExitError = harness::kRankExitError;

// One line per rank from the shared positions: where everyone is, for deadlock reports.
std::string describe_positions(const World& world);

using harness::describe;

// The invariant whose checker fired first in a run (1..8): the first violation recorded, else 8 when
// the run did not end normally, else 0 (nothing fired). Defined in mutant.cpp.
std::int32_t first_invariant_fired(const RunReport& report);

}  // namespace cpkv::sim

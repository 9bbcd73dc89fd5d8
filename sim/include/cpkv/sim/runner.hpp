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
#include <string_view>
#include <vector>

#include "cpkv/harness/launch.hpp"
#include "cpkv/harness/run.hpp"
#include "cpkv/harness/source.hpp"
#include "cpkv/model/batch.hpp"
#include "cpkv/model/setting.hpp"
#include "cpkv/sim/machine.hpp"
#include "cpkv/sim/recording.hpp"
#include "cpkv/sim/world.hpp"

namespace cpkv::sim {

// The batch source, the report and the run options are the harness's (harness/run.hpp, source.hpp),
// shared with the GPU backend, and spelled harness:: here.

// The geometry of the world a run of `source` with `options` carves (every sim mode).
WorldGeometry world_geometry(const harness::BatchSource& source, const harness::RunOptions& options, const harness::SourceShape& shape);

enum class ScheduleKind : std::uint8_t { random, round_robin, list };
struct Schedule {
  ScheduleKind kind = ScheduleKind::random;
  std::vector<std::uint32_t> choices;  // list: choice i picks runnable[choices[i] % runnable]; then round-robin
  std::uint64_t seed = 1;              // random
};
// Reads a schedule file: whitespace-separated non-negative integers. Throws std::runtime_error with
// file and position on bad input.
Schedule read_schedule_file(const std::string& path);
// The schedules named on a command line: "random" (from seed) and "round-robin"; nullopt for any
// other text (a schedule file's name).
std::optional<Schedule> named_schedule(std::string_view name, std::uint64_t seed);

enum class RanksAs : std::uint8_t { processes, threads };
// A run's mode as the report, the run header and the replay JSON spell it (the backend's name).
inline constexpr std::string_view kScheduledMode = "sim/scheduled";
constexpr std::string_view mode_name(RanksAs ranks_as) { return ranks_as == RanksAs::processes ? "sim/processes" : "sim/threads"; }

// Which rank plays a slow role on a layer: always the same rank, a rank that moves every layer, or
// every batch.
enum class SlowRotation : std::uint8_t { fixed, per_layer, per_batch };
// Steps before which a rank may yield its core (std::this_thread::yield), letting a peer run into a
// window: writes (zero, fill, publish), reads (gather), flags (arrive, wait), or every step.
enum class YieldAt : std::uint8_t { nowhere, writes, reads, flags, every_step };

// Seeded delays at named fault points of the free-running simulator. The defaults are the fixed
// knobs of a plain run; swarm_faults(seed) draws every knob from the seed instead (TigerBeetle's
// VOPR swarm: each run stresses a different mix), and describe() prints them.
//
// Two slow roles per layer, on different ranks. They hold rather than sleep a fixed time: a hold
// ends when a peer has moved past the window the role opens (or at its bound), so a window stays
// open however the ranks are scheduled on a loaded machine, and a correct run pays little.
//  - the slow producer holds before its first fill of the layer until a peer has finished the
//    layer's reads (a peer that read its pages unfilled was not held back by the barrier), or
//    until every peer waits at a barrier that cannot open without it (nothing left to open);
//  - the slow reader holds its read epoch open (before it ends the layer) until a peer is past a
//    later layer's zero and fill (a peer that rewrote a half it still reads ignored the parity).
struct FaultOptions {
  std::uint64_t seed = 1;
  std::int32_t delay_us_max = 200;              // longest random delay at a fault point
  double flag_write_delay_probability = 0.05;   // before a flag write (arrive)
  double gather_delay_probability = 0.002;      // inside the gather
  double write_delay_probability = 0.0;         // before a zero, fill or publish
  std::int32_t slow_producer_delay_us = 2000;   // bound on the slow producer's hold (0: no slow producer)
  std::int32_t slow_reader_delay_us = 0;        // bound on the slow reader's hold (0: no slow reader)
  SlowRotation slow_rotation = SlowRotation::per_layer;
  std::int32_t slow_rank = 0;                   // the slow producer on batch 0 layer 0 (modulo cp)
  std::int32_t slow_reader_offset = 1;          // the slow reader: the producer + this (modulo cp)
  YieldAt yield_at = YieldAt::nowhere;
  double yield_probability = 0.0;               // at each step of the yield_at kind
  std::int32_t wait_poll_sleep_us = 0;          // a blocked rank between polls: 0 yields, else sleeps this long
  std::int32_t kill_rank = -1;                  // this rank SIGKILLs itself (processes only: a crash) ...
  std::uint64_t kill_after_steps = 0;           // ... after this many steps
};

// Every knob of FaultOptions drawn from `seed` (kill_rank stays off): the same seed, the same knobs.
FaultOptions swarm_faults(std::uint64_t seed);
// The knobs in one line: "delay_us_max 200 | flag 0.05 | gather 0.002 | write 0 | slow fill ..."
std::string describe(const FaultOptions& faults);

struct RunLimits {
  std::int64_t wait_ms_max = 20000;         // any single wait (free-running)
  std::int64_t run_ms_max = 300000;         // the whole run (free-running, from the launcher)
  // Processes: the launcher's watchdog ends a run in which no rank made progress this long; 0 means
  // twice wait_ms_max, so the ranks' own wait bound reports first and the watchdog is the backstop
  // for a rank stuck outside a wait.
  std::int64_t stuck_ms_max = 0;
  std::uint64_t steps_max = 200'000'000;    // scheduled: total steps
  // Called on the launching thread with the layers every rank has ended, over batches (a rejected
  // batch counts as its layers once passed): about every 100 ms while ranks run free, at each
  // change when scheduled; for a progress bar. May be empty.
  std::function<void(std::int64_t layers_done)> on_progress;
};

// `recording`: what the run writes as it goes (recording.hpp): the event log (scheduled only) and
// the timeline (the step clock when scheduled, monotonic microseconds when free-running).
harness::RunReport run_scheduled(const harness::BatchSource& source, const harness::RunOptions& options, const Schedule& schedule,
                        const RunLimits& limits, const Recording& recording = {});

harness::RunReport run_free(const harness::BatchSource& source, const harness::RunOptions& options, RanksAs ranks_as,
                   const FaultOptions& faults, const RunLimits& limits, const Recording& recording = {});

// A free-running rank process exits with the harness's codes (harness::kRankExitOk, ...).

// One line per rank from the shared positions: where everyone is, for deadlock reports.
std::string describe_positions(const World& world);

// The invariant whose checker fired first in a run (1..8): the first violation recorded, else 8 when
// the run did not end normally, else 0 (nothing fired). Defined in mutant.cpp.
std::int32_t first_invariant_fired(const harness::RunReport& report);

}  // namespace cpkv::sim

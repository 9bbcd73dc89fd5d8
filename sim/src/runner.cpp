#include "cpkv/sim/runner.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "cpkv/model/assert.hpp"
#include "cpkv/harness/interrupt.hpp"
#include "cpkv/model/content.hpp"
#include "cpkv/traces/trace.hpp"
#include "cpkv/sim/recording.hpp"
#include "fault_injector.hpp"

namespace cpkv::sim {

// Harness names this file uses unqualified (sim's headers do not re-export them).
using harness::RunReport;
using harness::BatchSource;
using harness::BatchCursor;
using harness::SourceShape;
using harness::measure;
using harness::Violation;
using harness::kRankExitOk;
using harness::kRankExitDeadlock;
using harness::kRankExitError;

static_assert(World::kViolationsMax == harness::kViolationsMax, "the world keeps as many violations as a report holds");

namespace {

using Clock = std::chrono::steady_clock;

void publish_totals(const World& world, const RankMachine& machine) { world.totals(machine.rank()) = machine.totals(); }

// Layers every rank has ended, over batches (RankPosition::layers_done): the progress bar's count.
std::int64_t layers_done(const World& world) {
  std::int64_t done = INT64_MAX;
  for (std::int32_t r = 0; r < world.geometry().cp; ++r) done = std::min(done, world.position(r).layers_done.load(std::memory_order_relaxed));
  return done;
}

void collect(const World& world, RunReport& report) {
  for (std::int32_t r = 0; r < world.geometry().cp; ++r) harness::add_rank(report, world.totals(r));
  report.violations = world.violations();
  report.violation_count = world.violation_count();
  for (std::int32_t i = 1; i <= harness::kInvariants; ++i) report.violations_by_invariant[i] = world.violation_count(i);
}

}  // namespace

WorldGeometry world_geometry(const BatchSource& source, const harness::RunOptions& options, const SourceShape& shape) {
  WorldGeometry geometry = geometry_for(source.setting, options.layers, shape.slot_count_max, shape.current_pages_max);
  geometry.pool_pages_touched = shape.pool_pages_touched;
  return geometry;
}

std::optional<Schedule> named_schedule(std::string_view name, std::uint64_t seed) {
  if (name == "random") return Schedule{ScheduleKind::random, {}, seed};
  if (name == "round-robin") return Schedule{ScheduleKind::round_robin, {}, seed};
  return std::nullopt;
}

Schedule read_schedule_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(fmt::format("{}: cannot open the schedule file", path));
  Schedule schedule;
  schedule.kind = ScheduleKind::list;
  std::string word;
  std::int64_t position = 0;
  while (in >> word) {
    ++position;
    std::size_t used = 0;
    unsigned long value = 0;
    try {
      value = std::stoul(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size() || word[0] == '-') {
      throw std::runtime_error(fmt::format("{}: choice {}: '{}' is not a non-negative integer", path, position, word));
    }
    schedule.choices.push_back(static_cast<std::uint32_t>(value));
  }
  if (schedule.choices.empty()) throw std::runtime_error(fmt::format("{}: no choices in the schedule file (use --schedule round-robin for none)", path));
  return schedule;
}

std::string describe_positions(const World& world) {
  std::string out;
  static constexpr const char* kStates[] = {"idle", "running", "finished", "failed", "raised_overflow"};
  for (std::int32_t r = 0; r < world.geometry().cp; ++r) {
    const RankPosition& pos = world.position(r);
    const auto state = pos.state.load();
    out += fmt::format("{}rank {}: {} at batch {} layer {} step {} ({}), barrier phase {}", out.empty() ? "" : "; ", r,
                       kStates[std::clamp(state, 0, 4)], pos.batch.load(), pos.layer.load(), pos.step.load(),
                       to_string(static_cast<Op>(pos.op.load())), pos.phase.load());
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Scheduled runs: every rank is a step machine in this process.

namespace {

class Scheduler {
 public:
  explicit Scheduler(const Schedule& schedule) : schedule_(schedule), rng_(schedule.seed) {}
  std::size_t pick(std::size_t runnable_count) {
    if (schedule_.kind == ScheduleKind::list && next_choice_ < schedule_.choices.size()) {
      return schedule_.choices[next_choice_++] % runnable_count;
    }
    if (schedule_.kind == ScheduleKind::random) return std::uniform_int_distribution<std::size_t>(0, runnable_count - 1)(rng_);
    return rotation_++ % runnable_count;
  }

 private:
  const Schedule& schedule_;
  std::mt19937_64 rng_;
  std::size_t next_choice_ = 0;
  std::size_t rotation_ = 0;
};

// What a scheduled run records as it steps (recording.hpp): the event log's line before each step;
// after it the step's span on its rank's track (a wait spans from the rank's previous step to its
// pass) and every new violation or mismatch as an instant at the step clock.
class ScheduledRecorder {
 public:
  ScheduledRecorder(const Recording& recording, const World& world, std::int32_t cp)
      : log_(recording.event_log_path), world_(world), ready_since_(cp, 0), behind_(cp), mismatches_(cp, 0) {
    if (recording.timeline_path.empty()) return;
    for (std::int32_t r = 0; r < cp; ++r) tracks_.emplace_back(recording, r, fmt::format("rank {}", r));
    tracks_.emplace_back(recording, cp, "group (no one rank)");
  }
  void before(const RankMachine& m) {
    if (log_.on()) log_.add(fmt::format("{} {}", m.rank(), to_string(*m.next_step())));
  }
  void after(const RankMachine& m, const Step& s, std::int64_t batch, std::uint64_t at) {
    if (tracks_.empty()) return;
    const std::int32_t r = m.rank();
    const std::uint64_t begin = is_wait(s.op) ? ready_since_[r] : at;
    tracks_[r].span(s, batch, m.half(s.layer), static_cast<std::int64_t>(begin), static_cast<std::int64_t>(at + 1), behind_[r],
                    world_.position(r).phase.load(std::memory_order_relaxed));
    ready_since_[r] = at + 1;
    behind_[r] = m.finished() ? std::string() : peers_behind(world_, r, m.next_step()->op);
    if (m.totals().mismatches > mismatches_[r]) {
      mismatches_[r] = m.totals().mismatches;
      tracks_[r].mismatch(batch, s.layer, m.totals().first_mismatch, static_cast<std::int64_t>(at));
    }
    findings(at);
  }
  // Violations recorded since the last look, each on its rank's track (or the group's).
  // Only the kept ones (World::kViolationsMax) are copied, and only while some are unseen.
  void findings(std::uint64_t at) {
    if (tracks_.empty() || seen_ >= World::kViolationsMax || world_.violation_count() == seen_) return;
    const std::vector<Violation> kept = world_.whole_violations();
    for (std::size_t i = static_cast<std::size_t>(seen_); i < kept.size(); ++i) {
      const std::int32_t r = kept[i].rank;
      TimelineTrack& track = r >= 0 && r < static_cast<std::int32_t>(tracks_.size()) - 1 ? tracks_[r] : tracks_.back();
      track.violation(kept[i], static_cast<std::int64_t>(at));
    }
    seen_ = static_cast<std::int64_t>(kept.size());
  }

 private:
  LineAppender log_;
  const World& world_;
  std::vector<TimelineTrack> tracks_;  // one per rank, then the group's
  std::vector<std::uint64_t> ready_since_;
  std::vector<std::string> behind_;  // at the wait a rank stands before: the peers it waits on
  std::vector<std::int64_t> mismatches_;
  std::int64_t seen_ = 0;
};

// Steps the machines until all finished; false (and a report) on deadlock or the step limit.
// steps: the steps taken so far in the run, over every rank (the report sums the ranks' own at the end).
bool run_until_finished(std::vector<RankMachine>& machines, Scheduler& scheduler, const World& world, const RunLimits& limits,
                        std::uint64_t& steps, RunReport& report, ScheduledRecorder& recorder, std::int64_t& progress_shown) {
  std::vector<std::size_t> runnable;
  while (true) {
    runnable.clear();
    bool all_finished = true;
    for (std::size_t r = 0; r < machines.size(); ++r) {
      if (!machines[r].finished()) all_finished = false;
      if (machines[r].runnable()) runnable.push_back(r);
    }
    if (all_finished) return true;
    if (runnable.empty()) {
      std::string positions;
      for (const RankMachine& m : machines) positions += (positions.empty() ? "" : "; ") + m.describe_position();
      report.deadlock = true;
      report.failure = fmt::format("deadlock: no rank can step: {}", positions);
      Violation v;
      v.invariant = 8;
      v.set_detail(fmt::format("deadlock after {} steps", steps));
      world.record(v);
      recorder.findings(steps);
      return false;
    }
    if (steps >= limits.steps_max) {
      report.failure = fmt::format("step limit {} reached", limits.steps_max);
      return false;
    }
    if (steps % 256 == 0 && harness::stop_requested() != 0) {  // a front end's stop (harness/interrupt.hpp)
      report.failure = fmt::format("stopped: interrupted (signal {})", harness::stop_requested());
      return false;
    }
    RankMachine& chosen = machines[runnable[scheduler.pick(runnable.size())]];
    recorder.before(chosen);
    const Step step = *chosen.next_step();
    const std::int64_t batch = chosen.batch_index();
    chosen.step();
    recorder.after(chosen, step, batch, steps);
    ++steps;
    if (limits.on_progress) {
      const std::int64_t done = layers_done(world);  // cp relaxed loads: nothing beside a step
      if (done != progress_shown) limits.on_progress(progress_shown = done);
    }
  }
}

}  // namespace

RunReport run_scheduled(const BatchSource& source, const harness::RunOptions& options, const Schedule& schedule, const RunLimits& limits,
                        const Recording& recording) {
  RunReport report;
  report.variant = options.variant;
  report.mode = kScheduledMode;
  const SourceShape shape = measure(source);
  World world(world_geometry(source, options, shape), options.seed);
  std::vector<RankMachine> machines;
  for (std::int32_t r = 0; r < source.setting.cp; ++r) machines.emplace_back(world, source.setting, options, r);
  Scheduler scheduler(schedule);
  ScheduledRecorder recorder(recording, world, source.setting.cp);
  for (RankMachine& m : machines) m.begin_run();
  std::uint64_t steps = 0;
  std::int64_t progress_shown = 0;  // what on_progress was last told: it hears each change, once
  bool ok = run_until_finished(machines, scheduler, world, limits, steps, report, recorder, progress_shown);
  BatchCursor cursor(source);
  while (ok) {
    std::optional<model::Batch> batch = cursor.next();
    if (!batch) break;
    for (RankMachine& m : machines) m.begin_batch(*batch, cursor.index());
    ok = run_until_finished(machines, scheduler, world, limits, steps, report, recorder, progress_shown);
    ++report.batches;
  }
  if (ok) on_quiescence(world);
  recorder.findings(steps);
  check_unchanged(source);  // results of a file replaced under its name describe another file
  for (const RankMachine& m : machines) publish_totals(world, m);
  collect(world, report);
  CPKV_ASSERT(report.steps == steps);  // every step the scheduler took is one rank's
  return report;
}

// ---------------------------------------------------------------------------------------------
// Free-running: ranks as processes or threads.

namespace {

enum RankExit : int { kRankOk = kRankExitOk, kRankDeadlock = kRankExitDeadlock, kRankError = kRankExitError };
// A thread rank that left its wait because a peer thread had already stopped (threads only: rank
// processes are ended by the launcher). Not a finding of its own: the peer's is the report.
constexpr int kRankLeftForAStoppedPeer = 100;

// The rank a waiting rank waits for: the first peer whose arrival counter of the kind it waits at
// is behind its own (it has arrived; they have not), or kWaitingOnPeers if none is (yet).
std::int32_t waited_on(const World& world, std::int32_t rank, Op op) {
  Counter& (World::*counter)(std::int32_t) const = nullptr;
  if (op == Op::wait) counter = &World::barrier_counter;
  if (op == Op::coll_wait) counter = &World::collective_counter;
  if (op == Op::batch_wait) counter = &World::batch_counter;
  if (counter == nullptr) return harness::kWaitingOnPeers;
  const std::uint64_t own = (world.*counter)(rank).value.load();
  for (std::int32_t p = 0; p < world.geometry().cp; ++p) {
    if ((world.*counter)(p).value.load() < own) return p;
  }
  return harness::kWaitingOnPeers;
}

// A rank's wait ran past its bound: invariant 8 at the rank, its batch, layer and step.
void record_wait_limit(const World& world, const RankMachine& machine, const RunLimits& limits) {
  const std::int32_t rank = machine.rank();
  Violation v;
  v.invariant = 8;
  v.rank = rank;
  v.batch = world.position(rank).batch.load();
  v.layer = machine.next_step()->layer;
  v.step = static_cast<std::int64_t>(machine.steps_taken());
  v.set_detail(fmt::format("waited {} ms: {}", limits.wait_ms_max, machine.describe_position()));
  world.record(v);
  world.position(rank).state.store(static_cast<std::int32_t>(RankState::failed));
}

// One free-running rank's timeline track (recording.hpp): wall-clock spans (monotonic
// microseconds; a wait from when the rank blocked to its pass, naming the peers behind then), the
// violations this rank recorded and the mismatches it found as instants. Its lines are written
// whenever the rank blocks (a hang, or a peer's death after which the launcher kills this rank,
// leaves everything before the wait on disk: a rank killed from outside gets no chance to flush),
// before the rank kills itself (the crash fault) and when it returns. Findings are
// written at once (TimelineTrack::instant). A write at every block is kept on purpose: it costs a
// write(2) per wait only when a timeline is asked for, and buffering past a block lost the
// survivors' last steps whenever a peer died.
class FreeRecorder {
 public:
  FreeRecorder(const Recording& recording, const World& world, std::int32_t rank)
      : track_(recording, rank, fmt::format("rank {}", rank)), world_(world), rank_(rank) {}
  static std::int64_t now_us(Clock::time_point t = Clock::now()) {
    return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
  }
  void waiting(const RankMachine& machine) {
    if (!track_.on()) return;
    behind_ = peers_behind(world_, rank_, machine.next_step()->op);
    track_.flush();
  }
  // Writes the buffered lines (a failed write throws, naming the file).
  void flush() { track_.flush(); }
  // Runs the machine's next step, and records it.
  void run_step(RankMachine& machine, Clock::time_point wait_start) {
    if (!track_.on()) return machine.step();
    const Step step = *machine.next_step();
    const std::int64_t batch = world_.position(rank_).batch.load(std::memory_order_relaxed);
    const std::int64_t begin = now_us(is_wait(step.op) ? wait_start : Clock::now());
    machine.step();
    const std::int64_t end = now_us();
    track_.span(step, batch, machine.half(step.layer), begin, end, behind_, world_.position(rank_).phase.load(std::memory_order_relaxed));
    behind_.clear();
    if (machine.totals().mismatches > mismatches_) {
      mismatches_ = machine.totals().mismatches;
      track_.mismatch(batch, step.layer, machine.totals().first_mismatch, end);
    }
    findings();
  }
  // The violations recorded since the last look that name this rank.
  // (Only whole slots: one another rank is still writing waits for the next look.)
  void findings() {
    if (!track_.on() || seen_ >= World::kViolationsMax || world_.violation_count() == seen_) return;
    const std::vector<Violation> kept = world_.whole_violations();
    for (std::size_t i = static_cast<std::size_t>(seen_); i < kept.size(); ++i) {
      if (kept[i].rank == rank_) track_.violation(kept[i], now_us());
    }
    seen_ = static_cast<std::int64_t>(kept.size());
  }

 private:
  TimelineTrack track_;
  const World& world_;
  std::int32_t rank_;
  std::string behind_;
  std::int64_t mismatches_ = 0;
  std::int64_t seen_ = 0;
};

// The body of one free-running rank. Returns its exit code. `progress` is the launcher's record of
// this rank (processes only): every step beats it, every wait says on whom.
// `peers_stopped` (threads): set once a peer thread stopped; a wait then ends at once instead of
// running into its own bound while the peer it waits for is gone.
int free_rank(const World& world, const BatchSource& source, const harness::RunOptions& options, const FaultOptions& faults,
              const RunLimits& limits, const Recording& recording, std::int32_t rank, harness::RankProgress* progress,
              const std::atomic<bool>* peers_stopped = nullptr) {
  RankMachine machine(world, source.setting, options, rank);
  FreeRecorder recorder(recording, world, rank);
  FaultInjector injector(world, faults, rank, source.setting.cp, options.layers);
  const auto run_program = [&]() -> int {
    while (!machine.finished()) {
      if (harness::stop_requested() != 0) return kRankLeftForAStoppedPeer;  // a front end's stop: the run is abandoned
      if (faults.kill_rank == rank && machine.steps_taken() >= faults.kill_after_steps) {
        recorder.flush();  // the crash leaves every step before it on the timeline
        ::kill(::getpid(), SIGKILL);
      }
      const Clock::time_point wait_start = Clock::now();
      std::uint32_t spins = 0;
      if (!machine.runnable()) recorder.waiting(machine);
      if (progress != nullptr && !machine.runnable()) {
        const Step& waits_at = *machine.next_step();
        progress->at(world.position(rank).batch.load(std::memory_order_relaxed), waits_at.layer);
        progress->step(to_string(waits_at.op));
        progress->wait_on(waited_on(world, rank, waits_at.op));
      }
      while (!machine.runnable()) {
        if (++spins > 64) injector.between_polls();
        if (spins % 64 == 0 && ((peers_stopped != nullptr && peers_stopped->load(std::memory_order_relaxed)) || harness::stop_requested() != 0)) {
          return kRankLeftForAStoppedPeer;
        }
        if (spins % 1024 == 0 && Clock::now() - wait_start > std::chrono::milliseconds(limits.wait_ms_max)) {
          record_wait_limit(world, machine, limits);
          return kRankDeadlock;
        }
      }
      const Step& s = *machine.next_step();
      if (progress != nullptr) {
        if (progress->waiting_on() != harness::kNotWaiting) progress->done_waiting();
        progress->at(world.position(rank).batch.load(std::memory_order_relaxed), s.layer);
        progress->step(to_string(s.op));
      }
      // Fault points: seeded delays and yields that widen the windows a protocol bug needs.
      injector.before(s, world.position(rank).batch.load());
      recorder.run_step(machine, wait_start);
    }
    return kRankOk;
  };
  machine.begin_run();
  int status = run_program();
  BatchCursor cursor(source);
  while (status == kRankOk) {
    std::optional<model::Batch> batch = cursor.next();
    if (!batch) break;
    machine.begin_batch(*batch, cursor.index());
    status = run_program();
    publish_totals(world, machine);
  }
  publish_totals(world, machine);
  recorder.findings();  // a wait that ran past its bound
  return status;
}

// Free-running ranks as threads of this process: each rank's waits are bounded, so every thread ends.
void run_rank_threads(const World& world, const BatchSource& source, const harness::RunOptions& options, const FaultOptions& faults,
                      const RunLimits& limits, const Recording& recording, RunReport& report) {
  const std::int32_t cp = source.setting.cp;
  std::vector<int> status(cp, kRankOk);
  std::vector<std::string> errors(cp);
  std::atomic<std::int32_t> finished{0};
  std::atomic<bool> stopped{false};  // a thread ended other than normally: its peers' waits end too
  std::vector<std::thread> threads;
  for (std::int32_t r = 0; r < cp; ++r) {
    threads.emplace_back([&, r] {
      try {
        status[r] = free_rank(world, source, options, faults, limits, recording, r, nullptr, &stopped);
      } catch (const std::exception& e) {
        status[r] = kRankError;
        errors[r] = e.what();
      }
      if (status[r] != kRankOk) stopped.store(true);
      finished.fetch_add(1);
    });
  }
  // Meanwhile report progress.
  for (std::int64_t tick = 0; finished.load() < cp; ++tick) {
    if (limits.on_progress && tick % 50 == 0) limits.on_progress(layers_done(world));
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  for (std::thread& t : threads) t.join();
  for (std::int32_t r = 0; r < cp && report.failure.empty(); ++r) {
    if (status[r] == kRankDeadlock) report.deadlock = true;
    if (status[r] != kRankOk && status[r] != kRankLeftForAStoppedPeer) {
      report.failure = fmt::format("rank {} stopped ({}{}): {}", r, status[r] == kRankDeadlock ? "wait limit" : "error",
                                   errors[r].empty() ? "" : ": " + errors[r], describe_positions(world));
    }
  }
}

// Free-running ranks as processes, through the harness's launcher (death, no progress, run limit).
// Returns the violations the ranks recorded themselves (the watchdog's comes after them).
std::int64_t run_rank_processes(const World& world, const BatchSource& source, const harness::RunOptions& options, const FaultOptions& faults,
                                const RunLimits& limits, const Recording& recording, RunReport& report) {
  harness::LaunchOptions launch;
  launch.ranks = source.setting.cp;
  launch.run_ms_max = limits.run_ms_max;
  launch.stuck_ms_max = limits.stuck_ms_max > 0 ? limits.stuck_ms_max : 2 * limits.wait_ms_max;
  launch.positions = [&] { return describe_positions(world); };
  launch.on_tick = [&] {
    if (limits.on_progress) limits.on_progress(layers_done(world));
  };
  const harness::LaunchResult launched = harness::launch_ranks(launch, [&](std::int32_t r, harness::RankProgress& progress) {
    return free_rank(world, source, options, faults, limits, recording, r, &progress);
  });
  report.failure = launched.failure;
  report.deadlock = launched.deadlock;
  const std::int64_t by_ranks = world.violation_count();
  // The launcher's watchdog may end a stuck group before any rank's own wait bound trips (on a
  // loaded machine a spinning rank checks its clock late): that is the same liveness failure.
  if (launched.stuck) {
    Violation v;
    v.invariant = 8;
    v.rank = launched.culprit;
    v.batch = launched.culprit_batch;  // where the culprit was, not "batch -1 layer -1"
    v.layer = launched.culprit_layer;
    v.set_detail(launched.failure);
    world.record(v);
  }
  return by_ranks;
}

// The violations no rank's own track showed (the watchdog's, quiescence's), on the group's track.
void record_group_findings(const World& world, const Recording& recording, std::int64_t from) {
  TimelineTrack group(recording, world.geometry().cp, "group (no one rank)");
  if (!group.on()) return;
  const std::vector<Violation> kept = world.violations();
  const std::int64_t now = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch()).count();
  for (std::size_t i = static_cast<std::size_t>(from); i < kept.size(); ++i) group.violation(kept[i], now);
}

}  // namespace

RunReport run_free(const BatchSource& source, const harness::RunOptions& options, RanksAs ranks_as, const FaultOptions& faults,
                   const RunLimits& limits, const Recording& recording) {
  RunReport report;
  report.variant = options.variant;
  report.mode = mode_name(ranks_as);
  if (ranks_as == RanksAs::threads && faults.kill_rank >= 0) {
    // A thread's SIGKILL takes the whole process, launcher included: nothing would be reported.
    throw std::invalid_argument("FaultOptions.kill_rank needs ranks as processes: in thread mode it would kill the launcher");
  }
  const SourceShape shape = measure(source);
  report.batches = shape.batches;
  World world(world_geometry(source, options, shape), options.seed);
  std::int64_t by_ranks = 0;
  if (ranks_as == RanksAs::threads) {
    run_rank_threads(world, source, options, faults, limits, recording, report);
    by_ranks = world.violation_count();
  } else {
    by_ranks = run_rank_processes(world, source, options, faults, limits, recording, report);
  }
  // A trace changed during the run is one line for the whole group, not a failure per rank (their
  // cursors stop on it too; launch.cpp leaves the telling to this check).
  check_unchanged(source);
  if (report.failure.empty()) on_quiescence(world);
  record_group_findings(world, recording, by_ranks);
  collect(world, report);
  return report;
}

}  // namespace cpkv::sim

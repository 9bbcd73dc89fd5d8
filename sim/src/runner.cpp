#include "cpkv/sim/runner.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "cpkv/model/content.hpp"
#include "cpkv/traces/trace.hpp"
#include "fault_injector.hpp"

namespace cpkv::sim {

namespace {

using Clock = std::chrono::steady_clock;

WorldGeometry geometry_of(const BatchSource& source, const SimOptions& options, const SourceShape& shape) {
  return geometry_for(source.setting, options.layers, shape.slot_count_max, shape.current_pages_max);
}

void publish_totals(const World& world, const RankMachine& machine) {
  SharedTotals& out = world.totals(machine.rank());
  const RankTotals& t = machine.totals();
  out.batches = t.batches;
  out.layers = t.layers;
  out.barriers = t.barriers;
  out.collectives = t.collectives;
  out.overflows = t.overflows;
  out.mismatches = t.mismatches;
  out.bytes_gathered_from_peers = t.bytes_gathered_from_peers;
  out.bytes_reduced = t.bytes_reduced;
  out.steps = machine.steps_taken();
  std::snprintf(out.first_mismatch, sizeof(out.first_mismatch), "%s", t.first_mismatch.c_str());
}

// Batches every rank has finished (each rank publishes its totals after every batch).
std::int64_t batches_done(const World& world) {
  std::int64_t done = INT64_MAX;
  for (std::int32_t r = 0; r < world.geometry().cp; ++r) done = std::min(done, world.totals(r).batches);
  return done;
}

void collect(const World& world, RunReport& report) {
  for (std::int32_t r = 0; r < world.geometry().cp; ++r) report.ranks.push_back(world.totals(r));
  report.violations = world.violations();
  report.violation_count = world.violation_count();
  for (std::int32_t i = 1; i <= 8; ++i) report.violations_by_invariant[i] = world.violation_count(i);
}

// Checker at quiescence (invariant 4): every rank arrived at every barrier and collective the same
// number of times, so the flags are drained.
void check_drained(const World& world) {
  const std::int32_t cp = world.geometry().cp;
  for (std::int32_t p = 1; p < cp; ++p) {
    const auto a = world.barrier_counter(0).value.load();
    const auto b = world.barrier_counter(p).value.load();
    const auto ca = world.collective_counter(0).value.load();
    const auto cb = world.collective_counter(p).value.load();
    if (a == b && ca == cb) continue;
    Violation v;
    v.invariant = 4;
    v.rank = p;
    std::snprintf(v.detail, sizeof(v.detail), "flags not drained at quiescence: rank 0 arrived %llu barriers / %llu collectives, rank %d %llu / %llu",
                  static_cast<unsigned long long>(a), static_cast<unsigned long long>(ca), p, static_cast<unsigned long long>(b),
                  static_cast<unsigned long long>(cb));
    world.record(v);
    return;
  }
}

}  // namespace

BatchCursor::BatchCursor(const BatchSource& source) : source_(source) {
  if (!source.trace_path.empty()) reader_ = std::make_unique<traces::TraceReader>(source.trace_path);
}
BatchCursor::~BatchCursor() = default;

std::optional<model::Batch> BatchCursor::next() {
  while (true) {
    std::optional<model::Batch> batch;
    if (reader_) {
      batch = reader_->next();
      index_ = reader_->batch_index();
    } else if (static_cast<std::size_t>(index_ + 1) < source_.batches.size()) {
      ++index_;
      batch = source_.batches[index_];
    }
    if (!batch) return std::nullopt;
    if (!source_.only_batch || *source_.only_batch == index_) return batch;
  }
}

std::int64_t RunReport::mismatches() const {
  std::int64_t sum = 0;
  for (const SharedTotals& t : ranks) sum += t.mismatches;
  return sum;
}

BatchSource BatchSource::from_trace(const std::string& path, std::optional<std::int64_t> only_batch) {
  BatchSource source;
  source.trace_path = path;
  source.only_batch = only_batch;
  traces::TraceReader reader(path);
  source.setting = reader.header().setting;
  return source;
}

BatchSource BatchSource::from_batches(model::Setting setting, std::vector<model::Batch> batches) {
  BatchSource source;
  source.setting = std::move(setting);
  source.batches = std::move(batches);
  return source;
}

SourceShape measure(const BatchSource& source) {
  SourceShape shape;
  BatchCursor cursor(source);
  while (auto batch = cursor.next()) {
    ++shape.batches;
    const model::BatchLayout layout = model::layout_batch(source.setting, *batch);
    shape.slot_count_max = std::max(shape.slot_count_max, layout.slot_count);
    shape.current_pages_max = std::max(shape.current_pages_max, layout.current_pages_total);
  }
  return shape;
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

void abandon_ranks(std::vector<int>& pids, std::int32_t failed_rank, int error_number) {
  for (int& pid : pids) {
    if (pid <= 0) continue;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    pid = -1;
  }
  throw std::runtime_error(fmt::format("fork for rank {} failed: {}", failed_rank, std::strerror(error_number)));
}

ReapResult reap_ranks(std::vector<int>& pids, std::int64_t run_ms_max, const std::function<std::string()>& positions,
                      const std::function<void()>& on_tick) {
  ReapResult result;
  const Clock::time_point start = Clock::now();
  Clock::time_point last_tick = start;
  auto alive = static_cast<std::int32_t>(std::count_if(pids.begin(), pids.end(), [](int pid) { return pid > 0; }));
  const auto kill_all = [&] {
    for (int other : pids) {
      if (other > 0) ::kill(other, SIGKILL);
    }
  };
  bool limit_reported = false;
  while (alive > 0) {
    int raw = 0;
    const pid_t pid = ::waitpid(-1, &raw, WNOHANG);
    if (pid > 0) {
      const auto it = std::find(pids.begin(), pids.end(), pid);
      if (it == pids.end()) continue;
      const auto r = static_cast<std::int32_t>(it - pids.begin());
      *it = -1;
      --alive;
      const bool clean = WIFEXITED(raw) && WEXITSTATUS(raw) == kRankExitOk;
      if (!clean && result.failure.empty()) {
        if (WIFSIGNALED(raw)) {
          result.failure = fmt::format("rank {} (pid {}) died from signal {}: {}", r, pid, WTERMSIG(raw), positions());
        } else {
          result.deadlock = WEXITSTATUS(raw) == kRankExitDeadlock;
          result.failure = fmt::format("rank {} (pid {}) exited with status {}: {}", r, pid, WEXITSTATUS(raw), positions());
        }
        kill_all();
      }
      continue;
    }
    if (!limit_reported && Clock::now() - start > std::chrono::milliseconds(run_ms_max)) {
      limit_reported = true;
      if (result.failure.empty()) result.failure = fmt::format("run limit {} ms reached: {}", run_ms_max, positions());
      kill_all();
    }
    if (on_tick && Clock::now() - last_tick > std::chrono::milliseconds(100)) {
      last_tick = Clock::now();
      on_tick();
    }
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  return result;
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

std::string describe(const Violation& v) {
  static constexpr const char* kNames[] = {"?",
                                           "page-writer exclusivity",
                                           "parity-half reuse safety",
                                           "overflow determinism",
                                           "barrier phase safety",
                                           "plan invariance",
                                           "byte exactness",
                                           "capability agreement",
                                           "liveness"};
  return fmt::format("invariant {} ({}): rank {} batch {} layer {} slot {} step {}: {}", v.invariant,
                     kNames[std::clamp(v.invariant, 0, 8)], v.rank, v.batch, v.layer, v.slot, v.step, v.detail);
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

// Steps the machines until all finished; false (and a report) on deadlock or the step limit.
bool run_until_finished(std::vector<RankMachine>& machines, Scheduler& scheduler, const World& world, const RunLimits& limits,
                        RunReport& report, bool record_events) {
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
      std::snprintf(v.detail, sizeof(v.detail), "deadlock after %llu steps", static_cast<unsigned long long>(report.steps));
      world.record(v);
      return false;
    }
    if (report.steps >= limits.steps_max) {
      report.failure = fmt::format("step limit {} reached", limits.steps_max);
      return false;
    }
    RankMachine& chosen = machines[runnable[scheduler.pick(runnable.size())]];
    if (record_events) {
      const Step& s = *chosen.next_step();
      report.event_log.push_back(fmt::format("{} {} {} {} {} {}", chosen.rank(), to_string(s.op), s.layer, s.a, s.b, s.c));
    }
    chosen.step();
    ++report.steps;
  }
}

}  // namespace

RunReport run_scheduled(const BatchSource& source, const SimOptions& options, const Schedule& schedule, const RunLimits& limits,
                        bool record_events) {
  RunReport report;
  report.variant = options.variant;
  report.mode = "scheduled";
  const SourceShape shape = measure(source);
  World world(geometry_of(source, options, shape), options.seed);
  std::vector<RankMachine> machines;
  for (std::int32_t r = 0; r < source.setting.cp; ++r) machines.emplace_back(world, source.setting, options, r);
  Scheduler scheduler(schedule);
  for (RankMachine& m : machines) m.begin_run();
  bool ok = run_until_finished(machines, scheduler, world, limits, report, record_events);
  BatchCursor cursor(source);
  while (ok) {
    std::optional<model::Batch> batch = cursor.next();
    if (!batch) break;
    for (RankMachine& m : machines) m.begin_batch(*batch, cursor.index());
    ok = run_until_finished(machines, scheduler, world, limits, report, record_events);
    ++report.batches;
    if (limits.on_progress) limits.on_progress(report.batches);
  }
  if (ok) check_drained(world);
  for (const RankMachine& m : machines) publish_totals(world, m);
  collect(world, report);
  return report;
}

// ---------------------------------------------------------------------------------------------
// Free-running: ranks as processes or threads.

namespace {

enum RankExit : int { kRankOk = kRankExitOk, kRankDeadlock = kRankExitDeadlock, kRankError = kRankExitError };

// The body of one free-running rank. Returns its exit code.
int free_rank(const World& world, const BatchSource& source, const SimOptions& options, const FaultOptions& faults,
              const RunLimits& limits, std::int32_t rank) {
  RankMachine machine(world, source.setting, options, rank);
  FaultInjector injector(world, faults, rank, source.setting.cp, options.layers);
  const auto run_program = [&]() -> int {
    while (!machine.finished()) {
      if (faults.kill_rank == rank && machine.steps_taken() >= faults.kill_after_steps) ::kill(::getpid(), SIGKILL);
      const Clock::time_point wait_start = Clock::now();
      std::uint32_t spins = 0;
      while (!machine.runnable()) {
        if (++spins > 64) injector.between_polls();
        if (spins % 1024 == 0 && Clock::now() - wait_start > std::chrono::milliseconds(limits.wait_ms_max)) {
          Violation v;
          v.invariant = 8;
          v.rank = rank;
          v.step = static_cast<std::int64_t>(machine.steps_taken());
          std::snprintf(v.detail, sizeof(v.detail), "waited %lld ms: %s", static_cast<long long>(limits.wait_ms_max),
                        machine.describe_position().c_str());
          world.record(v);
          world.position(rank).state.store(static_cast<std::int32_t>(RankState::failed));
          return kRankDeadlock;
        }
      }
      // Fault points: seeded delays and yields that widen the windows a protocol bug needs.
      injector.before(*machine.next_step(), world.position(rank).batch.load());
      machine.step();
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
  return status;
}

}  // namespace

RunReport run_free(const BatchSource& source, const SimOptions& options, RanksAs ranks_as, const FaultOptions& faults,
                   const RunLimits& limits) {
  RunReport report;
  report.variant = options.variant;
  report.mode = ranks_as == RanksAs::processes ? "processes" : "threads";
  if (ranks_as == RanksAs::threads && faults.kill_rank >= 0) {
    // A thread's SIGKILL takes the whole process, launcher included: nothing would be reported.
    throw std::invalid_argument("FaultOptions.kill_rank needs ranks as processes: in thread mode it would kill the launcher");
  }
  const SourceShape shape = measure(source);
  report.batches = shape.batches;
  World world(geometry_of(source, options, shape), options.seed);
  const std::int32_t cp = source.setting.cp;

  if (ranks_as == RanksAs::threads) {
    std::vector<int> status(cp, kRankOk);
    std::vector<std::string> errors(cp);
    std::atomic<std::int32_t> finished{0};
    std::vector<std::thread> threads;
    for (std::int32_t r = 0; r < cp; ++r) {
      threads.emplace_back([&, r] {
        try {
          status[r] = free_rank(world, source, options, faults, limits, r);
        } catch (const std::exception& e) {
          status[r] = kRankError;
          errors[r] = e.what();
        }
        finished.fetch_add(1);
      });
    }
    // Each rank's waits are bounded, so every thread ends; meanwhile report progress.
    for (std::int64_t tick = 0; finished.load() < cp; ++tick) {
      if (limits.on_progress && tick % 50 == 0) limits.on_progress(batches_done(world));
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    for (std::thread& t : threads) t.join();
    for (std::int32_t r = 0; r < cp && report.failure.empty(); ++r) {
      if (status[r] == kRankDeadlock) report.deadlock = true;
      if (status[r] != kRankOk) {
        report.failure = fmt::format("rank {} stopped ({}{}): {}", r, status[r] == kRankDeadlock ? "wait limit" : "error",
                                     errors[r].empty() ? "" : ": " + errors[r], describe_positions(world));
      }
    }
  } else {
    std::fflush(nullptr);
    std::vector<int> children(cp, -1);
    for (std::int32_t r = 0; r < cp; ++r) {
      const pid_t pid = ::fork();
      if (pid < 0) abandon_ranks(children, r, errno);
      if (pid == 0) {
        int code = kRankError;
        try {
          code = free_rank(world, source, options, faults, limits, r);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "cpkv: rank %d: %s\n", r, e.what());
        }
        std::fflush(nullptr);
        ::_exit(code);  // never run the parent's destructors (they own the shared region)
      }
      children[r] = pid;
    }
    const ReapResult reaped = reap_ranks(children, limits.run_ms_max, [&] { return describe_positions(world); }, [&] {
      if (limits.on_progress) limits.on_progress(batches_done(world));
    });
    report.failure = reaped.failure;
    report.deadlock = reaped.deadlock;
  }
  if (report.failure.empty()) check_drained(world);
  collect(world, report);
  for (const SharedTotals& t : report.ranks) report.steps += t.steps;
  return report;
}

}  // namespace cpkv::sim

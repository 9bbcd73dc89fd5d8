// Free-running ranks as processes (and threads) when things go wrong: a rank process that dies
// mid-run is reported by rank and signal and the run ends; a group that deadlocks is reported with
// every rank's position within the wait bound instead of hanging; and no run, clean or not, leaves
// a shared-memory name behind, while a name left by a process that died without cleaning up is
// swept by the next run.
//
// One seed (kSeed) drives content and the injected delays.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cpkv/model/batch.hpp"
#include "cpkv/model/plan.hpp"
#include "cpkv/model/setting.hpp"
#include "cpkv/sim/mutant.hpp"
#include "cpkv/sim/runner.hpp"
#include "cpkv/harness/shared_region.hpp"

namespace cpkv::sim {

// Harness names this file uses unqualified (sim's headers do not re-export them).
using harness::RunReport;
using harness::BatchSource;
using harness::Violation;
using harness::Mutant;
using harness::region_exists;
using harness::SharedRegion;
using harness::sweep_stale_regions;
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kSeed = 1;

std::string tiny_trace() { return std::string(CPKV_SOURCE_DIR) + "/traces/samples/tiny.jsonl"; }

// Every /dev/shm name this process created ("cpkv.<pid>.<serial>") and has not removed.
std::vector<std::string> own_region_names() {
  const std::string prefix = "cpkv." + std::to_string(::getpid()) + ".";
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0) names.push_back(name);
  }
  return names;
}

// Bounds for runs that end by a rank's death: the launcher sees the death (waitpid) and stops the
// others, whatever the waits' bound, so the bounds only assert liveness. They are generous: a 300 ms
// wait bound once fired on a healthy rank whose peer a loaded 2-core machine had not yet scheduled,
// and the run then ended as a deadlock before the death it was meant to show (issue 35, item 9).
RunLimits failing_run_limits() {
  RunLimits limits;
  limits.wait_ms_max = 20'000;
  limits.run_ms_max = 120'000;
  return limits;
}

// Bounds for runs that end by a real deadlock (no rank can ever move): the wait bound is what
// reports it, so it is as short as the test's time allows while a healthy rank's wait, on a loaded
// machine, stays far inside it (the ranks are forked, not exec'd, and each wait is for steps of
// microseconds).
RunLimits deadlock_run_limits() {
  RunLimits limits;
  limits.wait_ms_max = 5'000;
  limits.run_ms_max = 120'000;
  return limits;
}

FaultOptions seeded_faults() {
  FaultOptions faults;
  faults.seed = kSeed;
  return faults;
}

harness::RunOptions staging_direct(std::int32_t layers) {
  harness::RunOptions options;
  options.variant = model::Variant::staging_direct;
  options.layers = layers;
  options.seed = kSeed;
  return options;
}

std::int64_t elapsed_ms(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

// cp 4 and a single one-page request: only rank 0 writes a current page, so under skip_idle_barrier
// ranks 1-3 never arrive at the barrier rank 0 waits at.
BatchSource one_writer_of_four() {
  model::Setting setting;
  setting.cp = 4;
  setting.page_size = 4;
  setting.kinds = {*model::find_buffer_kind("kv_fp8")};
  setting.layer_pattern = "S";
  setting.pool_pages = 64;
  return BatchSource::from_batches(setting, {model::Batch{{model::Request{.prefix_len = 0, .extend_len = 3, .prefix_pages = {}}}}});
}

void expect_every_rank_position(const std::string& failure, std::int32_t cp) {
  for (std::int32_t r = 0; r < cp; ++r) EXPECT_NE(failure.find("rank " + std::to_string(r) + ": "), std::string::npos) << failure;
}

// One rank's entry in a report's position list ("rank R: STATE at batch B layer L step S (OP), ...").
std::string position_of(const std::string& failure, std::int32_t rank) {
  const std::size_t begin = failure.find("rank " + std::to_string(rank) + ": ");
  if (begin == std::string::npos) return "";
  return failure.substr(begin, failure.find(';', begin) - begin);
}

// ---------------------------------------------------------------------------------------------

// A GPU process can crash mid-exchange. Its peers then wait for an arrival that never comes; the
// launcher must notice the dead rank, name it and the signal, stop the others, end the run, and
// still remove the shared memory (a leaked name survives the process on tmpfs until reboot).
TEST(SimProcess, KilledRankIsReportedAndTheRunEndsWithoutLeavingSharedMemory) {
  constexpr std::int32_t kKilledRank = 1;
  FaultOptions faults = seeded_faults();
  faults.kill_rank = kKilledRank;
  faults.kill_after_steps = 12;  // inside batch 0's first layer (probe and path choice take 4 steps)
  const RunLimits limits = failing_run_limits();
  const Clock::time_point start = Clock::now();
  const RunReport report = run_free(BatchSource::from_trace(tiny_trace()), staging_direct(2), RanksAs::processes, faults, limits);

  EXPECT_LT(elapsed_ms(start), limits.run_ms_max);
  EXPECT_FALSE(report.passed());
  EXPECT_NE(report.failure.find("rank " + std::to_string(kKilledRank) + " "), std::string::npos) << report.failure;
  EXPECT_NE(report.failure.find("signal " + std::to_string(SIGKILL)), std::string::npos) << report.failure;
  expect_every_rank_position(report.failure, 2);
  // Both ranks were mid-batch when rank 1 died: neither may be described as finished.
  EXPECT_EQ(report.failure.find("finished"), std::string::npos) << report.failure;
  EXPECT_EQ(own_region_names(), std::vector<std::string>{});
}

// The same crash at every point of a short run (before, inside and after the exchange): it is
// always reported and never hangs or leaks, wherever the rank dies.
TEST(SimProcess, KilledRankIsReportedWhereverItDies) {
  const BatchSource source = BatchSource::from_trace(tiny_trace());
  const RunLimits limits = failing_run_limits();
  for (std::uint64_t steps : {0, 3, 20, 40, 60}) {
    FaultOptions faults = seeded_faults();
    faults.kill_rank = 0;
    faults.kill_after_steps = steps;
    const Clock::time_point start = Clock::now();
    const RunReport report = run_free(source, staging_direct(2), RanksAs::processes, faults, limits);
    EXPECT_LT(elapsed_ms(start), limits.run_ms_max) << "killed after " << steps << " steps";
    EXPECT_NE(report.failure.find("rank 0 "), std::string::npos) << "killed after " << steps << " steps: " << report.failure;
    EXPECT_NE(report.failure.find("signal " + std::to_string(SIGKILL)), std::string::npos) << report.failure;
  }
  EXPECT_EQ(own_region_names(), std::vector<std::string>{});
}

// In thread mode a rank's SIGKILL would kill the launcher with it and nothing would be reported, so
// the crash fault is refused there rather than taking the test run down.
TEST(SimProcess, KillingARankIsRefusedInThreadMode) {
  FaultOptions faults = seeded_faults();
  faults.kill_rank = 0;
  EXPECT_THROW(run_free(BatchSource::from_trace(tiny_trace()), staging_direct(2), RanksAs::threads, faults, failing_run_limits()),
               std::invalid_argument);
  EXPECT_EQ(own_region_names(), std::vector<std::string>{});
}

// A clean run also removes its name: the check above would be vacuous if no run ever created one.
TEST(SimProcess, CleanRunRemovesItsSharedMemory) {
  const RunReport report = run_free(BatchSource::from_trace(tiny_trace()), staging_direct(2), RanksAs::processes, seeded_faults(), RunLimits{});
  EXPECT_TRUE(report.passed()) << report.failure;
  EXPECT_EQ(own_region_names(), std::vector<std::string>{});
  const SharedRegion live = SharedRegion::create(4096);
  EXPECT_EQ(own_region_names(), std::vector<std::string>{live.name()});
}

// A process that dies without running destructors (a crash, SIGKILL, or a child's _exit) leaves its
// region's name on tmpfs. The sweep at the next start must remove it, and only it: a region whose
// creator is alive is in use.
TEST(SimProcess, SweepRemovesARegionWhoseCreatorIsDeadAndKeepsALiveOne) {
  const SharedRegion live = SharedRegion::create(4096);
  std::array<int, 2> pipe_fds{};
  ASSERT_EQ(::pipe(pipe_fds.data()), 0) << std::strerror(errno);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0) << std::strerror(errno);
  if (child == 0) {
    // The child creates a region and leaves with _exit while it is still in scope: no destructor
    // removes its name.
    try {
      const SharedRegion orphan = SharedRegion::create(4096);
      const std::string& name = orphan.name();
      ::_exit(::write(pipe_fds[1], name.data(), name.size()) == static_cast<ssize_t>(name.size()) ? 0 : 1);
    } catch (...) {
      ::_exit(2);
    }
  }
  ::close(pipe_fds[1]);
  std::array<char, 256> buffer{};
  const ssize_t got = ::read(pipe_fds[0], buffer.data(), buffer.size() - 1);
  ::close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_GT(got, 0);
  const std::string orphan_name(buffer.data(), static_cast<std::size_t>(got));

  EXPECT_EQ(orphan_name.rfind("cpkv." + std::to_string(child) + ".", 0), 0U) << orphan_name;
  ASSERT_TRUE(region_exists(orphan_name)) << "the child's _exit should have left " << orphan_name << " behind";
  EXPECT_GE(sweep_stale_regions(), 1);
  EXPECT_FALSE(region_exists(orphan_name));
  EXPECT_TRUE(region_exists(live.name()));
}

// Invariant 8 in free-running mode: a protocol bug that leaves a rank waiting forever must end as a
// reported deadlock naming every rank's position, within the wait bound, never as a hung test.
TEST(SimProcess, DeadlockedProcessesAreReportedWithEveryRankPosition) {
  harness::RunOptions options = staging_direct(1);
  options.mutant = Mutant::skip_idle_barrier;
  const RunLimits limits = deadlock_run_limits();
  const Clock::time_point start = Clock::now();
  const RunReport report = run_free(one_writer_of_four(), options, RanksAs::processes, seeded_faults(), limits);

  EXPECT_LT(elapsed_ms(start), limits.run_ms_max);
  EXPECT_TRUE(report.deadlock) << report.failure;
  EXPECT_FALSE(report.passed());
  expect_every_rank_position(report.failure, 4);
  // The position is where each rank is stuck: rank 0 at the protocol barrier it waits at, the idle
  // ranks at the batch barrier after the layer they skipped through.
  const std::string rank0 = position_of(report.failure, 0);
  EXPECT_NE(rank0.find("batch 0 layer 0 step"), std::string::npos) << report.failure;
  EXPECT_NE(rank0.find("(wait)"), std::string::npos) << report.failure;
  EXPECT_NE(position_of(report.failure, 1).find("(batch_wait)"), std::string::npos) << report.failure;
  EXPECT_TRUE(std::ranges::any_of(report.violations, [](const Violation& v) { return v.invariant == 8; }));
  EXPECT_EQ(own_region_names(), std::vector<std::string>{});

  // The same setup without the mutant passes: the deadlock is the bug's, not the harness's (under
  // the default bounds: a pass must not depend on how soon a loaded machine schedules a peer).
  options.mutant = Mutant::none;
  EXPECT_TRUE(run_free(one_writer_of_four(), options, RanksAs::processes, seeded_faults(), RunLimits{}).passed());
}

// Thread mode bounds its waits the same way: every join returns and the deadlock is reported.
TEST(SimProcess, DeadlockedThreadsAreReportedWithEveryRankPosition) {
  harness::RunOptions options = staging_direct(1);
  options.mutant = Mutant::skip_idle_barrier;
  const RunLimits limits = deadlock_run_limits();
  const Clock::time_point start = Clock::now();
  const RunReport report = run_free(one_writer_of_four(), options, RanksAs::threads, seeded_faults(), limits);

  EXPECT_LT(elapsed_ms(start), limits.run_ms_max);
  EXPECT_TRUE(report.deadlock) << report.failure;
  expect_every_rank_position(report.failure, 4);
  EXPECT_EQ(own_region_names(), std::vector<std::string>{});
}

}  // namespace
}  // namespace cpkv::sim

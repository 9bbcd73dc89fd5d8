// launch_ranks on its own (no simulator, no GPU): a rank that stops making progress is named by
// the watchdog within stuck_ms_max, whether it is stopped by a signal or hung outside any wait; a
// group where every rank waits is a deadlock with no one blamed; a dead rank is reported by signal;
// and every way out leaves no rank process behind.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "cpkv/harness/launch.hpp"
#include "cpkv/harness/run.hpp"

namespace cpkv::harness {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::int64_t kStuckMsMax = 1000;  // above a fork and first beat on a loaded 2-core CI machine
constexpr std::int64_t kSlackMs = 3000;  // a loaded 2-core machine

std::int64_t ms_since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

LaunchOptions options(std::int32_t ranks) {
  LaunchOptions o;
  o.ranks = ranks;
  o.run_ms_max = 20000;
  o.stuck_ms_max = kStuckMsMax;
  return o;
}

// Rank 0 works and then waits on rank 1 forever; rank 1 does `fault` after a few beats.
template <typename Fault>
LaunchResult one_faulty_rank(Fault fault) {
  return launch_ranks(options(2), [&](std::int32_t rank, RankProgress& progress) {
    progress.at(0, 0);
    progress.step(rank == 0 ? "gather" : "fill");
    if (rank == 1) fault(progress);
    const Waiting waiting(progress, 1);
    while (true) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return kRankExitOk;
  });
}

bool no_child_left() {
  return ::waitpid(-1, nullptr, WNOHANG) < 0 && errno == ECHILD;
}

TEST(Harness, ARankStoppedBySignalIsNamedWithinTheWindow) {
  const Clock::time_point start = Clock::now();
  const LaunchResult r = one_faulty_rank([](RankProgress&) { ::raise(SIGSTOP); });
  EXPECT_LT(ms_since(start), kStuckMsMax + kSlackMs);
  EXPECT_TRUE(r.stuck);
  EXPECT_EQ(r.culprit, 1) << r.failure;
  EXPECT_NE(r.failure.find("rank 1 (pid"), std::string::npos) << r.failure;
  EXPECT_NE(r.failure.find("stopped by SIGSTOP"), std::string::npos) << r.failure;
  EXPECT_NE(r.failure.find("rank 0 (pid"), std::string::npos) << r.failure;  // every rank's position
  EXPECT_NE(r.failure.find("waiting for rank 1"), std::string::npos) << r.failure;
  EXPECT_TRUE(no_child_left());
}

TEST(Harness, ARankHungOutsideAnyWaitIsNamed) {
  const LaunchResult r = one_faulty_rank([](RankProgress&) {
    std::atomic<std::uint64_t> spins{0};
    while (true) spins.fetch_add(1, std::memory_order_relaxed);  // busy, never beating nor waiting: a hang in host code
  });
  EXPECT_TRUE(r.stuck);
  EXPECT_EQ(r.culprit, 1) << r.failure;
  EXPECT_NE(r.failure.find("rank 1 (pid"), std::string::npos) << r.failure;
  EXPECT_NE(r.failure.find("step 'fill'"), std::string::npos) << r.failure;
  EXPECT_TRUE(no_child_left());
}

TEST(Harness, EveryRankWaitingIsADeadlockThatBlamesNoOne) {
  const LaunchResult r = launch_ranks(options(3), [](std::int32_t rank, RankProgress& progress) {
    progress.at(2, 1);
    const Waiting waiting(progress, (rank + 1) % 3);
    while (true) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return kRankExitOk;
  });
  EXPECT_TRUE(r.deadlock);
  EXPECT_EQ(r.culprit, -1) << r.failure;
  EXPECT_NE(r.failure.find("every rank is waiting"), std::string::npos) << r.failure;
  EXPECT_TRUE(no_child_left());
}

TEST(Harness, ADeadRankIsReportedBySignalAndEndsTheRun) {
  const LaunchResult r = one_faulty_rank([](RankProgress&) { ::raise(SIGKILL); });
  EXPECT_FALSE(r.stuck);
  EXPECT_EQ(r.culprit, 1);
  EXPECT_NE(r.failure.find("rank 1 (pid"), std::string::npos) << r.failure;
  EXPECT_NE(r.failure.find("died from signal 9"), std::string::npos) << r.failure;
  EXPECT_TRUE(no_child_left());
}

// A slow but live group is not stuck: ranks that beat more often than the window are left alone.
TEST(Harness, RanksThatKeepMakingProgressAreNeverStopped) {
  const LaunchResult r = launch_ranks(options(2), [](std::int32_t, RankProgress& progress) {
    for (int i = 0; i < 10; ++i) {
      progress.at(0, i);
      std::this_thread::sleep_for(std::chrono::milliseconds(kStuckMsMax / 3));
    }
    return kRankExitOk;
  });
  EXPECT_TRUE(r.failure.empty()) << r.failure;
  EXPECT_TRUE(no_child_left());
}

// A step declared quiet (NCCL communicator setup) may be silent past the window, up to what it
// declared; the same silence without the declaration is a stuck group.
TEST(Harness, AQuietStepMaySilenceTheGroupUpToWhatItDeclared) {
  const auto silent_for = [](std::int64_t quiet_ms_max) {
    return launch_ranks(options(2), [=](std::int32_t, RankProgress& progress) {
      const Quiet quiet(progress.record(), quiet_ms_max);
      std::this_thread::sleep_for(std::chrono::milliseconds(3 * kStuckMsMax));
      progress.beat();
      return kRankExitOk;
    });
  };
  EXPECT_TRUE(silent_for(10 * kStuckMsMax).failure.empty());
  EXPECT_TRUE(silent_for(0).stuck);
  EXPECT_TRUE(no_child_left());
}

// The one Totals every backend reports: mismatches add up and the first description is kept (cut
// to the field, never overrunning it); a report's steps are the sum of its ranks' (add_rank).
TEST(HarnessTotals, MismatchesAddUpKeepingTheFirstDescriptionAndAReportSumsItsRanksSteps) {
  Totals t;
  t.add_mismatches(0, "");
  EXPECT_EQ(t.first_mismatch[0], '\0');
  t.add_mismatches(2, "kind 0 slot 3 row 1 byte 7");
  t.add_mismatches(1, "kind 1 slot 0");
  EXPECT_EQ(t.mismatches, 3);
  EXPECT_STREQ(t.first_mismatch, "kind 0 slot 3 row 1 byte 7");
  Totals long_one;
  long_one.add_mismatches(1, std::string(1000, 'x'));
  EXPECT_EQ(std::string(long_one.first_mismatch), std::string(sizeof(long_one.first_mismatch) - 1, 'x'));
  RunReport report;
  t.steps = 5;
  long_one.steps = 7;
  add_rank(report, t);
  add_rank(report, long_one);
  EXPECT_EQ(report.steps, 12u);
  ASSERT_EQ(report.ranks.size(), 2u);
  EXPECT_EQ(report.mismatches(), 4);
}

}  // namespace
}  // namespace cpkv::harness

// The launcher's no-progress window has a floor (issue 25 item 3). A verdict of "protocol violated"
// (a deadlock, invariant 8) must not come from scheduling jitter: with the smallest window the CLI
// accepts (--stuck-ms-max 1), a correct run once ended as a deadlock whenever a rank waited a few
// milliseconds for a CPU. Silence shorter than the floor is not a hang.
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "cpkv/harness/launch.hpp"

namespace cpkv::harness {
namespace {

// Rank 1 is silent 20 ms outside any wait (as a rank the scheduler left without a CPU would be)
// while rank 0 has finished; a 1 ms window must not call that a hang. (It once ended the run:
// "made no progress for 2 ms ... window 1 ms".)
TEST(LaunchFloor, SilenceShorterThanTheFloorIsNotAHangWhateverTheWindowAsked) {
  LaunchOptions o;
  o.ranks = 2;
  o.run_ms_max = 20000;
  o.stuck_ms_max = 1;
  const LaunchResult r = launch_ranks(o, [](std::int32_t rank, RankProgress& progress) {
    progress.at(0, 0);
    progress.step("fill");
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return kRankExitOk;
  });
  EXPECT_FALSE(r.stuck) << r.failure;
  EXPECT_EQ(r.failure, "");
}

}  // namespace
}  // namespace cpkv::harness

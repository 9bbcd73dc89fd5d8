// harness::run_probe, the one fork beside launch_ranks: an answer comes back whole, a child that
// hangs is killed within the limit and reaped (nothing left running), and one that dies is named.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include <gtest/gtest.h>

#include "cpkv/harness/probe.hpp"

namespace cpkv::harness {
namespace {

struct Answer {
  int pid = 0;
  double value = 0;
};

TEST(HarnessProbe, AnAnswerComesBackWholeFromAnotherProcess) {
  Answer answer;
  const ProbeOutcome outcome = run_probe<Answer>([](Answer& a) { a = {::getpid(), 2.5}; }, answer, std::chrono::seconds(10));
  ASSERT_TRUE(outcome.answered) << outcome.failure;
  EXPECT_NE(answer.pid, ::getpid());  // it ran in a child
  EXPECT_EQ(answer.value, 2.5);
}

TEST(HarnessProbe, AHungChildIsKilledAtTheLimitAndReaped) {
  Answer answer;
  const auto start = std::chrono::steady_clock::now();
  const ProbeOutcome outcome = run_probe<Answer>([](Answer& a) {
    a.pid = ::getpid();
    std::this_thread::sleep_for(std::chrono::seconds(60));
  }, answer, std::chrono::milliseconds(200));
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_FALSE(outcome.answered);
  EXPECT_NE(outcome.failure.find("gave no answer in 200 ms"), std::string::npos) << outcome.failure;
  EXPECT_LT(waited, std::chrono::seconds(10));
}

TEST(HarnessProbe, AChildThatDiesIsReportedAsDeadNotAsAnAnswer) {
  Answer answer{-1, -1};
  const ProbeOutcome outcome = run_probe<Answer>([](Answer&) { std::abort(); }, answer, std::chrono::seconds(10));
  EXPECT_FALSE(outcome.answered);
  EXPECT_NE(outcome.failure.find("died before answering"), std::string::npos) << outcome.failure;
  EXPECT_EQ(answer.pid, -1);
}

}  // namespace
}  // namespace cpkv::harness

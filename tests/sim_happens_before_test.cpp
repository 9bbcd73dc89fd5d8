// Happens-before over the simulator's event log (sim/happens_before.hpp; invariant 2, PROTOCOL.md
// section 6): a read of a staging half concurrent with a write to it is reported whatever the
// interleaving a schedule happened to take, and the correct protocol is never flagged.
//
// Why it matters: the state checker judges the one interleaving that ran, so a wrong-half zeroing
// whose write came after every read of the half passes it. Vector clocks judge the order the
// barriers impose, which no schedule can make lucky. The expectations come from the protocol: a
// write to a half and a read of it on layers of the same parity are separated by barrier passes;
// with one half (single_half), or with a zero of the other half, they are not.
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cpkv/sim/happens_before.hpp"
#include "cpkv/sim/runner.hpp"
#include "recording_helpers.hpp"

namespace cpkv::sim {
namespace {

using harness::BatchSource;
using harness::Mutant;

// Six schedules of the random scheduler (the "6 of 6 seeds"); a scheduled run has no delays.
constexpr std::uint64_t kSeeds[] = {1, 2, 3, 4, 5, 6};

std::string tiny() { return std::string(CPKV_SOURCE_DIR) + "/traces/samples/tiny.jsonl"; }

std::vector<std::string> scheduled_log(model::Variant variant, Mutant mutant, std::uint64_t seed) {
  harness::RunOptions options;
  options.variant = variant;
  options.layers = 2;
  options.seed = seed;
  options.mutant = mutant;
  std::vector<std::string> log;
  testing::scheduled_with_log(BatchSource::from_trace(tiny()), options, Schedule{ScheduleKind::random, {}, seed}, log);
  return log;
}

std::vector<std::string> judge(const std::vector<std::string>& log, std::int32_t halves = 2) {
  std::ostringstream text;
  for (const std::string& line : log) text << line << '\n';
  std::istringstream in(text.str());
  return judge_event_log(in, 2, halves);
}

bool all_invariant_2(const std::vector<std::string>& lines) {
  for (const std::string& line : lines) {
    if (line.rfind("invariant 2 (parity-half reuse safety): batch ", 0) != 0) return false;
  }
  return true;
}

// A correct run's log with every zero_own step moved to the other parity half (a seventh field):
// the wrong-half zeroing whose bytes are right when the schedule was lucky.
std::vector<std::string> zeroing_the_other_half(const std::vector<std::string>& log) {
  std::vector<std::string> out;
  for (const std::string& line : log) {
    std::istringstream in(line);
    std::string rank, op;
    std::int32_t layer = 0;
    in >> rank >> op >> layer;
    out.push_back(op == "zero_own" ? line + " " + std::to_string((layer + 1) % 2) : line);
  }
  return out;
}

TEST(SimHappensBefore, TheCorrectProtocolIsNeverFlagged) {
  for (const model::Variant variant : {model::Variant::staging_direct, model::Variant::staging_publish}) {
    for (const std::uint64_t seed : kSeeds) {
      const std::vector<std::string> log = scheduled_log(variant, Mutant::none, seed);
      ASSERT_FALSE(log.empty());
      EXPECT_EQ(judge(log), std::vector<std::string>{}) << model::to_string(variant) << " seed " << seed;
    }
  }
}

TEST(SimHappensBefore, SingleHalfIsCaughtOnEverySeed) {
  for (const std::uint64_t seed : kSeeds) {
    const std::vector<std::string> lines = judge(scheduled_log(model::Variant::staging_direct, Mutant::single_half, seed), 1);
    EXPECT_FALSE(lines.empty()) << "seed " << seed;
    EXPECT_TRUE(all_invariant_2(lines)) << lines.front();
  }
}

TEST(SimHappensBefore, ZeroingTheOtherHalfIsCaughtOnEverySeed) {
  for (const std::uint64_t seed : kSeeds) {
    const std::vector<std::string> lines = judge(zeroing_the_other_half(scheduled_log(model::Variant::staging_direct, Mutant::none, seed)));
    ASSERT_FALSE(lines.empty()) << "seed " << seed;
    EXPECT_TRUE(all_invariant_2(lines)) << lines.front();
    EXPECT_NE(lines.front().find("'s zero of its half"), std::string::npos) << lines.front();
  }
}

// The planted barrier bugs of the simulator, under the round-robin schedule and random ones alike.
TEST(SimHappensBefore, BarrierBugsAreCaughtWhateverTheSchedule) {
  for (const Mutant mutant : {Mutant::no_barrier, Mutant::arrive_before_fill}) {
    for (const std::uint64_t seed : kSeeds) {
      const std::vector<std::string> lines = judge(scheduled_log(model::Variant::staging_direct, mutant, seed));
      EXPECT_FALSE(lines.empty()) << harness::to_string(mutant) << " seed " << seed;
    }
  }
}

// The clocks alone: a read that ended long before the write, with no pass between them, still races;
// the same with a barrier phase both ranks arrive at and pass does not.
TEST(SimHappensBefore, OrderComesFromSynchronizationNotFromTime) {
  const std::vector<std::string> lucky = {"0 batch_begin -1 0 0 0", "1 batch_begin -1 0 0 0", "1 gather 0 0 5 2",
                                          "0 zero_own 0 5 0 0"};
  EXPECT_EQ(judge(lucky).size(), 1U);
  const std::vector<std::string> ordered = {"0 batch_begin -1 0 0 0", "1 batch_begin -1 0 0 0", "1 gather 0 0 5 2", "1 arrive 0 0 0 0",
                                            "0 arrive 0 0 0 0", "0 wait 0 0 0 0", "0 zero_own 0 5 0 0"};
  EXPECT_EQ(judge(ordered), std::vector<std::string>{});
}

TEST(SimHappensBefore, ABadLineIsNamed) {
  std::istringstream few("0 batch_begin -1 0 0 0\n0 fill 0 1\n");
  try {
    judge_event_log(few, 2);
    FAIL() << "a line of four fields was taken";
  } catch (const EventLogError& e) {
    EXPECT_NE(std::string(e.what()).find("event log line 2: 4 fields"), std::string::npos) << e.what();
  }
  std::istringstream rank("5 fill 0 1 0 0\n");
  EXPECT_THROW(judge_event_log(rank, 2), EventLogError);
  std::istringstream word("0 fill zero 1 0 0\n");
  EXPECT_THROW(judge_event_log(word, 2), EventLogError);
}

}  // namespace
}  // namespace cpkv::sim

// Swarm fault knobs of the free-running simulator (TigerBeetle's VOPR swarm): every knob is a
// function of the seed, each run prints them, and the two slow roles open the windows the planted
// concurrency bugs need however the ranks are scheduled: a slow reader holds its read epoch until a
// peer has rewritten a later layer (single_half must then be seen), a slow producer holds its fill
// until a peer has finished reading the layer (arrive_before_fill and no_barrier must then be seen).
// On the correct protocol the same holds end early or at their bound, and the run passes.
#include <chrono>
#include <cstdint>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "cpkv/sim/mutant.hpp"
#include "cpkv/sim/runner.hpp"

namespace cpkv::sim {

// Harness names this file uses unqualified (sim's headers do not re-export them).
using harness::RunReport;
using harness::BatchSource;
using harness::Mutant;
namespace {

using Clock = std::chrono::steady_clock;

std::string tiny_trace() { return std::string(CPKV_SOURCE_DIR) + "/traces/samples/tiny.jsonl"; }

harness::RunOptions staging_direct(std::uint64_t seed) {
  harness::RunOptions options;
  options.variant = model::Variant::staging_direct;
  options.layers = 2;  // tiny's "FS": layer 1 reuses nothing of layer 0 but its half under single_half
  options.seed = seed;
  return options;
}

// Bounds for a run that may deadlock under a planted bug: a hold's bound (1 s) fits many times.
RunLimits limits() {
  RunLimits l;
  l.wait_ms_max = 5000;
  l.run_ms_max = 60000;
  return l;
}

// One slow role only, on rank `slow` (fixed), with no random delays or yields. The bound (1 s by
// default) is far longer than a peer of tiny needs to reach the window on a loaded machine.
FaultOptions one_hold(std::uint64_t seed, bool reader, std::int32_t slow, std::int32_t bound_us = 1'000'000) {
  FaultOptions f;
  f.seed = seed;
  f.flag_write_delay_probability = 0.0;
  f.gather_delay_probability = 0.0;
  f.slow_rotation = SlowRotation::fixed;
  f.slow_producer_delay_us = reader ? 0 : bound_us;
  f.slow_reader_delay_us = reader ? bound_us : 0;
  f.slow_rank = reader ? slow - 1 : slow;  // the reader is the producer's rank + 1
  f.slow_reader_offset = 1;
  return f;
}

TEST(SimSwarm, KnobsAreAFunctionOfTheSeedAndDifferBetweenSeeds) {
  std::set<std::string> lines;
  std::set<std::int32_t> producer_bounds, reader_bounds, slow_ranks;
  std::set<int> rotations, yields, poll_sleeps;
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    const FaultOptions f = swarm_faults(seed);
    EXPECT_EQ(describe(f), describe(swarm_faults(seed))) << "seed " << seed;
    EXPECT_EQ(f.seed, seed);
    EXPECT_EQ(f.kill_rank, -1) << "the swarm never kills a rank";
    EXPECT_GT(f.slow_producer_delay_us, 0);
    EXPECT_GT(f.slow_reader_delay_us, 0);
    EXPECT_GE(f.slow_reader_offset, 1) << "the slow reader is never the slow producer";
    lines.insert(describe(f));
    producer_bounds.insert(f.slow_producer_delay_us);
    reader_bounds.insert(f.slow_reader_delay_us);
    slow_ranks.insert(f.slow_rank);
    rotations.insert(static_cast<int>(f.slow_rotation));
    yields.insert(static_cast<int>(f.yield_at));
    poll_sleeps.insert(f.wait_poll_sleep_us);
  }
  EXPECT_EQ(lines.size(), 40u) << "every seed draws its own mix";
  EXPECT_EQ(producer_bounds.size(), 3u);
  EXPECT_EQ(reader_bounds.size(), 3u);
  EXPECT_GE(slow_ranks.size(), 6u);
  EXPECT_EQ(rotations.size(), 3u);
  EXPECT_EQ(yields.size(), 5u);
  EXPECT_EQ(poll_sleeps.size(), 3u);
}

TEST(SimSwarm, DescribeNamesEveryKnob) {
  const std::string line = describe(swarm_faults(3));
  for (const char* knob : {"fault seed 3", "delay_us_max", "flag", "gather", "write", "slow producer hold", "reader hold", "rotation", "yield", "poll sleep"}) {
    EXPECT_NE(line.find(knob), std::string::npos) << knob << " missing from: " << line;
  }
}

// PROTOCOL.md section 6: with one half, a writer's next-layer zero and fill land in the half a slow
// peer still reads. The slow reader holds until a peer has done exactly that, so every seed sees it.
TEST(SimSwarm, SlowReaderCatchesSingleHalfOnEverySeed) {
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    for (std::int32_t reader = 0; reader < 2; ++reader) {
      harness::RunOptions options = staging_direct(seed);
      options.mutant = Mutant::single_half;
      const RunReport report = run_free(BatchSource::from_trace(tiny_trace()), options, RanksAs::processes, one_hold(seed, true, reader), limits());
      EXPECT_GT(report.violations_by_invariant[2], 0) << "seed " << seed << " reader " << reader << ": " << report.failure;
    }
  }
}

// Section 5 step 3: the barrier keeps peers from reading a page before its writer filled it. A slow
// producer holds its fill until a peer finished reading the layer: only a broken barrier lets one.
TEST(SimSwarm, SlowProducerCatchesArriveBeforeFillAndNoBarrier) {
  for (Mutant mutant : {Mutant::arrive_before_fill, Mutant::no_barrier}) {
    for (std::int32_t producer = 0; producer < 2; ++producer) {
      harness::RunOptions options = staging_direct(1);
      options.mutant = mutant;
      const RunReport report = run_free(BatchSource::from_trace(tiny_trace()), options, RanksAs::processes, one_hold(1, false, producer), limits());
      EXPECT_GT(report.violations_by_invariant[2], 0) << to_string(mutant) << " producer " << producer << ": " << report.failure;
    }
  }
}

// The correct protocol under the same holds: it passes, and the slow reader's hold ends when a peer
// waits at the next barrier, long before its bound (the producer's bound is paid in full: no peer
// can pass the barrier without its fill). The reader's bound is long (4 s, under the peers' 5 s
// wait bound) and the run must end before a single one of them could have run out: a hold that ran
// to its bound on both of tiny's batches takes 8 s or more, while the early end leaves all of the 4 s
// to a loaded machine's process start and scheduling.
TEST(SimSwarm, CorrectProtocolPassesUnderEitherHoldAndTheReaderHoldEndsEarly) {
  constexpr std::int32_t kReaderBoundUs = 4'000'000;
  ASSERT_LT(kReaderBoundUs / 1000, limits().wait_ms_max) << "a held reader must not look like a deadlock to its peers";
  for (bool reader : {true, false}) {
    const Clock::time_point start = Clock::now();
    // The producer's hold lasts its whole bound on every layer here: 50 ms keeps the test short.
    const FaultOptions faults = one_hold(1, reader, 1, reader ? kReaderBoundUs : 50'000);
    const RunReport report = run_free(BatchSource::from_trace(tiny_trace()), staging_direct(1), RanksAs::processes, faults, limits());
    const auto elapsed_ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
    EXPECT_TRUE(report.passed()) << (reader ? "reader" : "producer") << ": " << report.failure;
    // tiny has 3 batches (one rejected) of 2 layers; the reader holds at most on layer 0 of each.
    if (reader) {
      EXPECT_LT(elapsed_ms, kReaderBoundUs / 1000) << "the reader's hold ran to its bound";
    }
  }
}

// Every knob draw of the swarm leaves the correct protocol passing (no false alarm from a knob).
TEST(SimSwarm, CorrectProtocolPassesUnderSwarmKnobs) {
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    const RunReport report = run_free(BatchSource::from_trace(tiny_trace()), staging_direct(seed), RanksAs::processes, swarm_faults(seed), limits());
    EXPECT_TRUE(report.passed()) << describe(swarm_faults(seed)) << ": " << report.failure;
  }
}

}  // namespace
}  // namespace cpkv::sim

// Replay of the bundled traces on the rank simulator (PROTOCOL.md sections 4-9): every variant is
// byte-exact with zero invariant violations in every way of running the ranks (forked processes,
// threads, and the scheduled step machines under random and round-robin schedules); a scheduled
// run is a pure function of its seed; an overflowing batch is refused on every rank before anyone
// writes staging; the barrier flags drain; and a rank whose IPC probe fails takes the whole group
// to the fallback path.
//
// One seed (kSeed) drives every random choice here: content, schedules and injected delays.
#include <algorithm>
#include <filesystem>
#include <optional>
#include <utility>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cpkv/model/plan.hpp"
#include "cpkv/sim/runner.hpp"
#include "recording_helpers.hpp"

namespace cpkv::sim {

// Harness names this file uses unqualified (sim's headers do not re-export them).
using harness::RunReport;
using harness::BatchSource;
using harness::Violation;
using harness::Totals;
namespace {

constexpr std::uint64_t kSeed = 1;

std::string sample(const std::string& name) { return std::string(CPKV_SOURCE_DIR) + "/traces/samples/" + name; }

// The bundled traces and the layers each replays. The seeds-shaped batch (cp 8, 44.6K tokens) costs
// 2-5 s per variant and mode on 2 cores even at 2 layers (the dense buffers alone are ~1 GB of page
// faults per run), so it runs 2 layers: enough to use both parity halves once.
struct BundledTrace {
  const char* name;
  std::int32_t layers;
};
constexpr BundledTrace kTiny{"tiny.jsonl", 2};
constexpr BundledTrace kSeedsBatch{"seeds_batch.jsonl", 2};
// Two batches imported from the Mooncake sample (traces/README.md): scattered, shared prefix pages.
constexpr BundledTrace kMooncakeSlice{"mooncake_slice.jsonl", 2};

// The replay command's flags for the way a report's ranks ran (scheduled tests here use the seeded
// random schedule, except where a test says otherwise).
std::string run_flags(const RunReport& report) {
  return report.mode == "sim/scheduled" ? "--schedule random" : "--ranks-as " + report.mode.substr(report.mode.find('/') + 1);
}

// What a reader needs to see when a run fails: its verdict, failure, first violations, and the
// command line that replays it.
std::string explain(const RunReport& report, const std::string& trace, const harness::RunOptions& options,
                    const std::string& flags = "") {
  std::string out = "mode " + report.mode + " variant " + std::string(model::to_string(report.variant));
  if (!report.failure.empty()) out += "\n  failure: " + report.failure;
  for (const Violation& v : report.violations) out += "\n  " + describe(v);
  for (const Totals& t : report.ranks) {
    if (t.first_mismatch[0] != '\0') out += "\n  " + std::string(t.first_mismatch);
  }
  out += "\n  replay: cpkv replay " + trace + " --variant " + std::string(model::to_string(options.variant)) +
         " --seed " + std::to_string(options.seed) + " --layers " + std::to_string(options.layers) + " " + (flags.empty() ? run_flags(report) : flags);
  return out;
}

harness::RunOptions options_for(model::Variant variant, std::int32_t layers) {
  harness::RunOptions options;
  options.variant = variant;
  options.layers = layers;
  options.seed = kSeed;
  return options;
}

FaultOptions seeded_faults() {
  FaultOptions faults;
  faults.seed = kSeed;
  return faults;
}

void expect_exact(const RunReport& report, const std::string& trace, const harness::RunOptions& options, const std::string& flags = "") {
  EXPECT_TRUE(report.passed()) << explain(report, trace, options, flags);
  EXPECT_EQ(report.violation_count, 0) << explain(report, trace, options, flags);
  EXPECT_EQ(report.mismatches(), 0) << explain(report, trace, options, flags);
  EXPECT_FALSE(report.deadlock) << explain(report, trace, options, flags);
}

void replay_free(const BundledTrace& trace, RanksAs ranks_as, const std::vector<model::Variant>& variants) {
  const std::string path = sample(trace.name);
  const BatchSource source = BatchSource::from_trace(path);
  for (model::Variant variant : variants) {
    const harness::RunOptions options = options_for(variant, trace.layers);
    expect_exact(run_free(source, options, ranks_as, seeded_faults(), RunLimits{}), path, options);
  }
}

void replay_scheduled(const BundledTrace& trace, const Schedule& schedule, const std::vector<model::Variant>& variants) {
  const std::string path = sample(trace.name);
  const BatchSource source = BatchSource::from_trace(path);
  for (model::Variant variant : variants) {
    const harness::RunOptions options = options_for(variant, trace.layers);
    const std::string flags = schedule.kind == ScheduleKind::round_robin ? "--schedule round-robin" : "--schedule random";
    expect_exact(run_scheduled(source, options, schedule, RunLimits{}), path, options, flags);
  }
}

const std::vector<model::Variant> kEveryVariant(model::kAllVariants.begin(), model::kAllVariants.end());

Schedule random_schedule() {
  Schedule schedule;
  schedule.kind = ScheduleKind::random;
  schedule.seed = kSeed;
  return schedule;
}

Schedule round_robin_schedule() {
  Schedule schedule;
  schedule.kind = ScheduleKind::round_robin;
  return schedule;
}

// The per-rank totals of one rank, for tests that compare ranks.
std::vector<std::int64_t> overflows_by_rank(const RunReport& report) {
  std::vector<std::int64_t> out;
  for (const Totals& t : report.ranks) out.push_back(t.overflows);
  return out;
}

// ---------------------------------------------------------------------------------------------

// The replay tests below name every bundled trace; a trace added to traces/samples/ without a
// replay here would silently go unchecked.
TEST(SimReplay, EveryBundledTraceIsCoveredByTheseTests) {
  std::set<std::string> bundled;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(CPKV_SOURCE_DIR) + "/traces/samples")) {
    if (entry.path().extension() == ".jsonl") bundled.insert(entry.path().filename().string());
  }
  EXPECT_EQ(bundled, (std::set<std::string>{kTiny.name, kSeedsBatch.name, kMooncakeSlice.name}));
}

// The main job: every variant gives the model's dense buffers byte for byte, with no checker
// objecting, when the ranks are real processes sharing memory as GPUs share IPC memory.
TEST(SimReplay, TinyTraceEveryVariantIsExactInProcessMode) { replay_free(kTiny, RanksAs::processes, kEveryVariant); }

// The same rank code as threads (the mode ThreadSanitizer watches) must agree.
TEST(SimReplay, TinyTraceEveryVariantIsExactInThreadMode) { replay_free(kTiny, RanksAs::threads, kEveryVariant); }

// Under the scheduled runner the interleaving is chosen, not left to the OS: a random schedule and
// the opposite extreme, strict rotation, must both be exact.
TEST(SimReplay, TinyTraceEveryVariantIsExactUnderRandomSchedule) {
  replay_scheduled(kTiny, random_schedule(), kEveryVariant);
}
TEST(SimReplay, TinyTraceEveryVariantIsExactUnderRoundRobinSchedule) {
  replay_scheduled(kTiny, round_robin_schedule(), kEveryVariant);
}

// The seeds-shaped batch is the production scenario (cp 8, 12 requests, scattered prefix pages). Cost
// control, on 2 cores: process mode takes every variant (~25 s);
TEST(SimReplay, SeedsBatchEveryVariantIsExactInProcessMode) {
  replay_free(kSeedsBatch, RanksAs::processes, kEveryVariant);
}
// thread mode takes the four variants whose ranks read each other's memory directly (IPC gathers
// and barriers: v2, symm_dense, staging_publish, staging_direct, ~10 s), the ones where threads and
// processes could differ; the all-reduce-only variants exchange through the same shared-memory
// collective in both modes and are covered by process mode above and by tiny in thread mode;
TEST(SimReplay, SeedsBatchIpcVariantsAreExactInThreadMode) {
  replay_free(kSeedsBatch, RanksAs::threads,
              {model::Variant::v2, model::Variant::symm_dense, model::Variant::staging_publish, model::Variant::staging_direct});
}
// and the scheduled runner takes the target variant only (one thread runs all 8 ranks, ~3 s).
TEST(SimReplay, SeedsBatchStagingDirectIsExactUnderRandomSchedule) {
  replay_scheduled(kSeedsBatch, random_schedule(), {model::Variant::staging_direct});
}

// The imported Mooncake slice: real request lengths, prefix-cache hits on recycled pool pages and
// chunked prefill (a chunk's prefix is its own earlier chunks). Process mode, every variant (~10 s).
TEST(SimReplay, MooncakeSliceEveryVariantIsExactInProcessMode) {
  replay_free(kMooncakeSlice, RanksAs::processes, kEveryVariant);
}

// PROTOCOL.md section 12's token-split all-gathers on the production-shaped traces in the modes the
// tests above leave them out of (process mode: kEveryVariant above): threads and a random schedule.
const std::vector<model::Variant> kAllGatherVariants = {model::Variant::allgather_zigzag, model::Variant::allgather_continuous};
TEST(SimReplay, AllGatherVariantsAreExactOnSeedsBatchInThreadModeAndUnderRandomSchedule) {
  replay_free(kSeedsBatch, RanksAs::threads, kAllGatherVariants);
  replay_scheduled(kSeedsBatch, random_schedule(), kAllGatherVariants);
}
TEST(SimReplay, AllGatherVariantsAreExactOnMooncakeSliceInThreadModeAndUnderRandomSchedule) {
  replay_free(kMooncakeSlice, RanksAs::threads, kAllGatherVariants);
  replay_scheduled(kMooncakeSlice, random_schedule(), kAllGatherVariants);
}

// Section 12: no staging, so the overflow verdict rejects nothing; the batch runs the all-gather of
// every rank's padded rows. tiny's batch 2 (cp 2, no prefix): 16 tokens (8 and 8 under either
// split) and 13 (zigzag blocks of 4,3,3,3: 7 and 6; continuous: 7 and 6), so 15 and 14 tokens: every
// rank sends 15 rows (rank 1 one padding row) and receives its peer's 15 per kind: 15 x (788 B on the
// F layer + 656 B on the S layer) = 21660 B from the peer, padding counted.
TEST(SimReplay, AllGatherVariantsRunTheOverflowingBatchAndGatherPaddedRows) {
  const std::string path = sample(kTiny.name);
  const BatchSource overflowing = BatchSource::from_trace(path, /*only_batch=*/2);
  for (model::Variant variant : kAllGatherVariants) {
    const harness::RunOptions options = options_for(variant, kTiny.layers);
    for (const RunReport& report : {run_scheduled(overflowing, options, random_schedule(), RunLimits{}),
                                    run_free(overflowing, options, RanksAs::processes, seeded_faults(), RunLimits{})}) {
      expect_exact(report, path, options);
      ASSERT_EQ(report.ranks.size(), 2U);
      EXPECT_EQ(overflows_by_rank(report), (std::vector<std::int64_t>{0, 0})) << explain(report, path, options);
      for (const Totals& rank : report.ranks) {
        EXPECT_EQ(rank.layers, kTiny.layers) << explain(report, path, options);
        EXPECT_EQ(rank.barriers, 0) << explain(report, path, options);
        EXPECT_EQ(rank.bytes_gathered_from_peers, 21660U) << explain(report, path, options);
      }
    }
  }
}

// A scheduled run is a pure function of batch, variant and schedule: that is what makes a failing
// run replayable and shrinkable. The same seed must give the same event log, step for step, and a
// different seed a different interleaving (else the seed would not be steering anything).
TEST(SimReplay, SameSeedGivesTheSameEventLogAndAnotherSeedAnotherOne) {
  const BatchSource source = BatchSource::from_trace(sample(kTiny.name));
  const harness::RunOptions options = options_for(model::Variant::staging_direct, kTiny.layers);
  Schedule schedule = random_schedule();
  std::vector<std::string> first_log, second_log, other_log;
  const RunReport first = testing::scheduled_with_log(source, options, schedule, first_log);
  testing::scheduled_with_log(source, options, schedule, second_log);
  schedule.seed = kSeed + 1;
  const RunReport other = testing::scheduled_with_log(source, options, schedule, other_log);

  ASSERT_TRUE(first.passed());
  ASSERT_TRUE(other.passed());
  ASSERT_FALSE(first_log.empty());
  EXPECT_EQ(first_log.size(), first.steps);
  EXPECT_EQ(first_log, second_log);
  // Both interleavings run the same steps, only in another order.
  EXPECT_EQ(first_log.size(), other_log.size());
  EXPECT_NE(first_log, other_log);
}

// The replay progress bar's count: layers every rank has ended, over batches. A one-batch trace sat
// at 0/1 for the whole run while it counted batches (issue 25 item 4). Tiny batch 0 over 2 layers,
// then the whole trace (its batch 2 is rejected: it counts as its layers once every rank passed it):
// the count rises one layer at a time to batches x layers.
TEST(SimReplay, ProgressIsCountedPerLayer) {
  const harness::RunOptions options = options_for(model::Variant::staging_direct, kTiny.layers);
  for (const auto& [only_batch, total] : {std::pair<std::optional<std::int64_t>, std::int64_t>{0, 2}, {std::nullopt, 6}}) {
    std::vector<std::int64_t> seen;
    RunLimits limits;
    limits.on_progress = [&seen](std::int64_t layers_done) { seen.push_back(layers_done); };
    const BatchSource source = only_batch ? BatchSource::from_trace(sample(kTiny.name), *only_batch) : BatchSource::from_trace(sample(kTiny.name));
    ASSERT_TRUE(run_scheduled(source, options, random_schedule(), limits).passed());
    ASSERT_FALSE(seen.empty());
    EXPECT_EQ(seen.back(), total);
    EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
    std::vector<std::int64_t> one_layer_steps;
    for (std::size_t i = 0; i < seen.size(); ++i) {
      if (seen[i] - (i == 0 ? 0 : seen[i - 1]) == 1) one_layer_steps.push_back(seen[i]);
    }
    EXPECT_GE(one_layer_steps.size(), 2u) << "the count moves by single layers within a batch";
    EXPECT_NE(std::find(seen.begin(), seen.end(), 1), seen.end()) << "one layer of the first batch is shown before the batch ends";
  }
}

// Section 4: a batch with more current pages than staging slots (tiny batch 2: 8 > 6) fails fast on
// every rank alike, before any rank writes staging or waits at a protocol barrier; a rank that
// wrote or waited would corrupt a peer's half or hang the group.
TEST(SimReplay, OverflowingBatchIsRefusedOnEveryRankBeforeAnyStagingWrite) {
  const std::string path = sample(kTiny.name);
  const BatchSource overflowing = BatchSource::from_trace(path, /*only_batch=*/2);
  const harness::RunOptions options = options_for(model::Variant::staging_direct, kTiny.layers);
  std::vector<std::string> event_log;
  const RunReport report = testing::scheduled_with_log(overflowing, options, random_schedule(), event_log);

  expect_exact(report, path, options);
  ASSERT_EQ(report.ranks.size(), 2U);
  EXPECT_EQ(overflows_by_rank(report), (std::vector<std::int64_t>{1, 1}));
  for (const Totals& rank : report.ranks) {
    EXPECT_EQ(rank.batches, 1);
    EXPECT_EQ(rank.layers, 0);
    EXPECT_EQ(rank.barriers, 0);
    EXPECT_EQ(rank.bytes_gathered_from_peers, 0U);
  }
  // The event log ("rank op layer a b c") holds no step that touches staging or a protocol barrier.
  for (const std::string& event : event_log) {
    const std::string op = event.substr(event.find(' ') + 1, event.find(' ', event.find(' ') + 1) - event.find(' ') - 1);
    EXPECT_TRUE(op != "zero_own" && op != "fill" && op != "publish" && op != "gather" && op != "arrive" && op != "wait")
        << "an overflowing batch ran step: " << event;
  }

  // In the whole trace the overflow leaves the other batches' layers untouched: 2 batches x 2 layers.
  const RunReport whole = run_free(BatchSource::from_trace(path), options, RanksAs::processes, seeded_faults(), RunLimits{});
  expect_exact(whole, path, options);
  EXPECT_EQ(overflows_by_rank(whole), (std::vector<std::int64_t>{1, 1}));
  for (const Totals& rank : whole.ranks) EXPECT_EQ(rank.layers, 2 * kTiny.layers);
}

// Invariant 4: at quiescence every rank arrived at every barrier and collective equally often, so
// the flags are drained and the next batch (or run) starts clean. Checked for every variant, since
// each uses a different mix of barriers and collectives.
TEST(SimReplay, FlagsAreDrainedAtTheEndOfEveryVariant) {
  const std::string path = sample(kTiny.name);
  const BatchSource source = BatchSource::from_trace(path);
  for (model::Variant variant : model::kAllVariants) {
    const harness::RunOptions options = options_for(variant, kTiny.layers);
    const RunReport report = run_free(source, options, RanksAs::threads, seeded_faults(), RunLimits{});
    for (const Violation& v : report.violations) EXPECT_NE(v.invariant, 4) << explain(report, path, options);
    ASSERT_EQ(report.ranks.size(), 2U);
    EXPECT_EQ(report.ranks[0].barriers, report.ranks[1].barriers) << explain(report, path, options);
    EXPECT_EQ(report.ranks[0].collectives, report.ranks[1].collectives) << explain(report, path, options);
  }
}

// Section 7, capability agreement (invariant 7): when one rank cannot map its peers, the group
// agrees (a MIN) and every rank takes the fallback path; a rank falling back alone would leave
// collectives mismatched. Every rank then does no IPC gather and no protocol barrier, issues the
// fallback's all-reduces, and the output is still exact.
TEST(SimReplay, OneRankWithoutIpcTakesTheWholeGroupToTheFallback) {
  const std::string path = sample(kTiny.name);
  const BatchSource source = BatchSource::from_trace(path);
  for (model::Variant variant : {model::Variant::v2, model::Variant::symm_dense, model::Variant::staging_publish,
                                 model::Variant::staging_direct}) {
    harness::RunOptions options = options_for(variant, kTiny.layers);
    options.ipc_missing_rank = 1;
    for (const RunReport& report : {run_scheduled(source, options, random_schedule(), RunLimits{}),
                                    run_free(source, options, RanksAs::processes, seeded_faults(), RunLimits{})}) {
      expect_exact(report, path, options);
      ASSERT_EQ(report.ranks.size(), 2U);
      for (const Totals& rank : report.ranks) {
        EXPECT_EQ(rank.bytes_gathered_from_peers, 0U) << explain(report, path, options);
        EXPECT_EQ(rank.barriers, 0) << explain(report, path, options);
        EXPECT_GT(rank.collectives, 1) << "only the probe's collective: no fallback all-reduce ran; " << explain(report, path, options);
      }
      EXPECT_EQ(report.ranks[0].collectives, report.ranks[1].collectives);
    }
  }
}

}  // namespace
}  // namespace cpkv::sim

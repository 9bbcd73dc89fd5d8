// Planted bugs (PROTOCOL.md section 9): every mutant in harness::kAllMutants, switched on over a small
// hand-built batch and, where interleaving matters, a schedule chosen to open the bug's window,
// makes the run report the invariant that mutant breaks. The same setup with Mutant::none passes,
// so each test proves that the mutant, not the setup, is what the checkers catch.
//
// Every scheduled run is a pure function of the batch, the options and the schedule; kSeed drives
// content and the one random schedule used here.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cpkv/model/batch.hpp"
#include "cpkv/model/plan.hpp"
#include "cpkv/model/setting.hpp"
#include "cpkv/sim/mutant.hpp"
#include "cpkv/sim/runner.hpp"

namespace cpkv::sim {

// Harness names this file uses unqualified (sim's headers do not re-export them).
using harness::RunReport;
using harness::BatchSource;
using harness::Violation;
using harness::ExpectedBytesFrom;
using harness::Mutant;
namespace {

constexpr std::uint64_t kSeed = 1;
constexpr std::int32_t kLiveness = 8;

// A small group: cp ranks, pages of 4 tokens, kv_fp8 on every layer and indexer_k on the 'F' layer,
// two layers (so both parity halves are used once), a pool of 64 logical pages.
model::Setting small_setting(std::int32_t cp) {
  model::Setting setting;
  setting.cp = cp;
  setting.page_size = 4;
  setting.kinds = {*model::find_buffer_kind("kv_fp8"), *model::find_buffer_kind("indexer_k")};
  setting.layer_pattern = "FS";
  setting.pool_pages = 64;
  setting.split = model::SplitPolicy::zigzag;
  return setting;
}

model::Request fresh(std::int64_t extend_len) { return model::Request{.prefix_len = 0, .extend_len = extend_len, .prefix_pages = {}}; }

model::Request cached(std::vector<std::int64_t> prefix_pages, std::int64_t extend_len) {
  const auto prefix_len = static_cast<std::int64_t>(prefix_pages.size()) * 4;
  return model::Request{.prefix_len = prefix_len, .extend_len = extend_len, .prefix_pages = std::move(prefix_pages)};
}

// A schedule that always picks runnable[choice % runnable]: 0 lets the lowest-numbered runnable rank
// run ahead, cp - 1 the highest (for cp = 2).
Schedule priority_schedule(std::uint32_t choice) {
  Schedule schedule;
  schedule.kind = ScheduleKind::list;
  schedule.choices.assign(100'000, choice);
  return schedule;
}

Schedule round_robin() {
  Schedule schedule;
  schedule.kind = ScheduleKind::round_robin;
  return schedule;
}

// One mutant's counterexample: the batches, the options (mutant off), the schedule, and the
// invariants whose report counts as catching it (kLiveness also accepts report.deadlock).
struct MutantCase {
  Mutant mutant = Mutant::none;
  BatchSource source;
  harness::RunOptions options;
  Schedule schedule;
  std::vector<std::int32_t> caught_by;
};

RunReport run_case(const MutantCase& c, Mutant mutant) {
  harness::RunOptions options = c.options;
  options.mutant = mutant;
  return run_scheduled(c.source, options, c.schedule, RunLimits{});
}

bool reports_any(const RunReport& report, const std::vector<std::int32_t>& invariants) {
  const auto wanted = [&](std::int32_t invariant) { return std::ranges::find(invariants, invariant) != invariants.end(); };
  if (report.deadlock && wanted(kLiveness)) return true;
  return std::ranges::any_of(report.violations, [&](const Violation& v) { return wanted(v.invariant); });
}

std::string explain(const RunReport& report) {
  std::string out = "passed " + std::to_string(report.passed()) + ", deadlock " + std::to_string(report.deadlock);
  if (!report.failure.empty()) out += "\n  failure: " + report.failure;
  for (const Violation& v : report.violations) out += "\n  " + describe(v);
  return out;
}

std::string invariants_text(const std::vector<std::int32_t>& invariants) {
  std::string out;
  for (std::int32_t i : invariants) out += (out.empty() ? "" : " or ") + std::to_string(i);
  return out;
}

// The mutant, switched on, is reported as one of c.caught_by; switched off, the same run passes.
void expect_caught(const MutantCase& c) {
  const RunReport clean = run_case(c, Mutant::none);
  EXPECT_TRUE(clean.passed()) << "the setup itself fails, so it proves nothing about " << to_string(c.mutant) << ":\n" << explain(clean);
  const RunReport planted = run_case(c, c.mutant);
  EXPECT_FALSE(planted.passed()) << to_string(c.mutant) << " went unnoticed";
  EXPECT_TRUE(reports_any(planted, c.caught_by)) << to_string(c.mutant) << " should be reported as invariant "
                                                 << invariants_text(c.caught_by) << ", got:\n" << explain(planted);
}

MutantCase base_case(Mutant mutant, model::Setting setting, std::vector<model::Batch> batches, Schedule schedule,
                     std::vector<std::int32_t> caught_by) {
  MutantCase c;
  c.mutant = mutant;
  c.source = BatchSource::from_batches(std::move(setting), std::move(batches));
  c.options.variant = model::Variant::staging_direct;
  c.options.layers = 2;
  c.options.seed = kSeed;
  c.schedule = std::move(schedule);
  c.caught_by = std::move(caught_by);
  return c;
}

// ---------------------------------------------------------------------------------------------
// The counterexamples, one per mutant.

// cp 2, one request of 8 fresh tokens: each rank writes one current page on each layer. Rank 1
// (priority to the highest runnable rank) races ahead: after its layer-0 gather it zeroes and fills
// layer 1 into the half rank 0 has not yet read for layer 0.
MutantCase single_half_case() {
  return base_case(Mutant::single_half, small_setting(2), {model::Batch{{fresh(8)}}}, priority_schedule(1), {2});
}

// cp 2, the same batch; rank 0 runs ahead and, with no barrier, gathers rank 1's page before rank 1
// has filled it (it holds the previous epoch's poison, or zeros).
MutantCase no_barrier_case() {
  return base_case(Mutant::no_barrier, small_setting(2), {model::Batch{{fresh(8)}}}, priority_schedule(0), {2});
}

// cp 2, the same batch; rank 1 zeroes and arrives, rank 0 (priority) fills, passes the barrier on
// rank 1's early arrival and gathers rank 1's page while it is still only zeroed.
MutantCase arrive_before_fill_case() {
  return base_case(Mutant::arrive_before_fill, small_setting(2), {model::Batch{{fresh(8)}}}, priority_schedule(0), {2});
}

// cp 2, caps of 8 extend tokens and 1 request: staging_slots = 8/4 + 1 = 3. One request of 12 fresh
// tokens has 3 current pages (fits exactly); zigzag gives rank 0 one page and rank 1 two. Judged on
// own pages * cp, rank 0 sees 2 <= 3 (ok) and rank 1 sees 4 > 3 (overflow): the ranks disagree.
MutantCase rank_local_overflow_case() {
  model::Setting setting = small_setting(2);
  setting.caps.max_total_extend_tokens = 8;
  setting.caps.max_batch_requests = 1;
  return base_case(Mutant::rank_local_overflow, std::move(setting), {model::Batch{{fresh(12)}}}, round_robin(), {3});
}

// cp 2, two batches of different shapes in the same dense buffer (the allocator hands the second
// batch the first one's address): 3 current slots, then 4 slots over 2 requests (1 prefix page, 3
// current pages).
MutantCase address_keyed_plan_cache_case() {
  return base_case(Mutant::address_keyed_plan_cache, small_setting(2),
                   {model::Batch{{fresh(12)}}, model::Batch{{cached({5}, 6), fresh(3)}}}, round_robin(), {5});
}

// cp 2, one request of 6 tokens. Page-granular zigzag: 2 pages, page 0 to rank 0, page 1 to rank 1.
// Token-granular zigzag cuts 6 tokens into 4 blocks of 2, 2, 1, 1: tokens 0-1 to rank 0 and 2-3 to
// rank 1 straddle page 0, which gets two writers.
// cp 2, allgather_zigzag (section 12), one request of 6 fresh tokens: 4 token blocks of 2, 2, 1, 1,
// so rank 0 sends tokens 0, 1, 5 and rank 1 tokens 2, 3, 4 (3 rows each). Without the re-ordering the
// current rows take the gathered rows in order, 0, 1, 5, 2, 3, 4: row 2 holds token 5's bytes.
MutantCase allgather_skipped_reorder_case() {
  MutantCase c = base_case(Mutant::allgather_skipped_reorder, small_setting(2), {model::Batch{{fresh(6)}}}, round_robin(), {6});
  c.options.variant = model::Variant::allgather_zigzag;
  return c;
}

MutantCase token_split_case() {
  return base_case(Mutant::token_split, small_setting(2), {model::Batch{{fresh(6)}}}, round_robin(), {1});
}

// cp 2, one request of 6 tokens: its second page holds 2 valid rows, and the 2 rows past the end must
// be zero. Staging starts as garbage (as fresh GPU memory would); without the zero the tail shows.
MutantCase skip_zero_case() {
  return base_case(Mutant::skip_zero, small_setting(2), {model::Batch{{fresh(6)}}}, round_robin(), {6});
}

// cp 2, rank 1's IPC probe fails. Under v2, the agreed path is v2_fallback on both ranks; unagreed,
// rank 0 runs v2 (one compact all-reduce) while rank 1 runs the fallback (one whole-buffer
// all-reduce): the collectives no longer match.
MutantCase unagreed_capability_case() {
  MutantCase c = base_case(Mutant::unagreed_capability, small_setting(2), {model::Batch{{cached({5, 2}, 6), fresh(9)}}},
                           round_robin(), {7, kLiveness});
  c.options.variant = model::Variant::v2;
  c.options.ipc_missing_rank = 1;
  return c;
}

// cp 2, each rank writes one page, two layers. Round-robin: both arrive (count 2), the first leaver
// resets the count, and its peer, not yet through, now waits for a count that never returns.
MutantCase barrier_reset_race_case() {
  return base_case(Mutant::barrier_reset_race, small_setting(2), {model::Batch{{fresh(8)}}}, round_robin(), {4, kLiveness});
}

// cp 4, one request of one page: only rank 0 writes a current page, ranks 1-3 skip the barrier, and
// rank 0 waits for arrivals that never come (or an idle rank reads rank 0's page before its fill).
MutantCase skip_idle_barrier_case() {
  return base_case(Mutant::skip_idle_barrier, small_setting(4), {model::Batch{{fresh(3)}}}, round_robin(), {2, 4, kLiveness});
}

// cp 2, each rank writes one page. Rank 0 (priority) arrives and, waiting only for the previous
// phase, passes at once, before rank 1 arrived: the arrival shadow has no rank 1 for this barrier.
MutantCase barrier_passes_early_case() {
  return base_case(Mutant::barrier_passes_early, small_setting(2), {model::Batch{{fresh(8)}}}, priority_schedule(0), {4});
}

// cp 2, two layers: the plan is built at the batch's start and again on every layer. The bytes are
// right (the same plan each time); only the plan-built-once check sees it. Invariant 5.
MutantCase plan_rebuilt_per_layer_case() {
  return base_case(Mutant::plan_rebuilt_per_layer, small_setting(2), {model::Batch{{fresh(8)}}}, round_robin(), {5});
}

// cp 2, two requests (a cached page + 6 tokens, then 9 fresh tokens) laid out in reverse order by the
// layout itself: slot 0 holds request 1's first current page where request 0's prefix page belongs.
MutantCase reversed_request_order_case() {
  return base_case(Mutant::reversed_request_order, small_setting(2), {model::Batch{{cached({5}, 6), fresh(9)}}}, round_robin(), {6});
}

// cp 2, each rank writes one page, one batch. Rank 0 arrives once more after the last layer; no one
// waits for that arrival, so nothing blocks and no pass is early: only quiescence, where rank 0's
// flag stands a phase past rank 1's, sees it. Invariant 4.
MutantCase unmatched_arrival_case() {
  return base_case(Mutant::unmatched_arrival, small_setting(2), {model::Batch{{fresh(8)}}}, round_robin(), {4});
}

// cp 2, a request with a one-page cached prefix (6 current tokens) then a fresh one (9): every rank
// holds queries of both (zigzag: pages 0 and 1 of each request on ranks 0 and 1). The attention
// plan each rank hands its kernels (PROTOCOL.md section 11) is wrong, the bytes are right:
// batch_as_one_sequence counts request 0's 4 + 6 keys in request 1's kv_len, causal_off_by_one makes
// every kv_len one short, key_base_skips_prefix starts request 0's keys at its first current row 4.
// Invariant 9, and nothing else.
MutantCase attention_case(Mutant mutant) {
  return base_case(mutant, small_setting(2), {model::Batch{{cached({5}, 6), fresh(9)}}}, round_robin(), {9});
}

MutantCase case_for(Mutant mutant) {
  switch (mutant) {
    case Mutant::single_half: return single_half_case();
    case Mutant::no_barrier: return no_barrier_case();
    case Mutant::arrive_before_fill: return arrive_before_fill_case();
    case Mutant::rank_local_overflow: return rank_local_overflow_case();
    case Mutant::address_keyed_plan_cache: return address_keyed_plan_cache_case();
    case Mutant::token_split: return token_split_case();
    case Mutant::skip_zero: return skip_zero_case();
    case Mutant::unagreed_capability: return unagreed_capability_case();
    case Mutant::barrier_reset_race: return barrier_reset_race_case();
    case Mutant::skip_idle_barrier: return skip_idle_barrier_case();
    case Mutant::barrier_passes_early: return barrier_passes_early_case();
    case Mutant::plan_rebuilt_per_layer: return plan_rebuilt_per_layer_case();
    case Mutant::reversed_request_order: return reversed_request_order_case();
    case Mutant::unmatched_arrival: return unmatched_arrival_case();
    case Mutant::batch_as_one_sequence:
    case Mutant::causal_off_by_one:
    case Mutant::key_base_skips_prefix: return attention_case(mutant);
    case Mutant::allgather_skipped_reorder: return allgather_skipped_reorder_case();
    case Mutant::none: break;
    // The harness's own around an exchange plugin (tests/gpu_plugin_test.cpp): not the simulator's.
    case Mutant::stale_page_inverse:
    case Mutant::reused_plan:
    case Mutant::unzeroed_rows: break;
  }
  ADD_FAILURE() << "no counterexample for mutant " << to_string(mutant);
  return {};
}

// ---------------------------------------------------------------------------------------------

// The suite's promise is that every planted bug is caught; a mutant added to harness::kAllMutants without a
// counterexample here would lower the share caught without anyone noticing.
TEST(SimMutant, EveryPlantedBugHasACounterexampleThatIsCaught) {
  std::int32_t caught = 0;
  for (Mutant mutant : harness::kAllMutants) {
    const MutantCase c = case_for(mutant);
    ASSERT_EQ(c.mutant, mutant);
    const RunReport planted = run_case(c, mutant);
    if (reports_any(planted, c.caught_by)) ++caught;
    else ADD_FAILURE() << to_string(mutant) << " not caught:\n" << explain(planted);
  }
  EXPECT_EQ(caught, static_cast<std::int32_t>(harness::kAllMutants.size()));
}

// Section 6: with one half, a rank's layer l+1 zero/fill can overwrite slots a slow peer is still
// gathering for layer l. Invariant 2.
TEST(SimMutant, SingleHalfIsCaughtAsParityHalfReuse) { expect_caught(single_half_case()); }

// Without the counting barrier a reader gathers a peer's page before the peer filled it for this
// layer: it reads another layer's (or no layer's) bytes. Invariant 2 (the read sees a wrong stamp).
TEST(SimMutant, NoBarrierIsCaughtAsAReadOfAnUnfilledPage) { expect_caught(no_barrier_case()); }

// Arriving before the fill tells peers "my page is ready" while it is only zeroed; a peer that
// passes the barrier then gathers zeros. Invariant 2.
TEST(SimMutant, ArriveBeforeFillIsCaughtAsAReadOfAnUnfilledPage) { expect_caught(arrive_before_fill_case()); }

// Section 4: the overflow verdict must use batch-logical values only. Judged on a rank's own pages
// the ranks disagree: one raises while its peers enter the layer and wait at a barrier for it
// forever. Invariant 3.
TEST(SimMutant, RankLocalOverflowIsCaughtAsDisagreeingVerdicts) { expect_caught(rank_local_overflow_case()); }

// Section 5: the allocator hands the same dense address to the next batch, so a plan cache keyed on
// the address serves the first batch's descriptors to the second. Invariant 5.
TEST(SimMutant, AddressKeyedPlanCacheIsCaughtServingAStalePlan) { expect_caught(address_keyed_plan_cache_case()); }

// Section 2: a token-granular split gives a page two writers, each writing only its rows into its
// own staging copy; readers take the page from one writer and miss the other's rows. Invariant 1.
TEST(SimMutant, TokenSplitIsCaughtAsAPageWithTwoWriters) { expect_caught(token_split_case()); }

// Section 5 step 1: partial pages keep zero tails only because the writer zeroes its slots first;
// skipped, the rows past the end carry stale staging bytes into the dense buffer. Invariant 6.
TEST(SimMutant, SkipZeroIsCaughtAsStaleBytesInAPartialPage) { expect_caught(skip_zero_case()); }

// Section 7: a rank that falls back alone issues collectives its peers do not, so the group's
// collectives are mismatched (or the group deadlocks). Invariant 7 (or 8).
TEST(SimMutant, UnagreedCapabilityIsCaughtAsMismatchedCollectives) { expect_caught(unagreed_capability_case()); }

// The same mutant under staging_direct: rank 0 waits at the IPC barrier, rank 1 at the fallback's
// all-reduce, and neither ever arrives where the other waits. Invariant 8 (a reported deadlock).
TEST(SimMutant, UnagreedCapabilityUnderStagingDirectIsCaughtAsADeadlock) {
  MutantCase c = unagreed_capability_case();
  c.options.variant = model::Variant::staging_direct;
  c.caught_by = {kLiveness};
  expect_caught(c);
  EXPECT_TRUE(run_case(c, c.mutant).deadlock);
}

// Section 5 step 3: the barrier must be reusable without reset. A shared count reset by the first
// leaver strands a peer that has not yet seen the full count. Invariant 4 or 8.
TEST(SimMutant, BarrierResetRaceIsCaughtAsAStrandedWaiter) {
  expect_caught(barrier_reset_race_case());
  EXPECT_TRUE(run_case(barrier_reset_race_case(), Mutant::barrier_reset_race).deadlock);
}

// Section 4: every rank takes part in every barrier, even with nothing to exchange; a counting
// barrier missing one arrival never opens (or shifts every later phase). Invariant 4 or 8.
TEST(SimMutant, SkipIdleBarrierIsCaughtAsAMissingArrival) {
  expect_caught(skip_idle_barrier_case());
  EXPECT_TRUE(run_case(skip_idle_barrier_case(), Mutant::skip_idle_barrier).deadlock);
}

// Section 9, invariant 4: no rank passes barrier k before every rank arrived at k. The checker reads
// an arrival shadow kept per (batch, layer, barrier use), not the counters the rank spun on, so an
// off-by-one in the wait condition is seen at the very pass, before any stale byte is read.
TEST(SimMutant, BarrierPassingOnePhaseEarlyIsCaughtAtThePassAsInvariantFour) {
  expect_caught(barrier_passes_early_case());
  const RunReport planted = run_case(barrier_passes_early_case(), Mutant::barrier_passes_early);
  ASSERT_FALSE(planted.violations.empty());
  EXPECT_EQ(planted.violations.front().invariant, 4) << explain(planted);
  EXPECT_NE(std::string(planted.violations.front().detail).find("before rank 1 arrived"), std::string::npos) << explain(planted);
}

// Section 5: the plan is built once per batch and reused on every layer. A per-layer rebuild leaves
// every byte right; the build count is what shows it. Invariant 5, and nothing else.
TEST(SimMutant, PlanRebuiltPerLayerIsCaughtByThePlanBuiltOnceCheckAlone) {
  expect_caught(plan_rebuilt_per_layer_case());
  const RunReport planted = run_case(plan_rebuilt_per_layer_case(), Mutant::plan_rebuilt_per_layer);
  EXPECT_EQ(planted.violation_count, planted.violations_by_invariant[5]) << explain(planted);
  EXPECT_EQ(planted.mismatches(), 0);
}

// The reason the plain oracle exists: a layout that is wrong but self-consistent (requests laid out
// in reverse order) gathers exactly what its own expectation predicts. The layout-based check passes
// it; the oracle written from the spec, which walks the requests itself, does not.
TEST(SimMutant, ReversedRequestOrderPassesTheLayoutBasedCheckButNotThePlainOracle) {
  MutantCase c = reversed_request_order_case();
  c.options.expected_from = ExpectedBytesFrom::batch_layout;
  const RunReport layout_checked = run_case(c, Mutant::reversed_request_order);
  // The layout-based byte check agrees with its own gather; only the attention plan's plain oracle
  // (invariant 9: the plan built from the reversed layout puts request 0's keys where request 1's are)
  // sees it besides the byte oracle.
  EXPECT_EQ(layout_checked.mismatches(), 0) << "the layout-based expectation should agree with its own gather:\n" << explain(layout_checked);
  EXPECT_GT(layout_checked.violations_by_invariant[9], 0) << explain(layout_checked);
  EXPECT_EQ(layout_checked.violation_count, layout_checked.violations_by_invariant[9]) << explain(layout_checked);
  c.options.expected_from = ExpectedBytesFrom::spec_oracle;
  const RunReport oracle_checked = run_case(c, Mutant::reversed_request_order);
  EXPECT_GT(oracle_checked.mismatches(), 0) << explain(oracle_checked);
  EXPECT_GT(oracle_checked.violations_by_invariant[6], 0) << explain(oracle_checked);
  EXPECT_EQ(oracle_checked.violation_count, oracle_checked.violations_by_invariant[6] + oracle_checked.violations_by_invariant[9])
      << explain(oracle_checked);
  ASSERT_FALSE(oracle_checked.ranks.empty());
  EXPECT_NE(std::string(oracle_checked.ranks[0].first_mismatch).find("slot 0"), std::string::npos) << oracle_checked.ranks[0].first_mismatch;
}

// Section 9: every invariant's checker is shown to fire, each first (earliest in the run) for at
// least one planted bug, so none of them is dead code behind another.
TEST(SimMutant, EachOfTheNineInvariantsFiresFirstForSomePlantedBug) {
  const std::vector<std::pair<Mutant, std::int32_t>> fires_first = {
      {Mutant::token_split, 1},          {Mutant::single_half, 2},           {Mutant::rank_local_overflow, 3},
      {Mutant::barrier_passes_early, 4}, {Mutant::plan_rebuilt_per_layer, 5}, {Mutant::reversed_request_order, 6},
      {Mutant::skip_zero, 6},            {Mutant::unagreed_capability, 7},   {Mutant::barrier_reset_race, 8},
      {Mutant::batch_as_one_sequence, 9},
  };
  for (const auto& [mutant, invariant] : fires_first) {
    const RunReport planted = run_case(case_for(mutant), mutant);
    EXPECT_EQ(first_invariant_fired(planted), invariant) << to_string(mutant) << ":\n" << explain(planted);
  }
}

// The interleaving-dependent mutants are not artefacts of one hand-picked schedule: a few seeds of
// the random schedule catch them too.
TEST(SimMutant, InterleavingBugsAreCaughtUnderRandomSchedules) {
  for (Mutant mutant : {Mutant::single_half, Mutant::no_barrier, Mutant::arrive_before_fill}) {
    MutantCase c = case_for(mutant);
    c.schedule.kind = ScheduleKind::random;
    c.schedule.choices.clear();
    std::int32_t caught = 0;
    constexpr std::int32_t kSchedules = 8;
    for (std::int32_t k = 0; k < kSchedules; ++k) {
      c.schedule.seed = kSeed + k;
      const RunReport clean = run_case(c, Mutant::none);
      EXPECT_TRUE(clean.passed()) << "seed " << c.schedule.seed << ":\n" << explain(clean);
      if (reports_any(run_case(c, mutant), c.caught_by)) ++caught;
    }
    EXPECT_GT(caught, 0) << to_string(mutant) << " escaped all " << kSchedules << " random schedules";
  }
}

// Invariant 9's planted bugs leave every byte right and are reported with the checker's located
// line: the segment, request, tokens, field, expected and got, and the likely cause.
TEST(SimMutant, AttentionPlanBugsAreCaughtAloneWithALocatedLine) {
  const std::vector<std::pair<Mutant, std::string>> lines = {
      {Mutant::batch_as_one_sequence, "(request 1 tokens 0..3): q_len 4 kv_len 14, the request needs kv_len 4: kv_len counts request 0's 10 "
                                      "keys too: the batch taken as one sequence?"},
      {Mutant::causal_off_by_one, "(request 0 tokens 0..3): q_len 4 kv_len 7, the request needs kv_len 8: one key short"},
      {Mutant::key_base_skips_prefix, "(request 0 tokens 0..3): k_base 4, the request's keys begin at dense row 0: k_base is the current "
                                      "span's: the prefix was skipped?"},
  };
  for (const auto& [mutant, line] : lines) {
    expect_caught(case_for(mutant));
    const RunReport planted = run_case(case_for(mutant), mutant);
    EXPECT_EQ(planted.mismatches(), 0) << to_string(mutant) << ":\n" << explain(planted);
    EXPECT_EQ(planted.violation_count, planted.violations_by_invariant[9]) << to_string(mutant) << ":\n" << explain(planted);
    // Rank 0's finding (which rank ends the batch first depends on the schedule).
    const bool named = std::ranges::any_of(planted.violations, [&](const Violation& v) {
      return v.rank == 0 && std::string(v.detail).find(line) != std::string::npos;
    });
    EXPECT_TRUE(named) << to_string(mutant) << ": no rank 0 violation with \"" << line << "\":\n" << explain(planted);
  }
}

// A mutant must never be on by accident: the defaults are off, and parsing knows every name.
TEST(SimMutant, MutantsAreOffByDefaultAndEveryNameParses) {
  EXPECT_EQ(harness::RunOptions{}.mutant, Mutant::none);
  EXPECT_EQ(harness::parse_mutant("none"), Mutant::none);
  for (Mutant mutant : harness::kAllMutants) EXPECT_EQ(harness::parse_mutant(to_string(mutant)), mutant);
  EXPECT_EQ(harness::parse_mutant("no_such_mutant"), std::nullopt);
}

}  // namespace
}  // namespace cpkv::sim

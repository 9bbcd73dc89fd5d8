// The step machine's parts apart from a whole run: the host assertion macro (model/assert.hpp),
// the MutantPolicy (each planted bug answers exactly the questions its description in PROTOCOL.md
// section 9 names), the event-log form of a step, and the StateChecker fed events by hand against
// a real shared World (quiescence included).
#include <cstdint>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "cpkv/model/assert.hpp"
#include "cpkv/model/setting.hpp"
#include "cpkv/sim/checkers.hpp"
#include "cpkv/sim/machine.hpp"
#include "cpkv/sim/mutant.hpp"
#include "cpkv/sim/world.hpp"

namespace cpkv::sim {

// Harness names this file uses unqualified (sim's headers do not re-export them).
using harness::Violation;
using harness::Mutant;
namespace {

TEST(SimAssert, AFailedAssertionAbortsNamingFileLineAndCondition) {
  const int ranks = 2;
  CPKV_ASSERT(ranks == 2);  // holds: nothing happens
  EXPECT_DEATH(CPKV_ASSERT(ranks == 3), "sim_checkers_test.cpp:[0-9]+: assertion failed: ranks == 3");
}

// Every question the machine may ask, with its answer, by name.
std::set<std::string> answers(const MutantPolicy& policy) {
  return {
      "halves=" + std::to_string(policy.halves()),
      std::string("skips_barrier(busy)=") + (policy.skips_barrier(false) ? "1" : "0"),
      std::string("skips_barrier(idle)=") + (policy.skips_barrier(true) ? "1" : "0"),
      std::string("arrive_before_fill=") + (policy.arrive_before_fill() ? "1" : "0"),
      std::string("uses_reset_barrier=") + (policy.uses_reset_barrier() ? "1" : "0"),
      "barrier_phase_lag=" + std::to_string(policy.barrier_phase_lag()),
      std::string("ignores_peer_capability=") + (policy.ignores_peer_capability() ? "1" : "0"),
      std::string("skips_zero=") + (policy.skips_zero() ? "1" : "0"),
      std::string("judges_overflow_locally=") + (policy.judges_overflow_locally() ? "1" : "0"),
      std::string("keys_plan_cache_on_address=") + (policy.keys_plan_cache_on_address() ? "1" : "0"),
      std::string("rebuilds_plan_per_layer=") + (policy.rebuilds_plan_per_layer() ? "1" : "0"),
      std::string("splits_tokens=") + (policy.splits_tokens() ? "1" : "0"),
      std::string("reverses_request_order=") + (policy.reverses_request_order() ? "1" : "0"),
      std::string("arrives_once_more(rank 0)=") + (policy.arrives_once_more(0) ? "1" : "0"),
      std::string("arrives_once_more(rank 1)=") + (policy.arrives_once_more(1) ? "1" : "0"),
      "attention_bug=" + std::string(to_string(policy.attention_bug())),
      std::string("skips_reorder=") + (policy.skips_reorder() ? "1" : "0"),
  };
}

std::set<std::string> differences(Mutant mutant) {
  const std::set<std::string> correct = answers(MutantPolicy(Mutant::none));
  std::set<std::string> differ;
  for (const std::string& answer : answers(MutantPolicy(mutant))) {
    if (!correct.contains(answer)) differ.insert(answer);
  }
  return differ;
}

TEST(SimMutantPolicy, TheCorrectProtocolAnswersEveryQuestionAsPROTOCOLmdSays) {
  const MutantPolicy correct(Mutant::none);
  EXPECT_EQ(correct.halves(), 2);                // section 6: two parity halves
  EXPECT_FALSE(correct.skips_barrier(true));     // section 4: every rank takes part in every barrier
  EXPECT_FALSE(correct.skips_barrier(false));
  EXPECT_FALSE(correct.arrive_before_fill());    // section 5: fill, then barrier
  EXPECT_FALSE(correct.uses_reset_barrier());    // section 5: reusable without reset
  EXPECT_EQ(correct.barrier_phase_lag(), 0U);    // section 9, invariant 4
  EXPECT_FALSE(correct.ignores_peer_capability());  // invariant 7: the agreed MIN
  EXPECT_FALSE(correct.skips_zero());
  EXPECT_FALSE(correct.judges_overflow_locally());  // section 4: batch-logical values only
  EXPECT_FALSE(correct.keys_plan_cache_on_address());
  EXPECT_FALSE(correct.rebuilds_plan_per_layer());  // invariant 5: once per batch
  EXPECT_FALSE(correct.splits_tokens());            // section 2: page-aligned split
  EXPECT_FALSE(correct.reverses_request_order());   // section 3: merged-span order
  EXPECT_FALSE(correct.arrives_once_more(0));       // section 9, invariant 4: drained at quiescence
  // Section 11: causal per request, never across; query t sees keys 0..prefix_len+t; k_base is the
  // first prefix row (model_attention_bug_test.cpp holds each bug to what it changes).
  EXPECT_EQ(correct.attention_bug(), cpkv::model::AttentionBug::none);
}

TEST(SimMutantPolicy, EachPlantedBugChangesOnlyTheAnswersItsDescriptionNames) {
  using S = std::set<std::string>;
  EXPECT_EQ(differences(Mutant::single_half), (S{"halves=1"}));
  EXPECT_EQ(differences(Mutant::no_barrier), (S{"skips_barrier(busy)=1", "skips_barrier(idle)=1"}));
  EXPECT_EQ(differences(Mutant::skip_idle_barrier), (S{"skips_barrier(idle)=1"}));
  EXPECT_EQ(differences(Mutant::arrive_before_fill), (S{"arrive_before_fill=1"}));
  EXPECT_EQ(differences(Mutant::barrier_reset_race), (S{"uses_reset_barrier=1"}));
  EXPECT_EQ(differences(Mutant::barrier_passes_early), (S{"barrier_phase_lag=1"}));
  EXPECT_EQ(differences(Mutant::unagreed_capability), (S{"ignores_peer_capability=1"}));
  EXPECT_EQ(differences(Mutant::skip_zero), (S{"skips_zero=1"}));
  EXPECT_EQ(differences(Mutant::rank_local_overflow), (S{"judges_overflow_locally=1"}));
  EXPECT_EQ(differences(Mutant::address_keyed_plan_cache), (S{"keys_plan_cache_on_address=1"}));
  EXPECT_EQ(differences(Mutant::plan_rebuilt_per_layer), (S{"rebuilds_plan_per_layer=1"}));
  EXPECT_EQ(differences(Mutant::token_split), (S{"splits_tokens=1"}));
  EXPECT_EQ(differences(Mutant::reversed_request_order), (S{"reverses_request_order=1"}));
  EXPECT_EQ(differences(Mutant::unmatched_arrival), (S{"arrives_once_more(rank 0)=1"}));
  EXPECT_EQ(differences(Mutant::batch_as_one_sequence), (S{"attention_bug=batch_as_one_sequence"}));
  EXPECT_EQ(differences(Mutant::causal_off_by_one), (S{"attention_bug=causal_off_by_one"}));
  EXPECT_EQ(differences(Mutant::key_base_skips_prefix), (S{"attention_bug=key_base_skips_prefix"}));
  EXPECT_EQ(differences(Mutant::allgather_skipped_reorder), (S{"skips_reorder=1"}));
  for (Mutant m : harness::kAllMutants) EXPECT_FALSE(differences(m).empty()) << to_string(m) << " changes nothing the machine asks";
}

// The scheduled runner's event log writes "rank op layer a b c": a step's named operands in order.
TEST(SimStep, TheEventLogFormNamesTheOpTheLayerAndTheOperandsInOrder) {
  EXPECT_EQ(to_string(Step{Op::probe}), "probe -1 0 0 0");
  EXPECT_EQ(to_string(Step{Op::coll_arrive, -1, CollectiveStep{0, 0, -1}}), "coll_arrive -1 0 0 -1");
  EXPECT_EQ(to_string(Step{Op::local_prefix, 1, SlotStep{6}}), "local_prefix 1 6 0 0");
  EXPECT_EQ(to_string(Step{Op::publish, 0, PageStep{4}}), "publish 0 4 0 0");
  EXPECT_EQ(to_string(Step{Op::fill, 1, FillStep{2, 7, 3}}), "fill 1 2 7 3");
  EXPECT_EQ(to_string(Step{Op::gather, 0, GatherStep{3, 5, 2}}), "gather 0 3 5 2");
  EXPECT_EQ(to_string(Step{Op::reduce, 1, CollectiveStep{0, CollectiveStep::kCompact, 1}}), "reduce 1 0 -1 1");
}

// Two ranks, pages of 4 tokens, one kind, two layers: the smallest world both halves are used in.
model::Setting two_ranks() {
  model::Setting setting;
  setting.cp = 2;
  setting.page_size = 4;
  setting.kinds = {*model::find_buffer_kind("kv_fp8")};
  setting.layer_pattern = "S";
  setting.pool_pages = 8;
  return setting;
}

// Invariant 2 (PROTOCOL.md section 6): rank a may write half h for layer l + 2 only once no peer
// reads h for layer l. The checker is told of the write and looks at the peers' open read epochs.
TEST(SimStateChecker, AWriteIntoAHalfAPeerStillReadsIsReported) {
  const model::Setting setting = two_ranks();
  const World world(geometry_for(setting, 3, 4, 4), 1);
  StateChecker writer(world, setting, 0, /*halves=*/2);
  writer.at(0, 10);
  world.reading_layer(1).store(0);  // rank 1 still reads layer 0 (half 0)
  writer.on_shared_write(/*layer=*/1, /*half=*/1, /*slot=*/0);
  EXPECT_EQ(world.violation_count(2), 0) << "half 1 is not the half rank 1 reads";
  writer.on_shared_write(/*layer=*/2, /*half=*/0, /*slot=*/3);
  ASSERT_EQ(world.violation_count(2), 1);
  const Violation v = world.violations().front();
  EXPECT_EQ(v.rank, 0);
  EXPECT_EQ(v.layer, 2);
  EXPECT_EQ(v.slot, 3);
  EXPECT_EQ(v.step, 10);
  // With one half only (single_half), layer 1 lands on the half rank 1 reads for layer 0.
  StateChecker one_half(world, setting, 0, /*halves=*/1);
  one_half.at(0, 11);
  one_half.on_shared_write(/*layer=*/1, /*half=*/0, /*slot=*/0);
  EXPECT_EQ(world.violation_count(2), 2);
}

// Invariant 4: a rank passing barrier (batch, layer, use) finds every rank's arrival for it.
TEST(SimStateChecker, PassingABarrierBeforeAPeerArrivedForItIsReported) {
  const model::Setting setting = two_ranks();
  const World world(geometry_for(setting, 2, 4, 4), 1);
  StateChecker rank0(world, setting, 0, 2);
  StateChecker rank1(world, setting, 1, 2);
  for (StateChecker* c : {&rank0, &rank1}) {
    c->at(0, 1);
    c->on_layer_begin(0, /*plan_builds_this_batch=*/1);
  }
  rank0.on_barrier_arrive(0);
  rank0.on_barrier_pass(0, 1);
  EXPECT_EQ(world.violation_count(4), 1) << "rank 1 had not arrived";
  rank1.on_barrier_arrive(0);
  rank1.on_barrier_pass(0, 1);
  EXPECT_EQ(world.violation_count(4), 1) << "both had arrived when rank 1 passed";
  EXPECT_EQ(world.violation_count(), 1) << "nothing else was reported";
}

// Invariant 5: the plan is built once per batch; a layer that starts with another count is reported.
TEST(SimStateChecker, APlanBuiltOtherThanOncePerBatchIsReported) {
  const model::Setting setting = two_ranks();
  const World world(geometry_for(setting, 2, 4, 4), 1);
  StateChecker checker(world, setting, 0, 2);
  checker.at(3, 1);
  checker.on_layer_begin(0, 1);
  EXPECT_EQ(world.violation_count(5), 0);
  checker.on_layer_begin(1, 2);
  checker.on_layer_begin(1, 0);
  EXPECT_EQ(world.violation_count(5), 2);
}

// Invariant 4 at quiescence: the run is over, so every rank arrived at every barrier and collective
// as often as every other; a rank that arrived once more (or once less) is reported, by rank.
TEST(SimStateChecker, FlagsNotDrainedAtQuiescenceAreReported) {
  model::Setting setting = two_ranks();
  setting.cp = 3;
  const World world(geometry_for(setting, 2, 4, 4), 1);
  for (std::int32_t r = 0; r < 3; ++r) {
    world.barrier_counter(r).value.store(4);
    world.collective_counter(r).value.store(2);
  }
  on_quiescence(world);
  EXPECT_EQ(world.violation_count(), 0) << "every flag drained";
  world.collective_counter(2).value.store(3);
  on_quiescence(world);
  ASSERT_EQ(world.violation_count(4), 1);
  EXPECT_EQ(world.violations().front().rank, 2);
  world.collective_counter(2).value.store(2);
  world.barrier_counter(1).value.store(5);
  on_quiescence(world);
  ASSERT_EQ(world.violation_count(4), 2);
  EXPECT_EQ(world.violations().back().rank, 1);
}

}  // namespace
}  // namespace cpkv::sim

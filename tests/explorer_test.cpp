// Exhaustive exploration: for small settings every interleaving of the rank step machines is
// explored, which proves parity-half reuse safety (2) and barrier phase safety (4) for them, and the
// three ordering bugs are found as concrete schedules.
#include <gtest/gtest.h>

#include "cpkv/properties/explorer.hpp"

namespace cpkv::properties {
namespace {

ExploreResult run(std::int32_t cp, std::int32_t layers, model::Variant variant, sim::Mutant mutant) {
  ExploreOptions options;
  options.setting = exploration_setting(cp);
  options.batch = exploration_batch();
  options.variant = variant;
  options.layers = layers;
  options.mutant = mutant;
  return explore(options);
}

TEST(Explorer, EveryInterleavingIsSafeForStagingFamiliesUpToThreeRanksAndThreeLayers) {
  for (model::Variant variant : {model::Variant::staging_direct, model::Variant::staging_publish, model::Variant::symm_dense}) {
    for (std::int32_t cp = 1; cp <= 3; ++cp) {
      for (std::int32_t layers = 1; layers <= 3; ++layers) {
        const ExploreResult r = run(cp, layers, variant, sim::Mutant::none);
        EXPECT_FALSE(r.found) << model::to_string(variant) << " cp " << cp << " layers " << layers << ": " << r.finding;
        EXPECT_TRUE(r.complete) << "cp " << cp << " layers " << layers;
        // More than one interleaving was explored wherever two ranks exist.
        if (cp > 1) {
          EXPECT_GT(r.transitions, r.states - 1);
        }
      }
    }
  }
}

TEST(Explorer, FourRanksTwoLayersAreSafeInEveryInterleaving) {
  const ExploreResult r = run(4, 2, model::Variant::staging_direct, sim::Mutant::none);
  EXPECT_FALSE(r.found) << r.finding;
  EXPECT_TRUE(r.complete);
  EXPECT_GT(r.states, 1000u);
}

TEST(Explorer, FindsTheSingleHalfCounterexample) {
  const ExploreResult r = run(2, 3, model::Variant::staging_direct, sim::Mutant::single_half);
  ASSERT_TRUE(r.found);
  EXPECT_NE(r.finding.find("invariant 2"), std::string::npos) << r.finding;
  EXPECT_FALSE(r.schedule.empty());
}

TEST(Explorer, FindsTheNoBarrierCounterexample) {
  const ExploreResult r = run(2, 2, model::Variant::staging_direct, sim::Mutant::no_barrier);
  ASSERT_TRUE(r.found);
  EXPECT_NE(r.finding.find("invariant 2"), std::string::npos) << r.finding;
}

TEST(Explorer, FindsTheArriveBeforeFillCounterexample) {
  const ExploreResult r = run(2, 2, model::Variant::staging_direct, sim::Mutant::arrive_before_fill);
  ASSERT_TRUE(r.found);
  EXPECT_NE(r.finding.find("invariant 2"), std::string::npos) << r.finding;
}

}  // namespace
}  // namespace cpkv::properties

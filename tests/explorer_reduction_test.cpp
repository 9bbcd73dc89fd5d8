// The explorer's state identity and reductions (issue 38): the visited set is keyed on everything a
// future step can read, so two interleavings that reach the same program counters with different
// memory are both explored; the partial-order reduction explores independent steps in one order and
// still finds every violation and deadlock the full exploration finds; every step's footprint names
// every byte it writes (the undo log and the state hash rely on it).
#include <gtest/gtest.h>

#include <bit>
#include <map>

#include <fmt/format.h>

#include "cpkv/harness/mutants.hpp"
#include "cpkv/properties/explorer.hpp"

namespace cpkv::properties {
namespace {

ExploreOptions base(std::int32_t cp, std::int32_t layers) {
  ExploreOptions o;
  o.setting = exploration_setting(cp);
  o.batches = {exploration_batch()};
  o.layers = layers;
  return o;
}

// A test-only planted condition (no planted bug of harness::kMutantTable has this shape: each is
// seen on the transition that makes it, or at quiescence, which is checked on every path): when
// rank 1 has filled its current page and reaches its layer-0 barrier arrival before rank 0 has
// arrived, one byte of that staged page goes bad. Nothing reads it until the gathers after the
// barrier (rank 0's layer end then sees the byte), by when the bad path has merged with a good one
// at the same program counters (rank 0 waiting, rank 1 at its arrival) that the search, taking
// rank 0 first, visited before.
void flip_if_rank_one_arrives_first(sim::World& world, const std::vector<sim::RankMachine>& machines, std::uint32_t stepped) {
  if (stepped != 1 || machines[0].barriers_arrived() != 0) return;
  const sim::Step* next = machines[1].next_step();
  if (next == nullptr || next->op != sim::Op::arrive || next->layer != 0) return;
  world.staging_page(1, 0, 0, 1)[0] ^= 0x80;  // staging_direct: rank 1 fills current page 1
}

// Every interleaving (no reduction: the planted write reads rank 0's barrier counter, which no
// footprint says, so the reduction's independence does not hold for it).
TEST(ExplorerStateKey, OldKeyMissesWhatTheStateKeyFinds) {
  {
    ExploreOptions o = base(2, 1);
    o.reduction = Reduction::none;
    o.after_step = flip_if_rank_one_arrives_first;
    o.key = StateKey::program_counters;
    const ExploreResult old_key = explore(o);
    EXPECT_FALSE(old_key.found) << old_key.finding;
    EXPECT_TRUE(old_key.complete);
    o.key = StateKey::full_state;
    const ExploreResult full = explore(o);
    ASSERT_TRUE(full.found) << "the state key missed the order-dependent byte";
    EXPECT_NE(full.finding.find("invariant 6"), std::string::npos) << full.finding;
    EXPECT_NE(full.finding.find("kv_fp8 slot 2 row 0 byte 0"), std::string::npos) << full.finding;
    EXPECT_GT(full.states, old_key.states / 2);
  }
}

// Every byte a step changes lies in an object its footprint writes, and the undo log puts every
// byte back (verify_footprints throws otherwise), over the shapes, the correct protocol and every
// planted bug (going on past each finding, so the buggy paths' steps are checked too).
TEST(ExplorerFootprints, CoverEveryWriteOverTheShapesAndEveryPlantedBug) {
  std::vector<harness::Mutant> mutants = {harness::Mutant::none};
  mutants.insert(mutants.end(), std::begin(harness::kAllMutants), std::end(harness::kAllMutants));
  for (std::int32_t cp : {2, 3}) {
    for (const ExploreShape& shape : exploration_shapes(cp)) {
      for (harness::Mutant mutant : mutants) {
        if (cp == 3 && mutant != harness::Mutant::none) continue;  // kept short for CI
        ExploreOptions o = options_for(shape, 2, mutant);
        o.verify_footprints = true;
        o.collect_all = true;
        o.states_max = cp == 2 ? 1500 : 300;
        SCOPED_TRACE(fmt::format("{} cp {} {}", shape.name, cp, harness::to_string(mutant)));
        EXPECT_NO_THROW(explore(o));
      }
    }
  }
}

// Soundness of the reduction, checked: on every shape the reduced and the full exploration find
// the same set of violations and deadlocks (each described with its rank, batch, layer, slot and
// step), for the correct protocol (none) and the planted bugs given, at 2 layers; both searches
// must finish (bounded by states alone, so a loaded machine gives the same verdict). Returns, per
// planted bug, whether some shape showed it.
std::map<harness::Mutant, bool> compare_reduced_and_full(std::int32_t cp, const std::vector<harness::Mutant>& mutants) {
  std::map<harness::Mutant, bool> some_finding;
  for (const ExploreShape& shape : exploration_shapes(cp)) {
    for (harness::Mutant mutant : mutants) {
      SCOPED_TRACE(fmt::format("{} cp {} {}", shape.name, cp, harness::to_string(mutant)));
      ExploreOptions o = options_for(shape, 2, mutant);
      o.collect_all = true;
      o.seconds_max = 1e9;
      o.states_max = 400'000;
      o.reduction = Reduction::none;
      o.symmetry = Symmetry::none;  // the reduction alone (symmetry: ExplorerSymmetry below)
      const ExploreResult full = explore(o);
      o.reduction = Reduction::partial_order;
      const ExploreResult reduced = explore(o);
      EXPECT_TRUE(full.complete && reduced.complete);
      EXPECT_EQ(reduced.findings, full.findings);
      if (mutant == harness::Mutant::none) {
        EXPECT_TRUE(full.findings.empty()) << *full.findings.begin();
      }
      some_finding[mutant] = some_finding[mutant] || !full.findings.empty();
      EXPECT_LE(reduced.states, full.states);
    }
  }
  return some_finding;
}

std::vector<harness::Mutant> none_and(const std::vector<harness::Mutant>& bugs) {
  std::vector<harness::Mutant> mutants = {harness::Mutant::none};
  mutants.insert(mutants.end(), bugs.begin(), bugs.end());
  return mutants;
}

// cp 1 and 2: the correct protocol and every planted bug.
TEST(ExplorerReduction, ReducedAndFullFindTheSameViolationsAndDeadlocks) {
  const std::vector<harness::Mutant> all(std::begin(harness::kAllMutants), std::end(harness::kAllMutants));
  compare_reduced_and_full(1, none_and(all));
  const std::map<harness::Mutant, bool> found = compare_reduced_and_full(2, none_and(all));
  // The comparison has something to compare: every planted bug shows in some shape at cp 2 but
  // rank_local_overflow, which needs three ranks (its local count must cross the capacity).
  for (harness::Mutant m : all) EXPECT_TRUE(found.at(m) || m == harness::Mutant::rank_local_overflow) << harness::to_string(m);
}

// cp 3: the correct protocol and every planted bug but the four that break the barrier's ordering
// (single_half, no_barrier, arrive_before_fill, barrier_passes_early): going on past their
// findings, ranks run unordered and the full search at cp 3 passes 300,000 states (compared at
// cp 2 above; at cp 3 and 4 by `cpkv explore --check-reduction`, docs/properties.md).
TEST(ExplorerReduction, ReducedAndFullAgreeAtThreeRanks) {
  std::vector<harness::Mutant> bugs;
  for (harness::Mutant m : harness::kAllMutants) {
    if (m != harness::Mutant::single_half && m != harness::Mutant::no_barrier && m != harness::Mutant::arrive_before_fill && m != harness::Mutant::barrier_passes_early) {
      bugs.push_back(m);
    }
  }
  const std::map<harness::Mutant, bool> found = compare_reduced_and_full(3, none_and(bugs));
  EXPECT_TRUE(found.at(harness::Mutant::rank_local_overflow)) << "the bug that needs three ranks was not compared on a finding";
}

// The reduction reduces: at cp 3 the barrier variants visit far fewer states than every
// interleaving (the full counts are the program-counter product the old explorer walked).
TEST(ExplorerReduction, ExploresFewerStatesThanTheFullSearch) {
  ExploreOptions o = base(3, 2);
  o.reduction = Reduction::none;
  const ExploreResult full = explore(o);
  o.reduction = Reduction::partial_order;
  const ExploreResult reduced = explore(o);
  ASSERT_TRUE(full.complete && reduced.complete);
  EXPECT_LT(reduced.states * 4, full.states) << reduced.states << " of " << full.states;
}

// The idle ranks at cp 8, from the shapes' batches by hand (docs/properties.md, "Symmetry"): the
// exploration batch's 3 current pages go to ranks 0, 1, 0 (zigzag over 8 ranks), its prefix page 5
// is rank 5's, and the query tokens are on the writers; idle_rank's one page is rank 0's.
TEST(ExplorerSymmetry, IdleRanksOfTheShapesAtEightRanks) {
  std::map<std::string, std::uint8_t> idle;
  for (const ExploreShape& shape : exploration_shapes(8)) idle[shape.name] = idle_ranks(options_for(shape, 2, harness::Mutant::none));
  EXPECT_EQ(idle.at("staging_direct"), 0b11011100);  // ranks 2, 3, 4, 6, 7
  EXPECT_EQ(idle.at("idle_rank"), 0b11011110);       // ranks 1, 2, 3, 4, 6, 7
  EXPECT_EQ(idle.at("every_rank_writes"), 0);
  // two_batches' second batch: prefix page 3 (rank 3's), 2 current pages (ranks 0, 1).
  EXPECT_EQ(idle.at("two_batches"), 0b11010100);
  EXPECT_EQ(idle.at("allgather_zigzag"), 0) << "the token split gives every rank its place in the all-gather";
  EXPECT_EQ(idle.at("capability_fallback"), 0b01011100);  // and not rank 7, whose probe fails
  // overflow_then_normal's first batch has 4 current pages, one each for ranks 0..3 (and the
  // second is the exploration batch): ranks 4, 6, 7.
  EXPECT_EQ(idle.at("overflow_then_normal"), 0b11010000);
  ExploreOptions moved = options_for(exploration_shapes(8).front(), 2, harness::Mutant::reversed_request_order);
  EXPECT_EQ(idle_ranks(moved), 0) << "a planted bug that moves the writers leaves no rank idle by the model's layout";
}

// With and without symmetry the reduced search finds the same violations and deadlocks up to a
// permutation of the idle ranks, at cp 4 (ranks 2 and 3 idle in the exploration batch, ranks 1..3
// but the prefix owner in idle_rank, 2 of 3 in the fallback), for the correct protocol and the
// planted bugs given. Returns how many comparisons had symmetric ranks and some finding.
struct Plant {
  std::uint8_t ranks = 0;
  bool forget_shadow_bits = false;
  bool unmapped_sleep = false;
  bool forget_positions = false;
  bool any() const { return ranks != 0 || forget_shadow_bits || unmapped_sleep || forget_positions; }
};
std::int32_t compare_symmetric(std::int32_t cp, const std::vector<harness::Mutant>& mutants, const Plant& plant, std::int32_t& differ,
                               const std::string& only_shape = "") {
  std::int32_t compared = 0;
  for (const ExploreShape& shape : exploration_shapes(cp)) {
    if (!only_shape.empty() && shape.name != only_shape) continue;
    for (harness::Mutant mutant : mutants) {
      SCOPED_TRACE(fmt::format("{} cp {} {}", shape.name, cp, harness::to_string(mutant)));
      ExploreOptions o = options_for(shape, 2, mutant);
      if (idle_ranks(o) == 0 && plant.ranks == 0) continue;  // nothing to canonicalise
      o.collect_all = true;
      o.seconds_max = 1e9;
      o.states_max = 200'000;
      o.symmetry = Symmetry::none;
      const ExploreResult plain = explore(o);
      o.symmetry = Symmetry::idle_ranks;
      o.plant_symmetric_ranks = plant.ranks;
      o.plant_forget_shadow_bits = plant.forget_shadow_bits;
      o.plant_unmapped_sleep = plant.unmapped_sleep;
      o.plant_forget_positions = plant.forget_positions;
      const ExploreResult symmetric = explore(o);
      EXPECT_TRUE(plain.complete && symmetric.complete);
      if (symmetric.symmetric_ranks == 0) continue;
      const bool same = canonical_findings(plain.findings, symmetric.symmetric_ranks) == canonical_findings(symmetric.findings, symmetric.symmetric_ranks);
      differ += same ? 0 : 1;
      if (!plant.any()) {
        EXPECT_TRUE(same);
        EXPECT_LE(symmetric.states, plain.states);
      }
      compared += plain.findings.empty() ? 0 : 1;
    }
  }
  return compared;
}

std::vector<harness::Mutant> orderly_bugs() {
  std::vector<harness::Mutant> bugs;
  for (harness::Mutant m : harness::kAllMutants) {
    if (m != harness::Mutant::single_half && m != harness::Mutant::no_barrier && m != harness::Mutant::arrive_before_fill && m != harness::Mutant::barrier_passes_early) {
      bugs.push_back(m);
    }
  }
  return bugs;
}

// The canonical key kept incrementally (the buckets' sums through every step and undo) equals the
// one from a hash built from scratch, at every state (verify_footprints), at cp 4 where ranks 2 and
// 3 are idle, for the correct protocol and two barrier bugs (a bounded start of each).
TEST(ExplorerSymmetry, IncrementalCanonicalKeyEqualsTheKeyFromScratch) {
  for (harness::Mutant mutant : {harness::Mutant::none, harness::Mutant::skip_idle_barrier, harness::Mutant::no_barrier}) {
    for (const ExploreShape& shape : exploration_shapes(4)) {
      ExploreOptions o = options_for(shape, 2, mutant);
      if (std::popcount(idle_ranks(o)) < 2) continue;
      o.verify_footprints = true;
      o.collect_all = true;
      o.states_max = 200;
      SCOPED_TRACE(fmt::format("{} {}", shape.name, harness::to_string(mutant)));
      ExploreResult r;
      EXPECT_NO_THROW(r = explore(o));
      EXPECT_NE(r.symmetric_ranks, 0);
    }
  }
}

TEST(ExplorerSymmetry, SameFindingsWithAndWithoutSymmetryAtFourRanks) {
  std::int32_t differ = 0;
  const std::int32_t compared = compare_symmetric(4, none_and(orderly_bugs()), Plant{}, differ);
  EXPECT_EQ(differ, 0);
  EXPECT_GT(compared, 5) << "too few comparisons on a finding";
}

// The states merged: staging_direct at cp 6, 2 layers, with its three idle ranks (2, 3, 4: the
// prefix page 5 is rank 5's), visits fewer states with symmetry than without, and proves the same.
TEST(ExplorerSymmetry, MergesStatesAtSixRanks) {
  ExploreOptions o = options_for(exploration_shapes(6).front(), 2, harness::Mutant::none);
  o.symmetry = Symmetry::none;
  const ExploreResult plain = explore(o);
  o.symmetry = Symmetry::idle_ranks;
  const ExploreResult symmetric = explore(o);
  ASSERT_TRUE(plain.complete && symmetric.complete);
  EXPECT_EQ(symmetric.symmetric_ranks, 0b011100);
  EXPECT_LT(symmetric.states * 2, plain.states) << symmetric.states << " of " << plain.states;
}

// A planted canonicalisation bug: the idle ranks' parts leave out their machines' positions, so a
// state where an idle rank has passed a wait (a step that changes no byte) is taken for one where
// it has not. The comparison must see it: at cp 4 skip_idle_barrier's findings differ.
TEST(ExplorerSymmetry, ComparisonCatchesAPlantedCanonicalisationBug) {
  std::int32_t differ = 0;
  Plant plant;
  plant.forget_positions = true;
  compare_symmetric(4, {harness::Mutant::skip_idle_barrier}, plant, differ, "staging_direct");
  EXPECT_GT(differ, 0) << "the comparison did not see idle ranks merged at different positions";
}

// Bitstate mode says how much it covered and never claims a proof.
TEST(ExplorerBitstate, StatesItsCoverageAndIsNeverComplete) {
  ExploreOptions o = base(3, 2);
  o.bitstate_log2 = 20;
  const ExploreResult r = explore(o);
  EXPECT_FALSE(r.found) << r.finding;
  EXPECT_FALSE(r.complete);
  EXPECT_GT(r.coverage_estimate, 0.99);
  EXPECT_LE(r.coverage_estimate, 1.0);
  o.mutant = harness::Mutant::no_barrier;
  EXPECT_TRUE(explore(o).found);
}

}  // namespace
}  // namespace cpkv::properties

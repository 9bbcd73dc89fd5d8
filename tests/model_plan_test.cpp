// Compose plans of every variant (PROTOCOL.md sections 5 and 7), the page inverses, the ragged index
// plan and the per-layer byte counts, all on the tiny batch of model_tiny_batch.hpp, worked by hand.
// The plan is what the kernels execute: a wrong descriptor reads the wrong peer's page, and a wrong
// byte count makes every benchmark comparison meaningless.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "cpkv/model/costs.hpp"
#include "cpkv/model/plan.hpp"
#include "cpkv/model/token_plan.hpp"
#include "model_tiny_batch.hpp"

namespace cpkv::model {
namespace {

using testing::kBothKindsPageBytes;
using testing::kKvPageBytes;
using testing::tiny_batch;
using testing::tiny_setting;

constexpr std::int32_t kFullLayer = 0;    // pattern "FS": layer 0 runs the indexer
constexpr std::int32_t kSharedLayer = 1;  // layer 1 carries kv_fp8 only

SlotDescriptor d(std::int32_t table_index, std::int64_t source_page) {
  return SlotDescriptor{.table_index = table_index, .source_page = source_page};
}
const SlotDescriptor kZ = d(SlotDescriptor::kZeroFill, 0);

// Descriptors compare on table_index always and on source_page only where it is read.
void expect_descriptors(const std::vector<SlotDescriptor>& actual,
                        const std::vector<SlotDescriptor>& expected, const char* what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (std::size_t s = 0; s < expected.size(); ++s) {
    EXPECT_EQ(actual[s].table_index, expected[s].table_index) << what << " slot " << s;
    if (expected[s].table_index >= 0) {
      EXPECT_EQ(actual[s].source_page, expected[s].source_page) << what << " slot " << s;
    }
  }
}

// The prefix gather of the IPC variants reads prefix slots from the pool; current slots are not its
// business. `current_fill` is what it must put in a current slot this rank wrote itself: kSkip (the
// fill already wrote it, and gather1 runs after the fill) or kZeroFill (v2's sentinel).
void expect_prefix_gather(const std::vector<SlotDescriptor>& g, const BatchLayout& layout,
                          std::int32_t rank, std::int32_t current_fill, const char* what) {
  ASSERT_EQ(g.size(), 7u) << what;
  EXPECT_EQ(g[0], d(1, 2)) << what;
  EXPECT_EQ(g[1], d(0, 1)) << what;
  for (std::size_t s = 2; s < 7; ++s) {
    const auto& page = layout.current[layout.slots[s].page_or_index];
    if (current_fill == SlotDescriptor::kZeroFill || page.writer == rank) {
      EXPECT_EQ(g[s].table_index, current_fill) << what << " slot " << s;
    } else {
      // A peer's current slot: gather2 writes it later, so gather1 may skip or zero it.
      EXPECT_TRUE(g[s].table_index == SlotDescriptor::kSkip ||
                  g[s].table_index == SlotDescriptor::kZeroFill)
          << what << " slot " << s << " table_index " << g[s].table_index;
    }
  }
}

const std::vector<std::int64_t> kOwnCurrent[2] = {{0, 2}, {1, 3, 4}};
// Prefix slot 0 holds page 5 (owner 1), slot 1 page 2 (owner 0).
const std::vector<std::int64_t> kOwnedPrefixSlots[2] = {{1}, {0}};

TEST(ModelPlan, StagingDirectDescriptorsReadPrefixFromOwnerPoolAndCurrentFromWriterStaging) {
  // Section 5: prefix (g % cp, g / cp); current index i of writer w: (cp + w, i).
  const BatchLayout layout = layout_batch(tiny_setting(), tiny_batch());
  const std::vector<SlotDescriptor> expected = {d(1, 2), d(0, 1), d(2, 0), d(3, 1),
                                                d(2, 2), d(3, 3), d(3, 4)};
  EXPECT_EQ(staging_direct_plan(layout), expected);
}

TEST(ModelPlan, StagingDirectDescriptorsFollowTheRoundRobinWriter) {
  // Under round_robin index 4 is written by rank 0: its slot reads staging entry cp + 0.
  Setting s = tiny_setting();
  s.split = SplitPolicy::round_robin;
  const auto plan = staging_direct_plan(layout_batch(s, tiny_batch()));
  ASSERT_EQ(plan.size(), 7u);
  EXPECT_EQ(plan[6], d(2, 4));
  EXPECT_EQ(plan[5], d(3, 3));
}

TEST(ModelPlan, StagingDirectDescriptorsWithOneRankUseTableEntriesZeroAndOne) {
  // cp = 1: the pool of rank 0 is entry 0 (local page = g), its staging entry 1.
  Setting s = tiny_setting();
  s.cp = 1;
  const std::vector<SlotDescriptor> expected = {d(0, 5), d(0, 2), d(1, 0), d(1, 1),
                                                d(1, 2), d(1, 3), d(1, 4)};
  EXPECT_EQ(staging_direct_plan(layout_batch(s, tiny_batch())), expected);
}

TEST(ModelPlan, StagingDirectVariantFillsStagingThenBarrierThenOneGatherOfEverySlot) {
  // The single gather must run AFTER the barrier (peers' staging is complete only then), and the
  // header's step order puts gather1 before the barrier and gather2 after it: so staging_direct's
  // one gather is gather2, and gather1 is empty. It covers own current pages too (section 5).
  const BatchLayout layout = layout_batch(tiny_setting(), tiny_batch());
  for (std::int32_t rank = 0; rank < 2; ++rank) {
    const VariantPlan plan = variant_plan(layout, Variant::staging_direct, rank);
    EXPECT_EQ(plan.variant, Variant::staging_direct);
    EXPECT_EQ(plan.rank, rank);
    EXPECT_FALSE(plan.zero_dense);
    EXPECT_TRUE(plan.local_prefix_slots.empty());
    EXPECT_TRUE(plan.zero_own_current);  // step 1: partial pages keep zero tails
    EXPECT_TRUE(plan.fill_to_staging);
    EXPECT_EQ(plan.own_current, kOwnCurrent[rank]);
    EXPECT_TRUE(plan.gather1.empty()) << "gather1 = " << ::testing::PrintToString(plan.gather1);
    EXPECT_TRUE(plan.barrier);
    EXPECT_EQ(plan.gather2, staging_direct_plan(layout));
    EXPECT_TRUE(plan.allreduce_ranges.empty());
    EXPECT_FALSE(plan.compact_allreduce);
    EXPECT_FALSE(plan.publish);
    EXPECT_EQ(plan.allreduce_count(), 0);
  }
}

TEST(ModelPlan, V2GathersPrefixFromPoolZeroFillsCurrentSlotsAndReducesCompactPages) {
  // v2: one IPC gather of the prefix with -1 sentinels on current slots (replacing the dense
  // zero-fill), then ONE sum all-reduce over the compact current pages. No barrier.
  const BatchLayout layout = layout_batch(tiny_setting(), tiny_batch());
  for (std::int32_t rank = 0; rank < 2; ++rank) {
    const VariantPlan plan = variant_plan(layout, Variant::v2, rank);
    expect_descriptors(plan.gather1, {d(1, 2), d(0, 1), kZ, kZ, kZ, kZ, kZ}, "v2 gather1");
    EXPECT_FALSE(plan.zero_dense);
    EXPECT_TRUE(plan.local_prefix_slots.empty());
    EXPECT_FALSE(plan.fill_to_staging);
    EXPECT_EQ(plan.own_current, kOwnCurrent[rank]);
    EXPECT_FALSE(plan.barrier);
    EXPECT_TRUE(plan.gather2.empty());
    EXPECT_TRUE(plan.allreduce_ranges.empty());
    EXPECT_TRUE(plan.compact_allreduce);
    EXPECT_EQ(plan.compact_pages, 5);  // every current page of the batch, own or not
    EXPECT_FALSE(plan.publish);
    EXPECT_EQ(plan.allreduce_count(), 1);
  }
}

TEST(ModelPlan, FusedArZeroesMaterializesOwnedPrefixAndReducesTheWholeBuffer) {
  // "as legacy, one whole-buffer sum all-reduce": the storage owner writes its prefix pages into a
  // zeroed buffer, the writer its current pages, then one AR over slots [0, 7).
  const BatchLayout layout = layout_batch(tiny_setting(), tiny_batch());
  for (std::int32_t rank = 0; rank < 2; ++rank) {
    const VariantPlan plan = variant_plan(layout, Variant::fused_ar, rank);
    EXPECT_TRUE(plan.zero_dense);
    EXPECT_EQ(plan.local_prefix_slots, kOwnedPrefixSlots[rank]);
    EXPECT_FALSE(plan.fill_to_staging);
    EXPECT_EQ(plan.own_current, kOwnCurrent[rank]);
    EXPECT_TRUE(plan.gather1.empty());
    EXPECT_TRUE(plan.gather2.empty());
    EXPECT_FALSE(plan.barrier);
    EXPECT_EQ(plan.allreduce_ranges, (std::vector<SlotRange>{{0, 7}}));
    EXPECT_FALSE(plan.compact_allreduce);
    EXPECT_EQ(plan.allreduce_count(), 1);
  }
}

TEST(ModelPlan, LegacySpanArReducesPrefixSpanThenCurrentSpanPerRequest) {
  // Section 7 counts 2 * bs all-reduces per layer and kind. Reading: the count is a function of bs
  // alone, so r1's empty prefix span still has its (empty) all-reduce, [4, 4). Every rank must
  // issue the same collectives in the same order, and bs is batch-logical, so this is safe.
  const BatchLayout layout = layout_batch(tiny_setting(), tiny_batch());
  for (std::int32_t rank = 0; rank < 2; ++rank) {
    const VariantPlan plan = variant_plan(layout, Variant::legacy_span_ar, rank);
    EXPECT_TRUE(plan.zero_dense);
    EXPECT_EQ(plan.local_prefix_slots, kOwnedPrefixSlots[rank]);
    EXPECT_EQ(plan.own_current, kOwnCurrent[rank]);
    EXPECT_TRUE(plan.gather1.empty());
    EXPECT_TRUE(plan.gather2.empty());
    EXPECT_FALSE(plan.barrier);
    EXPECT_EQ(plan.allreduce_ranges, (std::vector<SlotRange>{{0, 2}, {2, 4}, {4, 4}, {4, 7}}));
    EXPECT_EQ(plan.allreduce_count(), 4);
  }
}

TEST(ModelPlan, V2FallbackMaterializesOnlyOwnedPrefixPagesAndReducesTheWholeBuffer) {
  // No peer IPC: each rank copies the prefix pages its own pool holds (g % cp == rank) into a
  // zeroed buffer, and one whole-buffer sum AR completes it.
  const BatchLayout layout = layout_batch(tiny_setting(), tiny_batch());
  for (std::int32_t rank = 0; rank < 2; ++rank) {
    const VariantPlan plan = variant_plan(layout, Variant::v2_fallback, rank);
    EXPECT_TRUE(plan.zero_dense);
    EXPECT_EQ(plan.local_prefix_slots, kOwnedPrefixSlots[rank]);
    EXPECT_EQ(plan.own_current, kOwnCurrent[rank]);
    EXPECT_TRUE(plan.gather1.empty());
    EXPECT_TRUE(plan.gather2.empty());
    EXPECT_FALSE(plan.barrier);
    EXPECT_FALSE(plan.compact_allreduce);
    EXPECT_EQ(plan.allreduce_ranges, (std::vector<SlotRange>{{0, 7}}));
  }
}

TEST(ModelPlan, SymmDenseGathersPeersCurrentPagesFromTheWritersDenseAtTheSameSlot) {
  // Arena carved at identical offsets: the writer's dense buffer holds the page at the same slot.
  const BatchLayout layout = layout_batch(tiny_setting(), tiny_batch());
  const SlotDescriptor k = d(SlotDescriptor::kSkip, 0);
  const std::vector<SlotDescriptor> gather2[2] = {
      {k, k, k, d(3, 3), k, d(3, 5), d(3, 6)},  // rank 0 reads rank 1's slots 3, 5, 6
      {k, k, d(2, 2), k, d(2, 4), k, k},        // rank 1 reads rank 0's slots 2, 4
  };
  for (std::int32_t rank = 0; rank < 2; ++rank) {
    const VariantPlan plan = variant_plan(layout, Variant::symm_dense, rank);
    expect_prefix_gather(plan.gather1, layout, rank, SlotDescriptor::kSkip, "symm_dense gather1");
    EXPECT_TRUE(plan.barrier);
    expect_descriptors(plan.gather2, gather2[rank], "symm_dense gather2");
    // Peers copy whole pages from this rank's dense buffer: its partial pages need zero tails.
    EXPECT_TRUE(plan.zero_own_current);
    EXPECT_FALSE(plan.fill_to_staging);
    EXPECT_FALSE(plan.publish);
    EXPECT_EQ(plan.own_current, kOwnCurrent[rank]);
    EXPECT_EQ(plan.allreduce_count(), 0);
    EXPECT_TRUE(plan.local_prefix_slots.empty());
  }
}

TEST(ModelPlan, StagingPublishCopiesOwnPagesToStagingAndGathersPeersByCurrentIndex) {
  const BatchLayout layout = layout_batch(tiny_setting(), tiny_batch());
  const SlotDescriptor k = d(SlotDescriptor::kSkip, 0);
  const std::vector<SlotDescriptor> gather2[2] = {
      {k, k, k, d(3, 1), k, d(3, 3), d(3, 4)},  // rank 0 reads indices 1, 3, 4 of rank 1
      {k, k, d(2, 0), k, d(2, 2), k, k},        // rank 1 reads indices 0, 2 of rank 0
  };
  for (std::int32_t rank = 0; rank < 2; ++rank) {
    const VariantPlan plan = variant_plan(layout, Variant::staging_publish, rank);
    expect_prefix_gather(plan.gather1, layout, rank, SlotDescriptor::kSkip, "publish gather1");
    EXPECT_TRUE(plan.publish);
    EXPECT_TRUE(plan.barrier);
    expect_descriptors(plan.gather2, gather2[rank], "publish gather2");
    EXPECT_TRUE(plan.zero_own_current);  // the published whole pages must carry zero tails
    EXPECT_FALSE(plan.fill_to_staging);
    EXPECT_EQ(plan.own_current, kOwnCurrent[rank]);
    EXPECT_EQ(plan.allreduce_count(), 0);
  }
}

TEST(ModelPlan, EveryVariantsPlanIsTheSameOnEveryCallForTheSameBatch) {
  // Plan invariance (invariant 5): the plan depends only on the batch and the rank.
  const BatchLayout layout = layout_batch(tiny_setting(), tiny_batch());
  for (Variant v : kAllVariants) {
    for (std::int32_t rank = 0; rank < 2; ++rank) {
      const VariantPlan a = variant_plan(layout, v, rank);
      const VariantPlan b = variant_plan(layout_batch(tiny_setting(), tiny_batch()), v, rank);
      EXPECT_EQ(a.gather1, b.gather1) << to_string(v);
      EXPECT_EQ(a.gather2, b.gather2) << to_string(v);
      EXPECT_EQ(a.allreduce_ranges, b.allreduce_ranges) << to_string(v);
      EXPECT_EQ(a.own_current, b.own_current) << to_string(v);
    }
  }
}

TEST(ModelPlan, VariantNamesRoundTrip) {
  for (Variant v : kAllVariants) EXPECT_EQ(parse_variant(to_string(v)), v);
  EXPECT_EQ(to_string(Variant::staging_direct), "staging_direct");
  EXPECT_EQ(to_string(Variant::legacy_span_ar), "legacy_span_ar");
  EXPECT_FALSE(parse_variant("staging").has_value());
}

TEST(ModelVariants, EveryTableRowAgreesWithThePlanItBuilds) {
  // The row's facts (PROTOCOL.md sections 5 and 7) against the steps of the plan function beside them.
  const BatchLayout layout = layout_batch(tiny_setting(), tiny_batch());
  for (const VariantInfo& row : kVariantTable) {
    for (std::int32_t rank = 0; rank < 2; ++rank) {
      const VariantPlan plan = variant_plan(layout, row.variant, rank);
      const std::string where = std::string(row.name) + " rank " + std::to_string(rank);
      EXPECT_EQ(plan.variant, row.variant) << where;
      // IPC is needed exactly where a rank gathers from another rank's memory.
      EXPECT_EQ(row.needs_ipc, !plan.gather1.empty() || !plan.gather2.empty()) << where;
      EXPECT_EQ(plan.barrier, reads_peers_behind_barrier(row)) << where;
      EXPECT_EQ(plan.token_split, row.token_split) << where;
      EXPECT_EQ(plan.allgather_rank_rows > 0, row.peer_pages == PeerPages::all_gathered) << where;
      EXPECT_EQ(plan.fill_to_staging, row.fill_to_staging) << where;
      EXPECT_EQ(plan.publish, row.peer_pages == PeerPages::staging && !row.fill_to_staging) << where;
      EXPECT_EQ(plan.zero_dense, zeroes_dense(row.variant)) << where;
      EXPECT_EQ(plan.compact_allreduce, row.allreduce == AllReduceFamily::compact) << where;
      const bool dense_ranges = row.allreduce == AllReduceFamily::per_span || row.allreduce == AllReduceFamily::dense;
      EXPECT_EQ(!plan.allreduce_ranges.empty(), dense_ranges) << where;
      // The token-split rows' isolated exchange (the NCCL all-gather) waits for their GPU path.
      EXPECT_EQ(row.isolated == IsolatedExchange::none, !row.needs_ipc || row.token_split != TokenSplit::none) << where;
    }
  }
}

// The pages and launches one layer and kind of `plan` moves, read off its steps (PROTOCOL.md
// section 7: the publish and v2's pack run before the compose launch's signal, v2's unpack after its
// all-reduce).
LayerCounts counts_of_plan(const VariantPlan& plan, std::int32_t cp, std::int32_t page_size) {
  LayerCounts n;
  n.pulled_pages_from.assign(cp, 0);
  for (const auto* gather : {&plan.gather1, &plan.gather2}) {
    n.gathers += gather->empty() ? 0 : 1;
    for (const SlotDescriptor& d : *gather) {
      if (d.table_index >= 0) ++n.pulled_pages_from[d.table_index % cp];
    }
  }
  n.barriers = plan.barrier ? 1 : 0;
  n.allreduce_calls = plan.allreduce_count();
  for (const SlotRange& range : plan.allreduce_ranges) n.allreduce_pages += range.slot_end - range.slot_begin;
  n.allreduce_pages += plan.compact_pages;
  const auto own = static_cast<std::int64_t>(plan.own_current.size());
  n.pre_signal_pages = (plan.publish ? own : 0) + (plan.compact_allreduce ? own : 0);
  n.unpack_pages = plan.compact_allreduce ? plan.compact_pages : 0;
  // Section 12: the re-ordering writes every current page from the gathered rows.
  n.unpack_pages += static_cast<std::int64_t>(plan.reorder_source.size()) / page_size;
  n.allgather_calls = plan.token_split != TokenSplit::none ? 1 : 0;
  n.allgather_rows = n.allgather_calls * cp * plan.allgather_rank_rows;
  n.materialize_pages = static_cast<std::int64_t>(plan.local_prefix_slots.size());
  return n;
}

TEST(ModelVariants, EveryRowsClosedFormCountsAreThoseOfThePlanItBuilds) {
  // The cost model reads a variant's counts from its row (model/src/costs.cpp: layer_bytes_from_counts);
  // a row whose closed form drifts from its plan function would model bytes the backends never move.
  const Setting setting = tiny_setting();
  const BatchLayout layout = layout_batch(setting, tiny_batch());
  BatchCounts counts;
  count_batch(setting, tiny_batch(), counts);
  for (const VariantInfo& row : kVariantTable) {
    for (std::int32_t rank = 0; rank < 2; ++rank) {
      const LayerCounts want = counts_of_plan(variant_plan(layout, row.variant, rank), setting.cp, setting.page_size);
      const LayerCounts got = closed_form_counts(row.counts, counts, rank, row.token_split);
      const std::string where = std::string(row.name) + " rank " + std::to_string(rank);
      EXPECT_EQ(got.gathers, want.gathers) << where;
      EXPECT_EQ(got.barriers, want.barriers) << where;
      EXPECT_EQ(got.allreduce_calls, want.allreduce_calls) << where;
      EXPECT_EQ(got.allreduce_pages, want.allreduce_pages) << where;
      EXPECT_EQ(got.pre_signal_pages, want.pre_signal_pages) << where;
      EXPECT_EQ(got.unpack_pages, want.unpack_pages) << where;
      EXPECT_EQ(got.materialize_pages, want.materialize_pages) << where;
      EXPECT_EQ(got.pulled_pages_from, want.pulled_pages_from) << where;
      EXPECT_EQ(got.allgather_calls, want.allgather_calls) << where;
      EXPECT_EQ(got.allgather_rows, want.allgather_rows) << where;
    }
  }
  // By hand (model_tiny_batch.hpp): staging_direct's rank 0 reads page 2 and its own c0 c2 from
  // itself, page 5 and c1 c3 c4 from rank 1; legacy issues two calls per request over all 7 slots.
  EXPECT_EQ(closed_form_counts(info(Variant::staging_direct).counts, counts, 0).pulled_pages_from, (std::vector<std::int64_t>{3, 4}));
  EXPECT_EQ(closed_form_counts(info(Variant::legacy_span_ar).counts, counts, 1).allreduce_calls, 4);
  EXPECT_EQ(closed_form_counts(info(Variant::legacy_span_ar).counts, counts, 1).allreduce_pages, 7);
  EXPECT_EQ(closed_form_counts(info(Variant::v2).counts, counts, 1).pre_signal_pages, 3);
  // Section 12 by hand (below): 8 and 7 tokens per rank under either token split, so every rank
  // sends 8 rows (rank 1 one padding row) and one all-gather gathers 2 * 8 = 16; every current
  // page is re-ordered; only the prefix is gathered (page 2 from rank 0, page 5 from rank 1).
  for (Variant v : {Variant::allgather_zigzag, Variant::allgather_continuous}) {
    const LayerCounts n = closed_form_counts(info(v).counts, counts, 1, info(v).token_split);
    EXPECT_EQ(n.allgather_calls, 1) << to_string(v);
    EXPECT_EQ(n.allgather_rows, 16) << to_string(v);
    EXPECT_EQ(n.unpack_pages, 5) << to_string(v);
    EXPECT_EQ(n.pulled_pages_from, (std::vector<std::int64_t>{1, 1})) << to_string(v);
    EXPECT_EQ(n.barriers, 0) << to_string(v);
  }
  EXPECT_EQ(counts.max_rank_tokens[static_cast<std::size_t>(TokenSplit::zigzag)], 8);
  EXPECT_EQ(counts.max_rank_tokens[static_cast<std::size_t>(TokenSplit::continuous)], 8);
}

// Section 12 on the tiny batch, by hand (cp 2, P 4, 2*cp = 4 token blocks):
//   zigzag, r0 (6 tokens): blocks of 2,2,1,1 -> t0 t1 rank 0, t2 t3 rank 1, t4 rank 1, t5 rank 0;
//           r1 (9 tokens): blocks of 3,2,2,2 -> t0..t2 rank 0, t3..t6 rank 1, t7 t8 rank 0.
//     rank 0 sends r0 t0 t1 t5, r1 t0 t1 t2 t7 t8 (8 rows); rank 1 r0 t2 t3 t4, r1 t3..t6 (7 + 1 padding).
//   continuous (token t to rank t % 2): rank 0 sends r0 t0 t2 t4, r1 t0 t2 t4 t6 t8 (8);
//     rank 1 r0 t1 t3 t5, r1 t1 t3 t5 t7 (7 + 1 padding).
//   Gathered row of a token: owner * 8 + its position among the owner's rows. Current rows by
//   current index (4 rows each): r0's pages 0 1, r1's pages 2 3 4; -1 past a partial page's end.
TEST(ModelPlan, TokenSplitAllGatherPlansOfTheTinyBatchByHand) {
  const BatchLayout layout = layout_batch(tiny_setting(), tiny_batch());
  const std::vector<std::int64_t> zigzag = {0, 1, 8, 9, /**/ 10, 2, -1, -1, /**/ 3, 4, 5, 11, /**/ 12, 13, 14, 6, /**/ 7, -1, -1, -1};
  const std::vector<std::int64_t> continuous = {0, 8, 1, 9, /**/ 2, 10, -1, -1, /**/ 3, 11, 4, 12, /**/ 5, 13, 6, 14, /**/ 7, -1, -1, -1};
  const std::vector<std::int64_t> own_zigzag[2] = {{0, 1, 2, 3, 4}, {0, 1, 2, 3}};
  const std::vector<std::int64_t> own_continuous[2] = {{0, 1, 2, 3, 4}, {0, 1, 2, 3}};
  for (std::int32_t rank = 0; rank < 2; ++rank) {
    const VariantPlan z = variant_plan(layout, Variant::allgather_zigzag, rank);
    EXPECT_EQ(z.token_split, TokenSplit::zigzag);
    EXPECT_EQ(z.allgather_rank_rows, 8);
    EXPECT_EQ(z.reorder_source, zigzag);
    EXPECT_EQ(z.own_current, own_zigzag[rank]);
    const VariantPlan c = variant_plan(layout, Variant::allgather_continuous, rank);
    EXPECT_EQ(c.allgather_rank_rows, 8);
    EXPECT_EQ(c.reorder_source, continuous);
    EXPECT_EQ(c.own_current, own_continuous[rank]);
    // No staging, no barrier, no all-reduce: the prefix slots from their owners' pools, nothing else gathered.
    for (const VariantPlan* plan : {&z, &c}) {
      expect_descriptors(plan->gather1, {d(1, 2), d(0, 1), d(SlotDescriptor::kSkip, 0), d(SlotDescriptor::kSkip, 0), d(SlotDescriptor::kSkip, 0),
                                          d(SlotDescriptor::kSkip, 0), d(SlotDescriptor::kSkip, 0)}, "token-split gather1");
      EXPECT_TRUE(plan->gather2.empty());
      EXPECT_FALSE(plan->barrier);
      EXPECT_FALSE(plan->fill_to_staging);
      EXPECT_EQ(plan->allreduce_count(), 0);
    }
  }
  // Their layer bytes (section 12: one all-gather of cp * max_rank_tokens rows per kind, padding
  // counted; a ring all-gather receives (cp - 1) / cp of it from the ring predecessor):
  //   F layer (788 B a row, both kinds): 16 rows = 12608 B gathered, 6304 received from the peer;
  //   rank 0 also gathers page 5 (3152 B) from rank 1 and page 2 (3152 B) from itself; the
  //   re-ordering copies 5 pages = 15760 B. S layer (656 B): 10496, 5248, 2624, 13120.
  const VariantPlan z0 = variant_plan(layout, Variant::allgather_zigzag, 0);
  const LayerBytes full = layer_bytes(tiny_setting(), z0, kFullLayer);
  EXPECT_EQ(full.allgather_bytes, 12608u);
  EXPECT_EQ(full.allgathers, 2);
  EXPECT_EQ(full.pulled_from, (std::vector<std::uint64_t>{3152, 3152 + 6304}));
  EXPECT_EQ(full.local_copy_bytes, 15760u);
  EXPECT_EQ(full.gathers, 2);
  EXPECT_EQ(full.barriers, 0);
  const LayerBytes shared = layer_bytes(tiny_setting(), z0, kSharedLayer);
  EXPECT_EQ(shared.allgather_bytes, 10496u);
  EXPECT_EQ(shared.allgathers, 1);
  EXPECT_EQ(shared.pulled_from, (std::vector<std::uint64_t>{2624, 2624 + 5248}));
  EXPECT_EQ(shared.local_copy_bytes, 13120u);
}

TEST(ModelPlan, AContinuousBatchWhoseTokensDoNotDivideByCpIsPaddedNotRefused) {
  // cp 4, one request of 5 tokens: continuous gives rank 0 t0 t4 and ranks 1..3 one token each;
  // every rank sends 2 rows (ranks 1..3 one padding row), 4 * 2 = 8 gathered.
  Setting setting = tiny_setting();
  setting.cp = 4;
  Batch batch;
  batch.requests.push_back(Request{.prefix_len = 0, .extend_len = 5, .prefix_pages = {}});
  const BatchLayout layout = layout_batch(setting, batch);
  const VariantPlan plan = variant_plan(layout, Variant::allgather_continuous, 3);
  EXPECT_EQ(plan.allgather_rank_rows, 2);
  EXPECT_EQ(plan.reorder_source, (std::vector<std::int64_t>{0, 2, 4, 6, /**/ 1, -1, -1, -1}));
  EXPECT_EQ(plan.own_current, (std::vector<std::int64_t>{0}));
}

TEST(ModelVariants, NamesPathsAndBarrierVariantsComeFromTheTable) {
  EXPECT_EQ(variant_names(),
            "legacy_span_ar, fused_ar, v2, v2_fallback, symm_dense, staging_publish, staging_direct, allgather_zigzag, allgather_continuous");
  for (Variant v : kAllVariants) {
    EXPECT_EQ(path_variant(v, /*ipc_on_every_rank=*/true), v) << to_string(v);
    EXPECT_EQ(path_variant(v, /*ipc_on_every_rank=*/false), info(v).needs_ipc ? Variant::v2_fallback : v) << to_string(v);
  }
  EXPECT_FALSE(info(Variant::v2_fallback).needs_ipc);  // the fallback must not need what it replaces
  const std::array<Variant, 3> expected = {Variant::staging_direct, Variant::staging_publish, Variant::symm_dense};
  EXPECT_EQ(barrier_variants(), expected);
}

TEST(ModelPlan, DensePageInverseMapsEachOwnTokenToSlotTimesPagePlusOffset) {
  // Rank 0 writes index 0 (r0 tokens 8..11, slot 2) and index 2 (r1 tokens 0..3, slot 4).
  // Rank 1 writes index 1 (r0 tokens 12..13, slot 3), 3 (r1 tokens 4..7, slot 5), 4 (r1 token 8,
  // slot 6). Only real tokens appear: the partial pages' tails have none.
  const Batch batch = tiny_batch();
  const BatchLayout layout = layout_batch(tiny_setting(), batch);
  const PageInverse r0 = page_inverse(layout, batch, 0, InverseTarget::dense);
  ASSERT_EQ(r0.tokens.size(), 8u);
  const std::int32_t r0_req[] = {0, 0, 0, 0, 1, 1, 1, 1};
  const std::int64_t r0_tok[] = {8, 9, 10, 11, 0, 1, 2, 3};
  for (std::size_t t = 0; t < 8; ++t) {
    EXPECT_EQ(r0.tokens[t].request, r0_req[t]) << t;
    EXPECT_EQ(r0.tokens[t].token, r0_tok[t]) << t;
  }
  EXPECT_EQ(r0.dest_row, (std::vector<std::int64_t>{8, 9, 10, 11, 16, 17, 18, 19}));

  const PageInverse r1 = page_inverse(layout, batch, 1, InverseTarget::dense);
  ASSERT_EQ(r1.tokens.size(), 7u);
  const std::int32_t r1_req[] = {0, 0, 1, 1, 1, 1, 1};
  const std::int64_t r1_tok[] = {12, 13, 4, 5, 6, 7, 8};
  for (std::size_t t = 0; t < 7; ++t) {
    EXPECT_EQ(r1.tokens[t].request, r1_req[t]) << t;
    EXPECT_EQ(r1.tokens[t].token, r1_tok[t]) << t;
  }
  EXPECT_EQ(r1.dest_row, (std::vector<std::int64_t>{12, 13, 20, 21, 22, 23, 24}));
}

TEST(ModelPlan, StagingPageInverseRetargetsTheSameTokensToCurrentIndexTimesPagePlusOffset) {
  // Same fill, different table: the token list is unchanged, rows become i * P + offset.
  const Batch batch = tiny_batch();
  const BatchLayout layout = layout_batch(tiny_setting(), batch);
  for (std::int32_t rank = 0; rank < 2; ++rank) {
    const PageInverse dense = page_inverse(layout, batch, rank, InverseTarget::dense);
    const PageInverse staging = page_inverse(layout, batch, rank, InverseTarget::staging);
    ASSERT_EQ(staging.tokens.size(), dense.tokens.size());
    for (std::size_t t = 0; t < dense.tokens.size(); ++t) {
      EXPECT_EQ(staging.tokens[t].request, dense.tokens[t].request);
      EXPECT_EQ(staging.tokens[t].token, dense.tokens[t].token);
    }
  }
  EXPECT_EQ(page_inverse(layout, batch, 0, InverseTarget::staging).dest_row,
            (std::vector<std::int64_t>{0, 1, 2, 3, 8, 9, 10, 11}));
  EXPECT_EQ(page_inverse(layout, batch, 1, InverseTarget::staging).dest_row,
            (std::vector<std::int64_t>{4, 5, 12, 13, 14, 15, 16}));
}

void expect_segments(const RaggedIndexPlan& plan, const std::vector<RaggedSegment>& expected) {
  ASSERT_EQ(plan.segments.size(), expected.size()) << "rank " << plan.rank;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const RaggedSegment& a = plan.segments[i];
    const RaggedSegment& e = expected[i];
    EXPECT_EQ(a.request, e.request) << "segment " << i;
    EXPECT_EQ(a.q_start, e.q_start) << "segment " << i;
    EXPECT_EQ(a.q_len, e.q_len) << "segment " << i;
    EXPECT_EQ(a.q_base, e.q_base) << "segment " << i;
    EXPECT_EQ(a.kv_len, e.kv_len) << "segment " << i;
    EXPECT_EQ(a.k_base, e.k_base) << "segment " << i;
    EXPECT_EQ(a.current_base, e.current_base) << "segment " << i;
  }
}

TEST(ModelPlan, RaggedIndexPlanGivesOneSegmentPerRunOfOwnPagesWithKvLenAndBases) {
  // kv_len = prefix_len + q_base + q_len; k_base = request_first_slot * P; current_base =
  // request_first_current_slot * P (r0: 0 and 8; r1: 16 and 16).
  // Rank 0: r0 page 0 (extend tokens 0..3), r1 page 0 (0..3).
  // Rank 1: r0 page 1 (extend 4..5), r1 pages 1..2 (extend 4..8), one run of two pages.
  const Batch batch = tiny_batch();
  const BatchLayout layout = layout_batch(tiny_setting(), batch);
  const RaggedIndexPlan r0 = ragged_index_plan(layout, batch, 0);
  EXPECT_EQ(r0.rank, 0);
  EXPECT_EQ(r0.q_tokens_total, 8);
  expect_segments(r0, {{.request = 0, .q_start = 0, .q_len = 4, .q_base = 0, .kv_len = 12, .k_base = 0, .current_base = 8},
                       {.request = 1, .q_start = 4, .q_len = 4, .q_base = 0, .kv_len = 4, .k_base = 16, .current_base = 16}});
  const RaggedIndexPlan r1 = ragged_index_plan(layout, batch, 1);
  EXPECT_EQ(r1.q_tokens_total, 7);
  expect_segments(r1, {{.request = 0, .q_start = 0, .q_len = 2, .q_base = 4, .kv_len = 14, .k_base = 0, .current_base = 8},
                       {.request = 1, .q_start = 2, .q_len = 5, .q_base = 4, .kv_len = 9, .k_base = 16, .current_base = 16}});
}

TEST(ModelPlan, RaggedIndexPlanSplitsZigzagOuterBlocksIntoTwoSegments) {
  // One request, prefix 4 (page 3), extend 14 -> C = 4, blocks of 1 page; rank 0 owns blocks 0
  // and 3 (pages 0 and 3, not adjacent: two segments), rank 1 blocks 1 and 2 (one run).
  // Slots: prefix 0, current 1..4, so current_base = 4. Page 3 is partial (extend 12..13).
  Batch batch;
  batch.requests.push_back(Request{.prefix_len = 4, .extend_len = 14, .prefix_pages = {3}});
  const BatchLayout layout = layout_batch(tiny_setting(), batch);
  const RaggedIndexPlan r0 = ragged_index_plan(layout, batch, 0);
  EXPECT_EQ(r0.q_tokens_total, 6);
  expect_segments(r0, {{.request = 0, .q_start = 0, .q_len = 4, .q_base = 0, .kv_len = 8, .k_base = 0, .current_base = 4},
                       {.request = 0, .q_start = 4, .q_len = 2, .q_base = 12, .kv_len = 18, .k_base = 0, .current_base = 4}});
  const RaggedIndexPlan r1 = ragged_index_plan(layout, batch, 1);
  EXPECT_EQ(r1.q_tokens_total, 8);
  expect_segments(r1, {{.request = 0, .q_start = 0, .q_len = 8, .q_base = 4, .kv_len = 16, .k_base = 0, .current_base = 4}});
}

TEST(ModelPlan, RaggedIndexPlanOfARankWithNoPagesIsEmpty) {
  // cp = 4: r0 (C = 2) goes to ranks 0, 1; r1 (C = 3) to ranks 0, 1, 2; rank 3 computes nothing.
  Setting s = tiny_setting();
  s.cp = 4;
  const Batch batch = tiny_batch();
  const RaggedIndexPlan r3 = ragged_index_plan(layout_batch(s, batch), batch, 3);
  EXPECT_EQ(r3.q_tokens_total, 0);
  EXPECT_TRUE(r3.segments.empty());
  const RaggedIndexPlan r2 = ragged_index_plan(layout_batch(s, batch), batch, 2);
  EXPECT_EQ(r2.q_tokens_total, 1);  // r1 page 2: extend token 8 only
}

// ---- Byte counts. Layer 1 ('S') moves kv_fp8 only: one page is 2624 B. Layer 0 ('F') moves both
// kinds: 3152 B per page. Gather bytes go to the source rank table_index % cp; a kZeroFill or kSkip
// slot reads nothing. All-reduce: ring receive 2*(cp-1)/cp*N (= N at cp = 2) from rank - 1 mod cp.
// Operation counts are checked on layer 1 only: with one kind active, "per layer" and "per layer
// and buffer kind" (section 7's table) give the same numbers.

TEST(ModelPlan, StagingDirectBytesCountIndexerOnlyOnFullLayers) {
  // Both ranks: rank-0 sources are slots 1, 2, 4 (3 pages), rank-1 sources slots 0, 3, 5, 6 (4).
  const Setting s = tiny_setting();
  const BatchLayout layout = layout_batch(s, tiny_batch());
  for (std::int32_t rank = 0; rank < 2; ++rank) {
    const VariantPlan plan = variant_plan(layout, Variant::staging_direct, rank);
    const LayerBytes shared = layer_bytes(s, plan, kSharedLayer);
    EXPECT_EQ(shared.own_rank, rank);
    EXPECT_EQ(shared.pulled_from, (std::vector<std::uint64_t>{3 * kKvPageBytes, 4 * kKvPageBytes}));
    EXPECT_EQ(shared.pulled_from_peers(), (rank == 0 ? 4 : 3) * kKvPageBytes);
    EXPECT_EQ(shared.allreduce_bytes, 0u);
    EXPECT_EQ(shared.local_copy_bytes, 0u);
    EXPECT_EQ(shared.allreduces, 0);
    EXPECT_EQ(shared.barriers, 1);
    EXPECT_EQ(shared.gathers, 1);
    const LayerBytes full = layer_bytes(s, plan, kFullLayer);
    EXPECT_EQ(full.pulled_from,
              (std::vector<std::uint64_t>{3 * kBothKindsPageBytes, 4 * kBothKindsPageBytes}));
  }
}

TEST(ModelPlan, V2BytesAreThePrefixGatherPlusTheCompactRingVolumeFromThePredecessor) {
  // gather1: slot 0 from rank 1, slot 1 from rank 0. Compact AR N = 5 pages * 2624 = 13120,
  // ring receive at cp = 2 equals N, from rank (rank - 1) mod 2 = the other rank.
  const Setting s = tiny_setting();
  const BatchLayout layout = layout_batch(s, tiny_batch());
  const LayerBytes r0 = layer_bytes(s, variant_plan(layout, Variant::v2, 0), kSharedLayer);
  EXPECT_EQ(r0.pulled_from, (std::vector<std::uint64_t>{2624, 2624 + 13120}));
  EXPECT_EQ(r0.allreduce_bytes, 13120u);
  EXPECT_EQ(r0.allreduces, 1);
  EXPECT_EQ(r0.gathers, 1);
  EXPECT_EQ(r0.barriers, 0);
  const LayerBytes r1 = layer_bytes(s, variant_plan(layout, Variant::v2, 1), kSharedLayer);
  EXPECT_EQ(r1.pulled_from, (std::vector<std::uint64_t>{2624 + 13120, 2624}));
  EXPECT_EQ(r1.pulled_from_peers(), 2624u + 13120u);
}

TEST(ModelPlan, WholeBufferArBytesAreTheRingVolumeOfAllSlotsAndOwnedPrefixIsALocalCopy) {
  // fused_ar and v2_fallback: N = 7 slots * 2624 = 18368; rank 0 materializes slot 1 (page 2),
  // rank 1 slot 0 (page 5): one page of local copy each.
  const Setting s = tiny_setting();
  const BatchLayout layout = layout_batch(s, tiny_batch());
  for (Variant v : {Variant::fused_ar, Variant::v2_fallback}) {
    const LayerBytes r0 = layer_bytes(s, variant_plan(layout, v, 0), kSharedLayer);
    EXPECT_EQ(r0.pulled_from, (std::vector<std::uint64_t>{0, 18368})) << to_string(v);
    EXPECT_EQ(r0.allreduce_bytes, 18368u) << to_string(v);
    EXPECT_EQ(r0.local_copy_bytes, kKvPageBytes) << to_string(v);
    EXPECT_EQ(r0.allreduces, 1) << to_string(v);
    EXPECT_EQ(r0.gathers, 0) << to_string(v);
    EXPECT_EQ(r0.barriers, 0) << to_string(v);
    const LayerBytes r1 = layer_bytes(s, variant_plan(layout, v, 1), kSharedLayer);
    EXPECT_EQ(r1.pulled_from, (std::vector<std::uint64_t>{18368, 0})) << to_string(v);
    // Layer 0 reduces both kinds: N = 7 * 3152 = 22064.
    const LayerBytes f = layer_bytes(s, variant_plan(layout, v, 1), kFullLayer);
    EXPECT_EQ(f.allreduce_bytes, 22064u) << to_string(v);
    EXPECT_EQ(f.pulled_from, (std::vector<std::uint64_t>{22064, 0})) << to_string(v);
  }
}

TEST(ModelPlan, LegacySpanArBytesSumOverItsFourSpans) {
  // Spans of 2, 2, 0, 3 slots: N = 7 * 2624 = 18368 in 4 all-reduces.
  const Setting s = tiny_setting();
  const BatchLayout layout = layout_batch(s, tiny_batch());
  const LayerBytes r0 = layer_bytes(s, variant_plan(layout, Variant::legacy_span_ar, 0), kSharedLayer);
  EXPECT_EQ(r0.allreduce_bytes, 18368u);
  EXPECT_EQ(r0.pulled_from, (std::vector<std::uint64_t>{0, 18368}));
  EXPECT_EQ(r0.allreduces, 4);
  EXPECT_EQ(r0.local_copy_bytes, kKvPageBytes);
}

TEST(ModelPlan, SymmDenseAndStagingPublishPullPrefixThenPeersCurrentPages) {
  // gather1: one prefix page from each rank. gather2: rank 0 reads 3 pages of rank 1, rank 1
  // reads 2 pages of rank 0. staging_publish also copies its own pages (2 and 3) locally.
  const Setting s = tiny_setting();
  const BatchLayout layout = layout_batch(s, tiny_batch());
  for (Variant v : {Variant::symm_dense, Variant::staging_publish}) {
    const LayerBytes r0 = layer_bytes(s, variant_plan(layout, v, 0), kSharedLayer);
    EXPECT_EQ(r0.pulled_from, (std::vector<std::uint64_t>{2624, 2624 + 3 * 2624})) << to_string(v);
    EXPECT_EQ(r0.gathers, 2) << to_string(v);
    EXPECT_EQ(r0.barriers, 1) << to_string(v);
    EXPECT_EQ(r0.allreduces, 0) << to_string(v);
    EXPECT_EQ(r0.allreduce_bytes, 0u) << to_string(v);
    const LayerBytes r1 = layer_bytes(s, variant_plan(layout, v, 1), kSharedLayer);
    EXPECT_EQ(r1.pulled_from, (std::vector<std::uint64_t>{2624 + 2 * 2624, 2624})) << to_string(v);
  }
  EXPECT_EQ(layer_bytes(s, variant_plan(layout, Variant::symm_dense, 0), kSharedLayer).local_copy_bytes, 0u);
  EXPECT_EQ(layer_bytes(s, variant_plan(layout, Variant::staging_publish, 0), kSharedLayer).local_copy_bytes,
            2 * kKvPageBytes);
  EXPECT_EQ(layer_bytes(s, variant_plan(layout, Variant::staging_publish, 1), kSharedLayer).local_copy_bytes,
            3 * kKvPageBytes);
}

TEST(ModelPlan, RingAllReduceVolumeAtFourRanksComesFromThePredecessor) {
  // cp = 4, one request (prefix page 6, extend 5 -> 2 current pages): 3 slots, N = 3 * 2624 = 7872,
  // ring receive 2 * 3 / 4 * 7872 = 11808, all from rank (r - 1) mod 4.
  Setting s = tiny_setting();
  s.cp = 4;
  s.layer_pattern = "S";
  Batch batch;
  batch.requests.push_back(Request{.prefix_len = 4, .extend_len = 5, .prefix_pages = {6}});
  const BatchLayout layout = layout_batch(s, batch);
  for (std::int32_t rank = 0; rank < 4; ++rank) {
    const LayerBytes b = layer_bytes(s, variant_plan(layout, Variant::fused_ar, rank), 0);
    std::vector<std::uint64_t> expected(4, 0);
    expected[(rank + 3) % 4] = 11808;
    EXPECT_EQ(b.pulled_from, expected) << "rank " << rank;
    EXPECT_EQ(b.allreduce_bytes, 7872u);
  }
}

// `cpkv plan` prints a rank's tokens as runs (first, count, step). Each run is as long as it can be,
// but two tokens with a step other than 1 are not a run: a zigzag rank at cp 3 with blocks of one
// and three tokens (3 | 10 11 12) prints "3" and "10..12", not "3..10 step 7" and "11..12".
// Continuous (t % cp) gives one run of step cp per request; a new request starts a new run.
TEST(ModelTokenPlan, TokenRunsAreMaximalAndTakeAStepOtherThanOneOnlyOverThreeOrMoreTokens) {
  EXPECT_EQ(token_runs({{0, 3}, {0, 10}, {0, 11}, {0, 12}}), (std::vector<TokenRun>{{0, 3, 1, 1}, {0, 10, 3, 1}}));
  EXPECT_EQ(token_runs({{0, 1}, {0, 4}, {0, 7}, {1, 1}, {1, 4}}), (std::vector<TokenRun>{{0, 1, 3, 3}, {1, 1, 1, 1}, {1, 4, 1, 1}}));
  EXPECT_EQ(token_runs({{0, 0}, {0, 1}, {1, 0}, {1, 1}}), (std::vector<TokenRun>{{0, 0, 2, 1}, {1, 0, 2, 1}}));
  EXPECT_EQ(token_runs({{2, 5}}), (std::vector<TokenRun>{{2, 5, 1, 1}}));
  EXPECT_TRUE(token_runs({}).empty());
}

}  // namespace
}  // namespace cpkv::model

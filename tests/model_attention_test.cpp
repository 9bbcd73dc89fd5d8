// Invariant 9 (PROTOCOL.md section 11): the plain oracle of each rank's attention plan and the
// located checker. Every expectation is computed by hand from section 11 on the tiny batch
// (tests/model_tiny_batch.hpp), not from the code's output:
//
//   r0: prefix 8, extend 6 -> k_base 0 (its span: 8 prefix rows + 2 pages of 4 = 16 rows)
//       page 0 (tokens 0..3) rank 0, page 1 (tokens 4..5) rank 1
//   r1: prefix 0, extend 9 -> k_base 16
//       page 0 (tokens 0..3) rank 0, page 1 (4..7) rank 1, page 2 (8) rank 1
//   rank 0: (r0, q_base 0, q_len 4, kv_len 8+0+4 = 12, k_base 0), (r1, 0, 4, 0+0+4 = 4, 16)
//   rank 1: (r0, 4, 2, 8+4+2 = 14, 0), (r1, 4, 5, 0+4+5 = 9, 16)
#include <gtest/gtest.h>

#include <random>

#include "cpkv/model/attention.hpp"
#include "cpkv/model/batch.hpp"
#include "cpkv/model/plan.hpp"
#include "model_tiny_batch.hpp"

namespace cpkv::model {
namespace {

using testing::tiny_batch;
using testing::tiny_setting;

const std::vector<AttentionSegment> kRank0 = {{0, 0, 4, 12, 0}, {1, 0, 4, 4, 16}};
const std::vector<AttentionSegment> kRank1 = {{0, 4, 2, 14, 0}, {1, 4, 5, 9, 16}};

TEST(AttentionOracle, TheTinyBatchsPlansAreSection11s) {
  EXPECT_EQ(expected_attention_plan(tiny_setting(), tiny_batch(), 0), kRank0);
  EXPECT_EQ(expected_attention_plan(tiny_setting(), tiny_batch(), 1), kRank1);
  EXPECT_EQ(request_key_base(4, tiny_batch()), (std::vector<std::int64_t>{0, 16}));
}

TEST(AttentionOracle, TheCorrectPlansPassAndCoverEveryTokenOnce) {
  EXPECT_FALSE(check_attention_plan(tiny_setting(), tiny_batch(), 0, kRank0));
  EXPECT_FALSE(check_attention_plan(tiny_setting(), tiny_batch(), 1, kRank1));
  EXPECT_FALSE(check_attention_coverage(tiny_batch(), {kRank0, kRank1}));
}

TEST(AttentionOracle, ASegmentSplitInTwoIsStillTheSamePlan) {
  // The neutral form does not demand maximal runs: r1's tokens 4..8 on rank 1 as 4..5 and 6..8.
  const std::vector<AttentionSegment> split = {{0, 4, 2, 14, 0}, {1, 4, 2, 6, 16}, {1, 6, 3, 9, 16}};
  EXPECT_FALSE(check_attention_plan(tiny_setting(), tiny_batch(), 1, split));
}

TEST(AttentionOracle, TheBatchTakenAsOneSequenceIsNamed) {
  // r1's kv_len counts r0's 8 + 6 = 14 keys too: 9 + 14 = 23.
  std::vector<AttentionSegment> plan = kRank1;
  plan[1].kv_len = 23;
  const auto f = check_attention_plan(tiny_setting(), tiny_batch(), 1, plan);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->segment, 1);
  EXPECT_EQ(f->request, 1);
  EXPECT_EQ(f->token_first, 4);
  EXPECT_EQ(f->token_last, 8);
  EXPECT_EQ(f->field, "kv_len");
  EXPECT_EQ(f->expected, 9);
  EXPECT_EQ(f->got, 23);
  EXPECT_EQ(f->describe(1, 0),
            "invariant 9 (attention plan exactness): rank 1 batch 0: segment 1 (request 1 tokens 4..8): q_len 5 kv_len 23, the request "
            "needs kv_len 9: kv_len counts request 0's 14 keys too: the batch taken as one sequence?");
}

TEST(AttentionOracle, CausalOffByOneIsNamed) {
  std::vector<AttentionSegment> plan = kRank0;
  plan[0].kv_len = 11;
  const auto f = check_attention_plan(tiny_setting(), tiny_batch(), 0, plan);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->field, "kv_len");
  EXPECT_NE(f->why.find("causal off by one"), std::string::npos) << f->detail();
}

TEST(AttentionOracle, AKeyBaseThatSkipsThePrefixIsNamed) {
  std::vector<AttentionSegment> plan = kRank0;
  plan[0].k_base = 8;  // r0's first current row
  const auto f = check_attention_plan(tiny_setting(), tiny_batch(), 0, plan);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->field, "k_base");
  EXPECT_EQ(f->expected, 0);
  EXPECT_EQ(f->got, 8);
  EXPECT_EQ(f->why, "k_base is the current span's: the prefix was skipped?");
}

TEST(AttentionOracle, AQueryOfAnotherRankIsNamed) {
  // Rank 0 claims r1's token 4, which rank 1 computes (page 1).
  const std::vector<AttentionSegment> plan = {{0, 0, 4, 12, 0}, {1, 0, 5, 5, 16}};
  const auto f = check_attention_plan(tiny_setting(), tiny_batch(), 0, plan);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->field, "queries");
  EXPECT_NE(f->what.find("token 4 of request 1"), std::string::npos) << f->detail();
}

TEST(AttentionOracle, AMissingQueryIsNamed) {
  const std::vector<AttentionSegment> plan = {kRank1[0]};
  const auto f = check_attention_plan(tiny_setting(), tiny_batch(), 1, plan);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->field, "queries");
  EXPECT_NE(f->what.find("token 4 of request 1 is no query"), std::string::npos) << f->detail();
}

TEST(AttentionOracle, SegmentsOutsideTheBatchAreNamedBeforeAnythingElse) {
  EXPECT_EQ(check_attention_plan(tiny_setting(), tiny_batch(), 0, std::vector<AttentionSegment>{{2, 0, 1, 1, 0}})->field, "request");
  EXPECT_EQ(check_attention_plan(tiny_setting(), tiny_batch(), 0, std::vector<AttentionSegment>{{0, 0, 0, 8, 0}})->field, "q_len");
  EXPECT_EQ(check_attention_plan(tiny_setting(), tiny_batch(), 0, std::vector<AttentionSegment>{{0, 5, 2, 15, 0}})->field, "q_base");
}

TEST(AttentionOracle, ATokenOnTwoRanksOrOnNoneIsNamed) {
  std::vector<AttentionSegment> both = kRank0;
  both[1].q_len = 5;  // r1 token 4 on rank 0 too
  const auto twice = check_attention_coverage(tiny_batch(), {both, kRank1});
  ASSERT_TRUE(twice);
  EXPECT_EQ(twice->what, "token 4 of request 1 is a query on ranks 0 and 1");
  const auto none = check_attention_coverage(tiny_batch(), {kRank0, {kRank1[0]}});
  ASSERT_TRUE(none);
  EXPECT_EQ(none->what, "token 4 of request 1 is a query on no rank");
}

TEST(AttentionOracle, TokenSplitsAreSection12s) {
  // Zigzag tokens at cp 2: r0's 6 tokens in 4 blocks of 2, 2, 1, 1 -> rank 0 blocks 0 and 3
  // (tokens 0, 1 and 5), rank 1 blocks 1 and 2 (2, 3, 4). r1's 9 tokens: 3, 2, 2, 2 -> rank 0
  // 0..2 and 7..8, rank 1 3..6.
  const std::vector<AttentionSegment> zig0 = {{0, 0, 2, 10, 0}, {0, 5, 1, 14, 0}, {1, 0, 3, 3, 16}, {1, 7, 2, 9, 16}};
  EXPECT_EQ(expected_attention_plan(tiny_setting(), tiny_batch(), 0, QuerySplit::zigzag_tokens), zig0);
  // Continuous: token t to rank t % 2; rank 1 holds r0's 1, 3, 5 and r1's 1, 3, 5, 7.
  const auto cont1 = expected_attention_plan(tiny_setting(), tiny_batch(), 1, QuerySplit::continuous_tokens);
  ASSERT_EQ(cont1.size(), 7u);
  EXPECT_EQ(cont1[0], (AttentionSegment{0, 1, 1, 10, 0}));
  EXPECT_EQ(cont1[6], (AttentionSegment{1, 7, 1, 8, 16}));
}

// The model's ragged index plan (the seeds' _CpRaggedIndexPlan) is one implementation the oracle
// checks: on seeded random batches, every split and cp, it passes on every rank.
TEST(AttentionOracle, TheRaggedIndexPlanPassesTheOracle) {
  std::mt19937_64 rng(20261204);
  for (int trial = 0; trial < 300; ++trial) {
    Setting setting = tiny_setting();
    setting.cp = 1 + static_cast<std::int32_t>(rng() % 8);
    setting.page_size = 1 << (rng() % 4);
    setting.split = static_cast<SplitPolicy>(rng() % 3);
    setting.pool_pages = 64;
    Batch batch;
    const int requests = 1 + static_cast<int>(rng() % 5);
    for (int r = 0; r < requests; ++r) {
      Request req;
      const auto prefix_pages = static_cast<std::int64_t>(rng() % 3);
      req.prefix_len = prefix_pages * setting.page_size;
      for (std::int64_t k = 0; k < prefix_pages; ++k) req.prefix_pages.push_back(static_cast<std::int64_t>(rng() % 64));
      req.extend_len = 1 + static_cast<std::int64_t>(rng() % 40);
      batch.requests.push_back(req);
    }
    const BatchLayout layout = layout_batch(setting, batch);
    std::vector<std::vector<AttentionSegment>> all;
    for (std::int32_t rank = 0; rank < setting.cp; ++rank) {
      const auto segments = attention_segments(ragged_index_plan(layout, batch, rank));
      const auto f = check_attention_plan(batch, layout, setting.split, rank, segments);
      ASSERT_FALSE(f) << "trial " << trial << ": " << f->describe(rank, 0);
      EXPECT_EQ(segments, expected_attention_plan(setting, batch, rank)) << "trial " << trial << " rank " << rank;
      all.push_back(segments);
    }
    ASSERT_FALSE(check_attention_coverage(batch, all)) << "trial " << trial;
  }
}

}  // namespace
}  // namespace cpkv::model

// Invariant 9's planted bugs (PROTOCOL.md section 11), applied once for the simulator and the fused
// GPU plugin (model::apply_attention_bug). Every expectation is computed by hand on the tiny batch
// (tests/model_tiny_batch.hpp; its correct plans are model_attention_test.cpp's):
//
//   r0: prefix 8, extend 6 -> k_base 0, first current row 8 (slot 2 * P 4); no request before it
//   r1: prefix 0, extend 9 -> k_base 16 = its first current row; r0's 8 + 6 = 14 keys before it
//   rank 0: (r0, 0, 4, 12, 0), (r1, 0, 4, 4, 16)    rank 1: (r0, 4, 2, 14, 0), (r1, 4, 5, 9, 16)
#include <gtest/gtest.h>

#include "cpkv/model/attention.hpp"
#include "cpkv/model/attention_bug.hpp"
#include "model_tiny_batch.hpp"

namespace cpkv::model {
namespace {

using testing::tiny_batch;
using testing::tiny_setting;
using Plan = std::vector<AttentionSegment>;

const Plan kRank0 = {{0, 0, 4, 12, 0}, {1, 0, 4, 4, 16}};
const Plan kRank1 = {{0, 4, 2, 14, 0}, {1, 4, 5, 9, 16}};

TEST(AttentionBug, TheTinyBatchsCorrectPlansAreSection11s) {
  EXPECT_EQ(expected_attention_plan(tiny_setting(), tiny_batch(), 0), kRank0);
  EXPECT_EQ(expected_attention_plan(tiny_setting(), tiny_batch(), 1), kRank1);
}

TEST(AttentionBug, NoneLeavesThePlanAsItIs) {
  EXPECT_EQ(apply_attention_bug(kRank0, tiny_batch(), AttentionBug::none), kRank0);
  EXPECT_EQ(apply_attention_bug(kRank1, tiny_batch(), AttentionBug::none), kRank1);
}

TEST(AttentionBug, TheBatchAsOneSequenceCountsEveryEarlierRequestsKeys) {
  // Section 11: causal per request, never across. The bug adds r0's 14 keys to r1's windows; r0 has
  // no request before it and keeps its own.
  EXPECT_EQ(apply_attention_bug(kRank0, tiny_batch(), AttentionBug::batch_as_one_sequence), (Plan{{0, 0, 4, 12, 0}, {1, 0, 4, 18, 16}}));
  EXPECT_EQ(apply_attention_bug(kRank1, tiny_batch(), AttentionBug::batch_as_one_sequence), (Plan{{0, 4, 2, 14, 0}, {1, 4, 5, 23, 16}}));
}

TEST(AttentionBug, CausalOffByOneMakesEveryKvLenOneShort) {
  // Section 11: query t sees keys 0 .. prefix_len + t, itself included; the bug stops one before.
  EXPECT_EQ(apply_attention_bug(kRank0, tiny_batch(), AttentionBug::causal_off_by_one), (Plan{{0, 0, 4, 11, 0}, {1, 0, 4, 3, 16}}));
  EXPECT_EQ(apply_attention_bug(kRank1, tiny_batch(), AttentionBug::causal_off_by_one), (Plan{{0, 4, 2, 13, 0}, {1, 4, 5, 8, 16}}));
}

TEST(AttentionBug, KeyBaseSkipsPrefixStartsARequestsKeysAtItsFirstCurrentRow) {
  // Section 11: k_base is the request's first prefix row. The bug takes r0's first current row 8;
  // r1 has no prefix, so its first current row is its k_base already.
  EXPECT_EQ(apply_attention_bug(kRank0, tiny_batch(), AttentionBug::key_base_skips_prefix), (Plan{{0, 0, 4, 12, 8}, {1, 0, 4, 4, 16}}));
  EXPECT_EQ(apply_attention_bug(kRank1, tiny_batch(), AttentionBug::key_base_skips_prefix), (Plan{{0, 4, 2, 14, 8}, {1, 4, 5, 9, 16}}));
}

TEST(AttentionBug, EachBugIsInvariant9sFindingInTheFieldItBreaks) {
  // The checker written from section 11 passes the correct plans and names the field each bug
  // breaks: on rank 1 r1's kv_len (batch as one sequence), r0's kv_len (off by one), r0's k_base.
  const struct {
    AttentionBug bug;
    std::int64_t segment;
    const char* field;
    std::int64_t expected;
    std::int64_t got;
  } cases[] = {{AttentionBug::batch_as_one_sequence, 1, "kv_len", 9, 23},
               {AttentionBug::causal_off_by_one, 0, "kv_len", 14, 13},
               {AttentionBug::key_base_skips_prefix, 0, "k_base", 0, 8}};
  EXPECT_FALSE(check_attention_plan(tiny_setting(), tiny_batch(), 1, apply_attention_bug(kRank1, tiny_batch(), AttentionBug::none)));
  for (const auto& c : cases) {
    const auto f = check_attention_plan(tiny_setting(), tiny_batch(), 1, apply_attention_bug(kRank1, tiny_batch(), c.bug));
    ASSERT_TRUE(f) << to_string(c.bug);
    EXPECT_EQ(f->segment, c.segment) << to_string(c.bug);
    EXPECT_EQ(f->field, c.field) << to_string(c.bug);
    EXPECT_EQ(f->expected, c.expected) << to_string(c.bug);
    EXPECT_EQ(f->got, c.got) << to_string(c.bug);
  }
}

TEST(AttentionBug, ATokenSplitsPlanIsBrokenTheSameWay) {
  // Section 12's splits have their own segments; each bug moves each of them as above, by the
  // request's own numbers (r1: 14 keys before it; r0: prefix 8).
  for (QuerySplit split : {QuerySplit::zigzag_tokens, QuerySplit::continuous_tokens}) {
    for (std::int32_t rank = 0; rank < 2; ++rank) {
      const Plan correct = expected_attention_plan(tiny_setting(), tiny_batch(), rank, split);
      ASSERT_FALSE(correct.empty());
      const Plan one = apply_attention_bug(correct, tiny_batch(), AttentionBug::batch_as_one_sequence);
      const Plan shy = apply_attention_bug(correct, tiny_batch(), AttentionBug::causal_off_by_one);
      const Plan skip = apply_attention_bug(correct, tiny_batch(), AttentionBug::key_base_skips_prefix);
      ASSERT_EQ(one.size(), correct.size());
      for (std::size_t i = 0; i < correct.size(); ++i) {
        AttentionSegment s = correct[i];
        s.kv_len += s.request == 1 ? 14 : 0;
        EXPECT_EQ(one[i], s) << to_string(split) << " rank " << rank << " segment " << i;
        s = correct[i];
        s.kv_len -= 1;
        EXPECT_EQ(shy[i], s) << to_string(split) << " rank " << rank << " segment " << i;
        s = correct[i];
        s.k_base += s.request == 0 ? 8 : 0;
        EXPECT_EQ(skip[i], s) << to_string(split) << " rank " << rank << " segment " << i;
      }
    }
  }
}

}  // namespace
}  // namespace cpkv::model

// The page-aligned in-seq split (PROTOCOL.md section 2). Every later exchange assumes each current
// page has exactly one writer: a page with two writers makes a sum all-reduce double its bytes and
// makes two ranks write the same staging slot. Expectations are worked by hand from the spec text.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cpkv/model/batch.hpp"
#include "model_tiny_batch.hpp"

namespace cpkv::model {
namespace {

std::vector<std::int32_t> writers(SplitPolicy policy, std::int64_t page_count, std::int32_t cp) {
  std::vector<std::int32_t> out;
  for (std::int64_t page = 0; page < page_count; ++page) {
    out.push_back(writer_in_request(policy, page, page_count, cp));
  }
  return out;
}

// The zigzag rule written out literally from section 2, as an independent oracle: 2*cp blocks,
// block j holds C/(2cp) pages plus one if j < C % (2cp); rank k owns blocks k and 2cp-1-k.
std::vector<std::int32_t> zigzag_oracle(std::int64_t page_count, std::int32_t cp) {
  const std::int64_t blocks = 2 * cp;
  std::vector<std::int32_t> out;
  for (std::int64_t block = 0; block < blocks; ++block) {
    const std::int64_t size = page_count / blocks + (block < page_count % blocks ? 1 : 0);
    const std::int32_t rank = static_cast<std::int32_t>(block < cp ? block : blocks - 1 - block);
    for (std::int64_t i = 0; i < size; ++i) out.push_back(rank);
  }
  return out;
}

TEST(ModelSplit, CurrentPageCountIsCeilOfExtendOverPageSize) {
  // A partial last page is still a page: it needs a writer and a staging slot.
  EXPECT_EQ(current_page_count(1, 4), 1);
  EXPECT_EQ(current_page_count(4, 4), 1);
  EXPECT_EQ(current_page_count(5, 4), 2);
  EXPECT_EQ(current_page_count(6, 4), 2);
  EXPECT_EQ(current_page_count(9, 4), 3);
  EXPECT_EQ(current_page_count(64, 64), 1);
  EXPECT_EQ(current_page_count(65, 64), 2);
  EXPECT_EQ(current_page_count(7, 1), 7);
  EXPECT_EQ(current_page_count(256, 256), 1);
}

TEST(ModelSplit, ZigzagTenPagesTwoRanksGivesRankZeroTheOuterBlocks) {
  // C = 10, cp = 2: 4 blocks of sizes 3,3,2,2 = pages {0,1,2} {3,4,5} {6,7} {8,9}.
  // Rank 0 takes blocks 0 and 3, rank 1 blocks 1 and 2: this is what balances causal work.
  const std::vector<std::int32_t> expected = {0, 0, 0, 1, 1, 1, 1, 1, 0, 0};
  EXPECT_EQ(writers(SplitPolicy::zigzag, 10, 2), expected);
}

TEST(ModelSplit, ZigzagWithFewerPagesThanBlocksFillsLowBlocksFirst) {
  // C = 3, cp = 4: 8 blocks, sizes 1,1,1,0,0,0,0,0; blocks 0,1,2 belong to ranks 0,1,2.
  EXPECT_EQ(writers(SplitPolicy::zigzag, 3, 4), (std::vector<std::int32_t>{0, 1, 2}));
  // C = 5, cp = 4: block 3 -> rank 3, block 4 -> rank 2*4-1-4 = 3.
  EXPECT_EQ(writers(SplitPolicy::zigzag, 5, 4), (std::vector<std::int32_t>{0, 1, 2, 3, 3}));
  // The tiny batch's requests: C = 2 and C = 3 at cp = 2.
  EXPECT_EQ(writers(SplitPolicy::zigzag, 2, 2), (std::vector<std::int32_t>{0, 1}));
  EXPECT_EQ(writers(SplitPolicy::zigzag, 3, 2), (std::vector<std::int32_t>{0, 1, 1}));
}

TEST(ModelSplit, ZigzagSinglePageGoesToRankZero) {
  // One page lands in block 0, which rank 0 owns, whatever cp is.
  for (std::int32_t cp = 1; cp <= limits::cp_max; ++cp) {
    EXPECT_EQ(writer_in_request(SplitPolicy::zigzag, 0, 1, cp), 0) << "cp=" << cp;
  }
}

TEST(ModelSplit, SingleRankWritesEveryPageUnderEveryPolicy) {
  // cp = 1: rank 0 owns both zigzag blocks, the whole contiguous range, and every index mod 1.
  for (std::int64_t c = 1; c <= 9; ++c) {
    EXPECT_EQ(writers(SplitPolicy::zigzag, c, 1), std::vector<std::int32_t>(c, 0)) << "C=" << c;
    EXPECT_EQ(writers(SplitPolicy::contiguous, c, 1), std::vector<std::int32_t>(c, 0)) << "C=" << c;
    for (std::int64_t i = 0; i < c; ++i) {
      EXPECT_EQ(writer_of(SplitPolicy::round_robin, i, c, 100 + i, 1), 0);
    }
  }
}

TEST(ModelSplit, ZigzagOddGroupSizePairsBlockKWithBlockTwoCpMinusOneMinusK) {
  // cp = 3 (property tests use odd sizes), 6 blocks. C = 7: sizes 2,1,1,1,1,1 ->
  // b0 {0,1} r0, b1 {2} r1, b2 {3} r2, b3 {4} r2, b4 {5} r1, b5 {6} r0.
  EXPECT_EQ(writers(SplitPolicy::zigzag, 7, 3), (std::vector<std::int32_t>{0, 0, 1, 2, 2, 1, 0}));
  // C = 13: sizes 3,2,2,2,2,2 -> b0 {0..2} r0, b1 {3,4} r1, b2 {5,6} r2, b3 {7,8} r2,
  // b4 {9,10} r1, b5 {11,12} r0.
  EXPECT_EQ(writers(SplitPolicy::zigzag, 13, 3),
            (std::vector<std::int32_t>{0, 0, 0, 1, 1, 2, 2, 2, 2, 1, 1, 0, 0}));
}

TEST(ModelSplit, ContiguousGivesRankKPagesFromCkOverCpToCkPlusOneOverCp) {
  // C = 10, cp = 4: bounds 0, 10/4=2, 20/4=5, 30/4=7, 10.
  EXPECT_EQ(writers(SplitPolicy::contiguous, 10, 4),
            (std::vector<std::int32_t>{0, 0, 1, 1, 1, 2, 2, 3, 3, 3}));
  // C = 3, cp = 4: bounds 0, 0, 1, 2, 3 -> rank 0 writes nothing; pages go to ranks 1, 2, 3.
  EXPECT_EQ(writers(SplitPolicy::contiguous, 3, 4), (std::vector<std::int32_t>{1, 2, 3}));
  // C = 7, cp = 3: bounds 0, 2, 4, 7.
  EXPECT_EQ(writers(SplitPolicy::contiguous, 7, 3), (std::vector<std::int32_t>{0, 0, 1, 1, 2, 2, 2}));
}

TEST(ModelSplit, RoundRobinUsesTheBatchCurrentIndexNotThePageInRequest) {
  // Section 2: the page with batch current index i goes to rank i % cp. The same page of a
  // request moves with its position in the batch.
  EXPECT_EQ(writer_of(SplitPolicy::round_robin, 0, 3, 7, 3), 1);
  EXPECT_EQ(writer_of(SplitPolicy::round_robin, 0, 3, 8, 3), 2);
  EXPECT_EQ(writer_of(SplitPolicy::round_robin, 2, 3, 9, 3), 0);
  EXPECT_EQ(writer_of(SplitPolicy::round_robin, 1, 5, 4, 2), 0);
}

TEST(ModelSplit, WriterOfAgreesWithWriterInRequestForPagePolicies) {
  // zigzag and contiguous ignore the batch current index.
  for (std::int64_t index : {0, 5, 13}) {
    EXPECT_EQ(writer_of(SplitPolicy::zigzag, 8, 10, index, 2), 0);
    EXPECT_EQ(writer_of(SplitPolicy::zigzag, 4, 10, index, 2), 1);
    EXPECT_EQ(writer_of(SplitPolicy::contiguous, 4, 10, index, 4), 1);
  }
}

TEST(ModelSplit, EveryPageHasExactlyOneWriterInRangeForManyShapes) {
  // Writer exclusivity (invariant 1) over a sweep of page counts and group sizes, odd ones included:
  // every page gets one writer in [0, cp), zigzag matches the literal block rule, contiguous gives
  // each rank one run of the sizes the bounds say.
  for (std::int32_t cp = 1; cp <= limits::cp_max; ++cp) {
    for (std::int64_t c = 1; c <= 50; ++c) {
      const auto zig = writers(SplitPolicy::zigzag, c, cp);
      ASSERT_EQ(zig, zigzag_oracle(c, cp)) << "C=" << c << " cp=" << cp;
      const auto cont = writers(SplitPolicy::contiguous, c, cp);
      std::vector<std::int64_t> per_rank(cp, 0);
      for (std::int64_t page = 0; page < c; ++page) {
        ASSERT_GE(zig[page], 0);
        ASSERT_LT(zig[page], cp);
        ASSERT_GE(cont[page], 0);
        ASSERT_LT(cont[page], cp);
        if (page > 0) {
          ASSERT_LE(cont[page - 1], cont[page]) << "contiguous is monotone";
        }
        ++per_rank[cont[page]];
      }
      for (std::int32_t k = 0; k < cp; ++k) {
        EXPECT_EQ(per_rank[k], c * (k + 1) / cp - c * k / cp) << "C=" << c << " cp=" << cp;
      }
      for (std::int64_t index = 0; index < 3 * cp; ++index) {
        const std::int32_t w = writer_of(SplitPolicy::round_robin, 0, c, index, cp);
        ASSERT_EQ(w, index % cp);
      }
    }
  }
}

TEST(ModelSplit, TinyBatchLayoutRecordsZigzagAndRoundRobinWriters) {
  // The layout carries the writer of every current page; see model_tiny_batch.hpp.
  Setting setting = testing::tiny_setting();
  const Batch batch = testing::tiny_batch();
  BatchLayout zig = layout_batch(setting, batch);
  ASSERT_EQ(zig.current.size(), 5u);
  const std::int32_t zig_writers[] = {0, 1, 0, 1, 1};
  for (std::size_t i = 0; i < 5; ++i) EXPECT_EQ(zig.current[i].writer, zig_writers[i]) << "i=" << i;

  setting.split = SplitPolicy::round_robin;
  BatchLayout rr = layout_batch(setting, batch);
  const std::int32_t rr_writers[] = {0, 1, 0, 1, 0};
  for (std::size_t i = 0; i < 5; ++i) EXPECT_EQ(rr.current[i].writer, rr_writers[i]) << "i=" << i;
}

TEST(ModelSplit, SplitPolicyNamesRoundTrip) {
  for (SplitPolicy policy : {SplitPolicy::zigzag, SplitPolicy::contiguous, SplitPolicy::round_robin}) {
    EXPECT_EQ(parse_split_policy(to_string(policy)), policy);
  }
  EXPECT_EQ(to_string(SplitPolicy::zigzag), "zigzag");
  EXPECT_EQ(to_string(SplitPolicy::contiguous), "contiguous");
  EXPECT_EQ(to_string(SplitPolicy::round_robin), "round_robin");
  EXPECT_FALSE(parse_split_policy("token").has_value());
}

// A trace of a token split (section 12): the page-writer variants get each current page from the
// owner of its first token. One request of 10 tokens, P 2, cp 2. Zigzag over 4 token blocks of
// 3, 3, 2, 2: rank 0 tokens 0-2 and 8-9, rank 1 tokens 3-7; pages start at tokens 0, 2, 4, 6, 8, so
// writers 0, 0, 1, 1, 0 (page 1 holds tokens 2 and 3: two token writers, legal there). Continuous:
// every page starts at an even token, so rank 0 writes every page (the rounding's cost: documented).
TEST(ModelSplit, TokenSplitTracesGivePagesTheirFirstTokensOwner) {
  Setting setting;
  setting.cp = 2;
  setting.page_size = 2;
  setting.pool_pages = 8;
  Batch batch;
  batch.requests.push_back(Request{0, 10, {}});
  const auto layout_writers = [&](SplitPolicy policy) {
    setting.split = policy;
    std::vector<std::int32_t> out;
    for (const CurrentPage& page : layout_batch(setting, batch).current) out.push_back(page.writer);
    return out;
  };
  EXPECT_EQ(layout_writers(SplitPolicy::zigzag_tokens), (std::vector<std::int32_t>{0, 0, 1, 1, 0}));
  EXPECT_EQ(layout_writers(SplitPolicy::continuous_tokens), (std::vector<std::int32_t>{0, 0, 0, 0, 0}));
  EXPECT_EQ(parse_split_policy("zigzag_tokens"), SplitPolicy::zigzag_tokens);
  EXPECT_EQ(to_string(SplitPolicy::continuous_tokens), "continuous_tokens");
  EXPECT_TRUE(is_token_split(SplitPolicy::zigzag_tokens));
  EXPECT_FALSE(is_token_split(SplitPolicy::round_robin));
}

}  // namespace
}  // namespace cpkv::model

// The GPU backend compares every rank's attention plan across ranks through a fixed array of
// model::limits::attention_segments_max segments per rank; a batch whose plan needs more is found
// before any rank starts (harness/attention_limit.hpp), naming the batch, rank, variant, segments
// and limit. Expectations from PROTOCOL.md sections 11 and 12: a continuous token split gives rank k
// tokens k, k + cp, ... of a request, no two consecutive, so one segment per token; zigzag gives a
// rank two blocks of each request, so at most two.
#include <gtest/gtest.h>

#include <vector>

#include <fmt/format.h>

#include "cpkv/harness/attention_limit.hpp"
#include "cpkv/harness/request.hpp"
#include "cpkv/model/limits.hpp"

namespace cpkv::harness {
namespace {

// cp 2, P 64, one layer of kv_fp8; caps that admit the batch (no staging overflow).
model::Setting setting_of(std::int64_t extend_tokens) {
  model::Setting setting;
  setting.cp = 2;
  setting.page_size = 64;
  setting.kinds = {*model::find_buffer_kind("kv_fp8")};
  setting.layer_pattern = "S";
  setting.pool_pages = 16;
  setting.caps.max_total_extend_tokens = extend_tokens;
  setting.caps.max_batch_requests = 1;
  return setting;
}

// Batch 1 of the source: one prefix-less request of `extend_tokens` (batch 0 a small one).
BatchSource source_of(std::int64_t extend_tokens) {
  model::Batch small;
  small.requests.push_back(model::Request{.prefix_len = 0, .extend_len = 5, .prefix_pages = {}});
  model::Batch big;
  big.requests.push_back(model::Request{.prefix_len = 0, .extend_len = extend_tokens, .prefix_pages = {}});
  return BatchSource::from_batches(setting_of(extend_tokens), {small, big});
}

constexpr std::int64_t kLimit = model::limits::attention_segments_max;

TEST(AttentionLimit, AContinuousSplitOfMoreThanTheLimitTimesCpTokensIsFoundWithBatchRankVariantAndCounts) {
  // 2 * (limit + 1) tokens at cp 2: each rank computes limit + 1 of them, none next to another.
  const std::vector<model::Variant> variants = {model::Variant::staging_direct, model::Variant::allgather_zigzag,
                                                model::Variant::allgather_continuous};
  const auto excess = attention_segments_excess(source_of(2 * (kLimit + 1)), variants);
  ASSERT_TRUE(excess.has_value()) << "a plan of " << kLimit + 1 << " segments per rank passed a limit of " << kLimit;
  EXPECT_EQ(excess->batch, 1);
  EXPECT_EQ(excess->rank, 0);
  EXPECT_EQ(excess->variant, model::Variant::allgather_continuous);
  EXPECT_EQ(excess->segments, kLimit + 1);
  EXPECT_EQ(excess->limit, kLimit);
  const std::string expected = fmt::format("big.jsonl: batch 1: rank 0's attention plan under allgather_continuous has {} segments, over the limit "
                                           "of {} per rank",
                                           kLimit + 1, kLimit);
  EXPECT_EQ(excess->describe("big.jsonl").rfind(expected, 0), 0u)
      << excess->describe("big.jsonl");
}

TEST(AttentionLimit, ThePageAndZigzagSplitsOfTheSameBatchAndAContinuousOneAtTheLimitFit) {
  // The page split and zigzag give each rank at most two runs of the request.
  const std::vector<model::Variant> others = {model::Variant::staging_direct, model::Variant::v2, model::Variant::allgather_zigzag};
  EXPECT_FALSE(attention_segments_excess(source_of(2 * (kLimit + 1)), others).has_value());
  // 2 * limit tokens: exactly limit segments per rank, which fit.
  const std::vector<model::Variant> continuous = {model::Variant::allgather_continuous};
  EXPECT_FALSE(attention_segments_excess(source_of(2 * kLimit), continuous).has_value());
}

TEST(AttentionLimit, TheRefusalIsOneRequestErrorOfTheTrace) {
  const std::vector<model::Variant> continuous = {model::Variant::allgather_continuous};
  // A small limit on the small batch 0 (5 tokens at cp 2: rank 0 computes 0, 2, 4: three segments).
  try {
    refuse_attention_segments_over_limit(source_of(16), "t.jsonl", continuous, 2);
    FAIL() << "three segments passed a limit of 2";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.option(), "trace");
    EXPECT_NE(e.cli_message().find("t.jsonl: batch 0: rank 0's attention plan under allgather_continuous has 3 segments, over the limit of 2"),
              std::string::npos)
        << e.cli_message();
    EXPECT_EQ(e.cli_message().find('\n'), std::string::npos) << "one line";
  }
  EXPECT_NO_THROW(refuse_attention_segments_over_limit(source_of(16), "t.jsonl", continuous, 16));
}

}  // namespace
}  // namespace cpkv::harness

// The GPU backend refuses, before any rank starts and before it looks for a GPU, a trace whose
// attention plan needs more segments per rank than it compares across ranks
// (model::limits::attention_segments_max): one line naming the batch, the rank, the variant, the
// segments and the limit, exit 2. PROTOCOL.md section 12: a continuous token split gives rank k
// tokens k, k + cp, ... of a request, no two consecutive, so one segment (section 11) per token.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "cli_run.hpp"

namespace {

using namespace cpkv::test;  // NOLINT: the CLI tests' one runner (cli_run.hpp)

constexpr long long kLimit = 65536;  // model::limits::attention_segments_max, as the refusal must state it

// One batch of one prefix-less request of 2 * (limit + 1) tokens at cp 2: each rank computes
// limit + 1 tokens under allgather_continuous.
std::string big_trace() {
  const long long tokens = 2 * (kLimit + 1);
  const std::string header = fmt::format(
      R"({{"format":"cpkv-batch-trace","version":1,"cp":2,"page_size":64,"buffer_kinds":["kv_fp8"],"layers":{{"count":1,"pattern":"S"}},)"
      R"("pool_pages":16,"split":"zigzag","caps":{{"max_total_extend_tokens":{},"max_batch_requests":1,"staging_mib":null}},)"
      R"("source":{{"kind":"hand-written","description":"one request of 2 * 65537 tokens at cp 2","see":"tests/cli_attention_limit_test.cpp"}}}})",
      tokens);
  const std::string batch = fmt::format(R"({{"batch":0,"requests":[{{"prefix_len":0,"extend_len":{},"prefix_pages":[]}}]}})", tokens);
  return write_temp("cli_attention_limit", "big.jsonl", header + "\n" + batch + "\n");
}

TEST(CliAttentionLimit, TheCudaBackendRefusesAPlanOverItsSegmentLimitBeforeAnyRankOrGpuCheck) {
  const std::string trace = big_trace();
  const std::string expected =
      fmt::format("batch 0: rank 0's attention plan under allgather_continuous has {} segments, over the limit of {} per rank", kLimit + 1, kLimit);
  const CliRun replay = run_cpkv(fmt::format("replay '{}' --backend cuda --variant allgather_continuous", trace));
  if (replay.err.find("this build has no cuda backend") != std::string::npos) GTEST_SKIP() << "this build has no cuda backend: " << replay.err;
  expect_bad_input(replay, expected);
  // The same trace among other variants: the first that cannot fit is named.
  expect_bad_input(run_cpkv(fmt::format("replay '{}' --backend cuda --variant staging_direct,allgather_continuous", trace)), expected);
  expect_bad_input(run_cpkv(fmt::format("bench '{}' --backend cuda --variant allgather_continuous", trace)), expected);
}

}  // namespace

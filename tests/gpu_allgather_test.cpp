// Section 12's token-split variants on the GPU (allgather_zigzag, allgather_continuous), through the
// built-in plugin and the plugin host: at cp 2 and 4 (ranks oversubscribed on one GPU, so the
// all-gather is cpkv's IPC stand-in; with one GPU per rank it is NCCL's), every dense byte equals the
// model after every layer, every rank's attention plan is the token split's, the all-gathers are
// cpkv's collectives (one per layer and active kind), the peer bytes are the model's, and the
// planted bug skip_zero (the re-ordering leaves the rows past a partial page's end as the dense
// buffer held them) is a wrong byte. Expectations come from PROTOCOL.md section 12 and the model,
// not from the run.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cpkv/harness/mutants.hpp"
#include "cpkv/harness/source.hpp"
#include "cuda_backend.hpp"
#include "gpu_require.hpp"

namespace cpkv {
namespace {

constexpr model::Variant kAllGathers[] = {model::Variant::allgather_zigzag, model::Variant::allgather_continuous};

// Two batches over the planted-bug setting (P 16): prefixes from the pool, partial last pages, a
// one-token request, and token counts that do not divide by cp (continuous pads, zigzag's blocks
// are uneven), so the padding and the zero rows are exercised.
harness::BatchSource token_source(std::int32_t cp) {
  model::Batch first;
  first.requests.push_back({32, 70, {3, 17}});
  first.requests.push_back({0, 1, {}});
  first.requests.push_back({48, 131, {9, 40, 63}});
  model::Batch second;
  second.requests.push_back({0, 16 * cp + 3, {}});
  second.requests.push_back({16, 21, {5}});
  return harness::BatchSource::from_batches(cuda::gpu_small_setting(cp), {first, second});
}

harness::RunReport run(const harness::BatchSource& source, model::Variant variant, std::int32_t layers, harness::Mutant mutant = harness::Mutant::none) {
  auto backend = cuda::make_cuda_backend(cuda::CudaOptions{});
  harness::RunOptions options;
  options.variant = variant;
  options.layers = layers;
  options.seed = 11;
  options.mutant = mutant;
  return backend->run(source, options);
}

TEST(GpuAllGather, BothVariantsAreByteExactAtCp2And4WithOneAllGatherPerLayerAndKind) {
  CPKV_REQUIRE_GPU();
  constexpr std::int32_t kLayers = 4;
  for (std::int32_t cp : {2, 4}) {
    const harness::BatchSource source = token_source(cp);
    std::int64_t kinds_on_layers = 0;  // section 12: one all-gather per layer and active kind
    for (std::int32_t l = 0; l < kLayers; ++l) kinds_on_layers += source.setting.kinds_on_layer(l);
    for (model::Variant variant : kAllGathers) {
      const std::string where = std::string(model::to_string(variant)) + " cp " + std::to_string(cp);
      const harness::RunReport report = run(source, variant, kLayers);
      ASSERT_TRUE(report.failure.empty()) << where << ": " << report.failure;
      EXPECT_EQ(report.mismatches(), 0) << where << ": " << (report.ranks.empty() ? "" : report.ranks[0].first_mismatch);
      EXPECT_EQ(report.violation_count, 0) << where << ": " << (report.violations.empty() ? "" : harness::describe(report.violations[0]));
      ASSERT_EQ(report.ranks.size(), static_cast<std::size_t>(cp)) << where;
      for (std::int32_t r = 0; r < cp; ++r) {
        const harness::Totals& t = report.ranks[r];
        EXPECT_EQ(t.batches, 2) << where << " rank " << r;
        EXPECT_EQ(t.overflows, 0) << where << " rank " << r << ": section 12 has no staging to overflow";
        EXPECT_EQ(t.layers, 2 * kLayers) << where << " rank " << r;
        EXPECT_EQ(t.collectives, 2 * kinds_on_layers) << where << " rank " << r << ": one all-gather per layer and active kind";
        EXPECT_EQ(t.barriers, 0) << where << " rank " << r << ": the collective is the only synchronization";
        EXPECT_EQ(t.bytes_gathered_from_peers, t.model_bytes_gathered_from_peers) << where << " rank " << r;
        EXPECT_GT(t.bytes_gathered_from_peers, 0U) << where << " rank " << r << ": every rank's rows come from its peers";
      }
    }
  }
}

TEST(GpuAllGather, ASkippedZeroOfTheReorderingIsAWrongByte) {
  CPKV_REQUIRE_GPU();
  for (std::int32_t cp : {2, 4}) {
    for (model::Variant variant : kAllGathers) {
      const std::string where = std::string(model::to_string(variant)) + " cp " + std::to_string(cp);
      const harness::RunReport report = run(token_source(cp), variant, 2, harness::Mutant::skip_zero);
      EXPECT_GT(report.mismatches(), 0) << where << ": the rows past a partial page's end keep the dense buffer's garbage";
      EXPECT_FALSE(report.passed()) << where;
    }
  }
}

TEST(GpuAllGather, AnAttentionPlanOffByOneIsInvariant9OnTheTokenSplit) {
  CPKV_REQUIRE_GPU();
  for (model::Variant variant : kAllGathers) {
    const harness::RunReport report = run(token_source(2), variant, 1, harness::Mutant::causal_off_by_one);
    EXPECT_EQ(report.mismatches(), 0) << model::to_string(variant) << ": the bytes are right";
    EXPECT_GT(report.violations_by_invariant[9], 0) << model::to_string(variant) << ": " << report.failure;
  }
}

}  // namespace
}  // namespace cpkv

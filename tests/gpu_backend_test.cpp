// The GPU backend, driven by the same harness as the simulator: every variant byte-exact against the
// model on real GPUs (CUDA IPC, NCCL), oversubscribed groups, the capability fallback, generated
// cases, and the counting barrier under a rotating slow producer. Without a GPU every test skips
// with the reason (ctest reports them as skipped, not passed).
#include <cstdlib>
#include <optional>
#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <rapidcheck/detail/Configuration.h>

#include "cpkv/model/plan.hpp"
#include "cpkv/properties/properties.hpp"
#include "cpkv/sim/runner.hpp"
#include "cuda_backend.hpp"
#include "gpu_require.hpp"

namespace cpkv {
namespace {

std::string sample(const std::string& name) { return std::string(CPKV_SOURCE_DIR) + "/traces/samples/" + name; }

// Through the default exchange: cpkv's own fused compose as the built-in plugin (the ABI; the
// environment is the request check's, not make_cuda_backend's).
void expect_every_variant_exact(const harness::BatchSource& source, std::int32_t layers) {
  auto backend = cuda::make_cuda_backend(cuda::CudaOptions{});
  for (model::Variant variant : model::kAllVariants) {
    harness::RunOptions options;
    options.variant = variant;
    options.layers = layers;
    options.seed = 7;
    const harness::RunReport report = backend->run(source, options);
    EXPECT_TRUE(report.failure.empty()) << model::to_string(variant) << ": " << report.failure;
    EXPECT_EQ(report.mismatches(), 0) << model::to_string(variant) << ": " << (report.ranks.empty() ? "" : report.ranks[0].first_mismatch);
    EXPECT_EQ(report.violation_count, 0) << model::to_string(variant) << ": " << (report.violations.empty() ? "" : harness::describe(report.violations[0]));
    ASSERT_FALSE(report.ranks.empty());
    EXPECT_EQ(report.ranks[0].layers, static_cast<std::int64_t>(layers) * (report.ranks[0].batches - report.ranks[0].overflows))
        << "every accepted batch ran every layer";
  }
}

TEST(GpuBackend, EveryVariantIsByteExactOnTheTinyTrace) {
  CPKV_REQUIRE_GPU();
  expect_every_variant_exact(harness::BatchSource::from_trace(sample("tiny.jsonl")), 2);
}

TEST(GpuBackend, EveryVariantIsByteExactOnTheSeedsBatchWithEightRanksOversubscribed) {
  CPKV_REQUIRE_GPU();
  expect_every_variant_exact(harness::BatchSource::from_trace(sample("seeds_batch.jsonl")), 3);
}

// The planted-bug runs' setting with half their token cap (a smaller staging).
model::Setting small_setting(std::int32_t cp) {
  model::Setting s = cuda::gpu_small_setting(cp);
  s.caps.max_total_extend_tokens = 512;
  return s;
}

// The counters a run reports through the ABI are the plugin's own (ctx->counters: barriers, bytes
// gathered from peers) and cpkv's count of the all-reduce service's calls (collectives, bytes
// reduced): for cpkv's own exchange the bytes gathered are the model's figure for the variant,
// rank by rank. And they are not empty: a cp 2 batch with pages on both ranks moves bytes between
// them (by gathers, or by the all-reduce for fused_ar).
TEST(GpuBackend, TheBuiltInPluginsCountersAreTheModelsRankByRank) {
  CPKV_REQUIRE_GPU();
  model::Batch batch;
  batch.requests.push_back({32, 70, {3, 17}});
  batch.requests.push_back({48, 130, {9, 40, 63}});
  const harness::BatchSource source = harness::BatchSource::from_batches(small_setting(2), {batch, batch});
  auto through_abi = cuda::make_cuda_backend(cuda::CudaOptions{});
  for (model::Variant variant : {model::Variant::staging_direct, model::Variant::v2, model::Variant::fused_ar, model::Variant::symm_dense}) {
    harness::RunOptions options;
    options.variant = variant;
    options.layers = 3;
    const harness::RunReport a = through_abi->run(source, options);
    const std::string v(model::to_string(variant));
    ASSERT_TRUE(a.passed()) << v << ": " << a.failure;
    ASSERT_EQ(a.ranks.size(), 2u);
    for (std::size_t r = 0; r < a.ranks.size(); ++r) {
      EXPECT_EQ(a.ranks[r].bytes_gathered_from_peers, a.ranks[r].model_bytes_gathered_from_peers) << v << " rank " << r;
    }
    std::int64_t peer = 0, reduced = 0;
    for (const harness::Totals& t : a.ranks) {
      peer += static_cast<std::int64_t>(t.bytes_gathered_from_peers);
      reduced += static_cast<std::int64_t>(t.bytes_reduced);
    }
    // PROTOCOL.md section 7: fused_ar moves every page by its one all-reduce and gathers nothing from
    // a peer; the others gather their peers' pages over IPC.
    if (variant == model::Variant::fused_ar) {
      EXPECT_EQ(peer, 0) << v << " gathers nothing from its peers";
      EXPECT_GT(reduced, 0) << v << ": the ranks' pages meet in the all-reduce";
    } else {
      EXPECT_GT(peer, 0) << v << ": the ranks read each other's pages";
    }
    if (variant == model::Variant::staging_direct) {
      EXPECT_EQ(a.ranks[0].barriers, 6) << "one barrier per layer, 3 layers of 2 batches";
    }
    if (variant == model::Variant::fused_ar) {
      EXPECT_GT(a.ranks[0].collectives, 0) << "its all-reduces go through the service";
    }
  }
}

TEST(GpuBackend, FourAndEightRanksOnTwoGpusAreByteExactOverFourLayers) {
  CPKV_REQUIRE_GPU();
  for (std::int32_t cp : {4, 8}) {
    model::Batch batch;
    batch.requests.push_back({32, 70, {3, 17}});
    batch.requests.push_back({0, 1, {}});
    batch.requests.push_back({48, 130, {9, 40, 63}});
    expect_every_variant_exact(harness::BatchSource::from_batches(small_setting(cp), {batch, batch}), 4);
  }
}

TEST(GpuBackend, AMissingIpcCapabilityOnOneRankMakesEveryRankFallBack) {
  CPKV_REQUIRE_GPU();
  model::Batch batch;
  batch.requests.push_back({32, 40, {1, 2}});
  auto backend = cuda::make_cuda_backend(cuda::CudaOptions{});
  harness::RunOptions options;
  options.variant = model::Variant::staging_direct;
  options.layers = 2;
  options.ipc_missing_rank = 1;
  const harness::RunReport report = backend->run(harness::BatchSource::from_batches(small_setting(2), {batch}), options);
  EXPECT_TRUE(report.passed()) << report.failure;
  ASSERT_EQ(report.ranks.size(), 2u);
  // The agreed path is v2_fallback: no barrier, one whole-buffer all-reduce per layer and kind.
  EXPECT_EQ(report.ranks[0].barriers, 0);
  EXPECT_GT(report.ranks[0].collectives, 0);
}

// Found by the property below: an overflowing batch (rejected, nothing moves) must not mark the
// pool pages it names as populated, or the next batch reads pages nobody wrote.
TEST(GpuBackend, APageFirstNamedByARejectedBatchIsStillWrittenForTheNextBatch) {
  CPKV_REQUIRE_GPU();
  model::Setting s = small_setting(1);
  s.page_size = 1;
  s.kinds = {*model::find_buffer_kind("kv_fp8")};
  s.layer_pattern = "FS";
  s.pool_pages = 4;
  s.caps = {};  // staging falls back to the pool size: 4 slots
  model::Batch rejected;
  for (int i = 0; i < 5; ++i) rejected.requests.push_back({1, 1, {0}});  // 5 current pages > 4
  model::Batch accepted;
  accepted.requests.push_back({1, 1, {0}});
  expect_every_variant_exact(harness::BatchSource::from_batches(s, {rejected, accepted}), 2);
}

TEST(GpuBackend, GeneratedCasesAreByteExactOnTheGpus) {
  CPKV_REQUIRE_GPU();
  properties::Bounds bounds;
  bounds.cp_max = 4;
  bounds.layers_max = 3;
  bounds.tokens_max = 256;
  bounds.batches_max = 2;
  bounds.page_size_log2_max = 6;
  // Each case starts a process group and NCCL (about 3 s): a small budget of cases, fixed seed.
  rc::detail::TestParams params = rc::detail::configuration().testParams;
  params.maxSuccess = 12;
  if (std::getenv("RC_PARAMS") == nullptr) params.seed = 20261130;
  rc::detail::TestMetadata metadata;
  metadata.id = metadata.description = "GPU byte exactness on generated cases";
  // The same property body as the simulator suite's invariant 6, on the CUDA backend.
  const auto result = rc::detail::checkTestable(
      [&] { properties::byte_exactness_on([&](const properties::Case&) { return cuda::make_cuda_backend(cuda::CudaOptions{}); }, bounds, harness::Mutant::none,
                                           /*require_no_violation=*/true);
      },
      metadata, params);
  std::ostringstream text;
  rc::detail::printResultMessage(result, text);
  EXPECT_TRUE(result.template is<rc::detail::SuccessResult>()) << text.str();
}

TEST(GpuBarrier, RotatingSlowProducerIsPhaseSafeAndDrainsOnTwoGpus) {
  CPKV_REQUIRE_GPU();
  cuda::BarrierStressOptions o;
  o.cp = 2;
  o.iterations = 300;
  o.slow_delay_us = 10000;  // the seeds' 10 ms producer delay
  o.timed_barriers = 1000;
  const cuda::BarrierStressReport r = cuda::barrier_stress(o);
  EXPECT_TRUE(r.failure.empty()) << r.failure;
  EXPECT_EQ(r.phase_errors, 0u) << "a rank passed a barrier before a peer's stamp for that phase";
  EXPECT_EQ(r.timeouts, 0u);
  EXPECT_TRUE(r.drained);
  for (double us : r.us_per_barrier) std::printf("barrier: %.2f us per back-to-back barrier (launch included)\n", us);
}

TEST(GpuBarrier, FourRanksOversubscribedStayPhaseSafe) {
  CPKV_REQUIRE_GPU();
  cuda::BarrierStressOptions o;
  o.cp = 4;
  o.iterations = 200;
  o.slow_delay_us = 1000;
  const cuda::BarrierStressReport r = cuda::barrier_stress(o);
  EXPECT_TRUE(r.failure.empty()) << r.failure;
  EXPECT_EQ(r.phase_errors, 0u);
  EXPECT_EQ(r.timeouts, 0u);
  EXPECT_TRUE(r.drained);
}

// A batch in which rank `idle` writes no current page (so no peer's gather waits on its flag),
// found with the model's own layout: one request of 1..2cp current pages after 0 or 1 cached pages,
// under each split policy. Empty when no such shape exists.
std::optional<harness::BatchSource> batch_without_pages_of(std::int32_t cp, std::int32_t idle) {
  for (model::SplitPolicy split : {model::SplitPolicy::zigzag, model::SplitPolicy::contiguous, model::SplitPolicy::round_robin}) {
    model::Setting s = small_setting(cp);
    s.split = split;
    for (std::int64_t cached = 0; cached <= 1; ++cached) {
      for (std::int64_t tokens = 1; tokens <= 2 * cp * s.page_size; tokens += s.page_size / 2) {
        model::Batch batch;
        batch.requests.push_back({cached * s.page_size, tokens, cached ? std::vector<std::int64_t>{5} : std::vector<std::int64_t>{}});
        const model::BatchLayout layout = model::layout_batch(s, batch);
        bool written_by_idle = false;
        for (const model::CurrentPage& page : layout.current) written_by_idle = written_by_idle || page.writer == idle;
        if (!written_by_idle && !layout.current.empty()) return harness::BatchSource::from_batches(s, {batch, batch});
      }
    }
  }
  return std::nullopt;
}

// Issue 25 item 10. The compose launch ends with a wait for every peer's flag: the launch is then a
// whole barrier (PROTOCOL.md section 5: a rank passes layer L only once every peer arrived, that is,
// is done reading the half layer L + 2 reuses). That closing wait is the only one on a peer nobody
// reads from: an idle rank (no current pages). Rotated over the ranks: the idle rank is also the
// slow reader (it spins after its first flag wait), so a peer that passed without its arrival runs
// two layers ahead and refills the staging half the slow rank is still copying (a wrong byte).
// Oversubscribed (every rank on one GPU) and, with two GPUs, one rank per GPU at cp 2.
TEST(GpuBarrier, TheLaunchWaitsForAnIdleSlowReaderItReadsNothingFrom) {
  CPKV_REQUIRE_GPU();
  // Through the ABI: the built-in plugin takes the slow reader from ctx->reader_spin_cycles.
  for (std::int32_t cp : {2, 4}) {
    for (std::int32_t idle = 0; idle < cp; ++idle) {
      const std::optional<harness::BatchSource> source = batch_without_pages_of(cp, idle);
      ASSERT_TRUE(source.has_value()) << "no batch leaves rank " << idle << " of " << cp << " without current pages";
      cuda::CudaOptions slow;
      slow.slow_reader_rank = idle;
      auto backend = cuda::make_cuda_backend(slow);
      for (model::Variant variant : {model::Variant::staging_direct, model::Variant::staging_publish, model::Variant::symm_dense}) {
        harness::RunOptions options;
        options.variant = variant;
        options.layers = 4;  // layer 2 reuses layer 0's half while the slow rank may still read it
        options.seed = 11;
        const harness::RunReport report = backend->run(*source, options);
        const std::string where = fmt::format("cp {} idle slow rank {} {}", cp, idle, model::to_string(variant));
        EXPECT_TRUE(report.failure.empty()) << where << ": " << report.failure;
        for (const harness::Totals& rank : report.ranks) EXPECT_EQ(rank.mismatches, 0) << where << ": " << rank.first_mismatch;
        EXPECT_EQ(report.violation_count, 0) << where << ": " << (report.violations.empty() ? "" : harness::describe(report.violations[0]));
        ASSERT_EQ(report.ranks.size(), static_cast<std::size_t>(cp)) << where;
        EXPECT_EQ(report.ranks[idle].layers, 8) << where << ": both batches ran every layer";
      }
    }
  }
}

}  // namespace
}  // namespace cpkv

namespace cpkv {
namespace {

// The GPU tests expect zero mismatches; these show the checks that would report one can: the verify
// kernel finds and locates one flipped byte, and every GPU planted bug is reported with the rank,
// layer, slot and byte of its first wrong byte (or a violation), one rank per GPU and oversubscribed.
TEST(GpuMutants, VerifyKernelFindsAndLocatesOneCorruptedByte) {
  if (cuda::gpu_count() == 0) GTEST_SKIP() << "no CUDA device visible: GPU test not run here";
  const cuda::VerifySelfTest t = cuda::verify_self_test();
  ASSERT_TRUE(t.failure.empty()) << t.failure;
  EXPECT_EQ(t.wrong_bytes_clean, 0u);
  EXPECT_EQ(t.wrong_bytes_corrupted, 1u);
  EXPECT_EQ(t.slot, t.planted_slot);
  EXPECT_EQ(t.row, t.planted_row);
  EXPECT_EQ(t.byte, t.planted_byte);
  EXPECT_EQ(t.expected, t.planted_expected);
  EXPECT_EQ(t.actual, t.planted_actual);
}

void expect_every_gpu_mutant_reported(std::int32_t cp) {
  const harness::BatchSource source = cuda::gpu_mutant_source(cp);
  auto backend = cuda::make_cuda_backend(cuda::CudaOptions{});
  harness::RunOptions options;
  options.variant = model::Variant::staging_direct;
  options.layers = cuda::kGpuMutantLayers;
  options.seed = 7;
  const harness::RunReport clean = backend->run(source, options);
  EXPECT_TRUE(clean.passed()) << "cp " << cp << ": the setup itself fails: " << cuda::first_finding(clean);
  for (harness::Mutant mutant : harness::kGpuMutants) {
    options.mutant = mutant;
    const harness::RunReport report = backend->run(source, options);
    EXPECT_FALSE(report.passed()) << harness::to_string(mutant) << " went unnoticed on cp " << cp;
    const std::string finding = cuda::first_finding(report);
    if (mutant == harness::Mutant::barrier_passes_early && report.mismatches() == 0) {
      EXPECT_NE(finding.find("invariant 4"), std::string::npos) << finding;  // at least the pads are not drained
      continue;
    }
    EXPECT_GT(report.mismatches(), 0) << harness::to_string(mutant) << " cp " << cp << ": " << finding;
    for (const char* field : {"rank ", "layer ", "slot ", "byte "}) EXPECT_NE(finding.find(field), std::string::npos) << finding;
  }
}

TEST(GpuMutants, EveryGpuPlantedBugIsReportedOneRankPerGpu) {
  if (cuda::gpu_count() < 2) GTEST_SKIP() << "needs 2 GPUs: GPU test not run here";
  expect_every_gpu_mutant_reported(2);
}

// More ranks than GPUs: cp 4 and 8 on two GPUs, and on one GPU also cp 2 (every rank shares it).
TEST(GpuMutants, EveryGpuPlantedBugIsReportedOversubscribed) {
  if (cuda::gpu_count() == 0) GTEST_SKIP() << "no CUDA device visible: GPU test not run here";
  std::vector<std::int32_t> cps = {4, 8};
  if (cuda::gpu_count() == 1) cps.insert(cps.begin(), 2);
  for (std::int32_t cp : cps) expect_every_gpu_mutant_reported(cp);
}

// The registry's cuda entry offers exactly the table's GPU rows: a request for any other planted bug
// is refused before any rank starts, and the backend itself refuses one passed around the registry.
TEST(GpuMutants, OnlyTheGpuMutantsAreOfferedOnTheGpu) {
  harness::Registry registry;
  cuda::register_backend(registry);
  harness::ReplayRequest request;
  request.backend = "cuda";
  // (and the planted bugs its default exchange, the built-in plugin, holds itself: invariant 9's three)
  const auto builtin = harness::find_exchange(harness::kBuiltinExchange);
  for (harness::Mutant mutant : harness::kAllMutants) {
    request.mutant = std::string(harness::to_string(mutant));
    if (harness::held_by(mutant, harness::kGpuHolds) || builtin->holds(request.mutant)) {
      EXPECT_NO_THROW(harness::check_request(request, registry)) << request.mutant;
    } else {
      EXPECT_THROW(harness::check_request(request, registry), harness::RequestError) << request.mutant;
    }
  }
  EXPECT_EQ(harness::kGpuMutants.size(), 4u);  // single_half, no_barrier, skip_zero, barrier_passes_early
  harness::RunOptions options;
  options.mutant = harness::Mutant::token_split;
  EXPECT_THROW(cuda::make_cuda_backend({})->run(cuda::gpu_mutant_source(2), options), std::invalid_argument);
}

}  // namespace
}  // namespace cpkv

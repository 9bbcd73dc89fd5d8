// One GPU rank's life: set-up (device, stream, memory, peers, NCCL, the bench's ceilings), every
// batch through the plugin host (plugin_host.cpp: the backend's one rank loop, whatever the exchange),
// quiescence; and what the host's batch loop uses of the rank: pool population, the verify kernel,
// the device's findings of a batch, the rotating slow rank.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "cpkv/model/expected.hpp"
#include "plugin_host.hpp"
#include "timeline.hpp"

namespace cpkv::cuda {

void verify_kind(Rank& r, const BatchPlan& b, const DevicePlan& d, kernels::VerifyResult* verify, std::int32_t l, std::size_t k, std::int32_t half) {
  const model::Setting& setting = r.ctx.source.setting;
  const std::size_t kinds = setting.kinds.size();
  const TimelineSpan span(r, "verify", l);
  CPKV_CUDA_CHECK(kernels::launch_verify(r.mem.dense_half(half, k), setting.kinds[k].row_bytes, setting.page_size, d.slots,
                                         static_cast<std::int64_t>(b.slots.size()), r.ctx.options.seed, static_cast<std::uint32_t>(l),
                                         static_cast<std::uint32_t>(k), verify + l * kinds + k, r.stream));
}

void slow_rank_delay(Rank& r, std::int32_t l) {
  if (r.ctx.cuda.slow_rank_cycles <= 0 || (r.batch_index + l) % r.cp() != r.ctx.rank) return;
  CPKV_CUDA_CHECK(kernels::launch_spin(r.ctx.cuda.slow_rank_cycles, r.stream));
}

// Pool content for the pages this rank owns (written once: it never changes).
void populate_pools(Rank& r, const BatchPlan& b, const DevicePlan& d) {
  const model::Setting& setting = r.ctx.source.setting;
  for (std::int32_t l = 0; l < r.ctx.options.layers; ++l) {
    for (std::size_t k = 0; k < setting.kinds.size(); ++k) {
      CPKV_CUDA_CHECK(kernels::launch_populate_pool(r.mem.pool + r.mem.layout.pool_offset[l][k], setting.kinds[k].row_bytes, setting.page_size, d.populate_logical,
                                                    d.populate_local, static_cast<std::int64_t>(b.populate_logical.size()), r.ctx.options.seed,
                                                    static_cast<std::uint32_t>(l), static_cast<std::uint32_t>(k), r.stream));
    }
  }
}

harness::Violation violation(std::int32_t invariant, std::int32_t rank, std::int64_t batch, std::int32_t layer, const std::string& detail) {
  harness::Violation v;
  v.invariant = invariant;
  v.rank = rank;
  v.batch = batch;
  v.layer = layer;
  std::snprintf(v.detail, sizeof(v.detail), "%s", detail.c_str());
  return v;
}

// What the device found in the batch: a barrier timeout (invariant 8), wrong bytes (invariant 6).
void collect_findings(Rank& r, std::int64_t batch_index, kernels::VerifyResult* verify) {
  const model::Setting& setting = r.ctx.source.setting;
  const std::size_t kinds = setting.kinds.size();
  const std::int32_t rank = r.ctx.rank;
  harness::Totals& totals = r.ctx.boot->totals[rank];
  kernels::BarrierStatus status{};
  CPKV_CUDA_CHECK(cudaMemcpy(&status, r.mem.barrier_status, sizeof(status), cudaMemcpyDeviceToHost));
  if (status.timed_out_phase != 0) {
    record(r.ctx.boot, violation(8, rank, batch_index, -1, fmt::format("barrier phase {} timed out on rank {} waiting for rank {}",
                                                                       status.timed_out_phase, status.rank, status.missing_peer)));
  }
  std::vector<kernels::VerifyResult> results(static_cast<std::size_t>(r.ctx.options.layers) * kinds);
  CPKV_CUDA_CHECK(cudaMemcpy(results.data(), verify, results.size() * sizeof(kernels::VerifyResult), cudaMemcpyDeviceToHost));
  for (std::int32_t l = 0; l < r.ctx.options.layers && r.ctx.cuda.verify; ++l) {
    for (std::size_t k = 0; k < kinds; ++k) {
      const kernels::VerifyResult& found = results[l * kinds + k];
      if (found.wrong_bytes == 0) continue;
      const std::uint64_t first = found.first_wrong >> 16;  // (byte index << 16) | (expected << 8) | actual
      const std::uint64_t row_global = first / setting.kinds[k].row_bytes;
      model::Mismatch mismatch;
      mismatch.wrong_bytes = static_cast<std::int64_t>(found.wrong_bytes);
      mismatch.slot = static_cast<std::int64_t>(row_global / setting.page_size);
      mismatch.row = static_cast<std::int32_t>(row_global % setting.page_size);
      mismatch.byte = static_cast<std::uint32_t>(first % setting.kinds[k].row_bytes);
      mismatch.expected = static_cast<std::uint8_t>((found.first_wrong >> 8) & 0xff);
      mismatch.actual = static_cast<std::uint8_t>(found.first_wrong & 0xff);
      const std::string text = mismatch.describe(rank, batch_index, l, setting.kinds[k].name);
      totals.add_mismatches(1, text);
      record(r.ctx.boot, violation(6, rank, batch_index, l, text));
    }
  }
}

namespace {

// Quiescence: every word of this rank's pad equals the number of barriers (drained).
void check_drained(Rank& r) {
  std::vector<std::uint64_t> pad(r.cp());
  CPKV_CUDA_CHECK(cudaMemcpy(pad.data(), r.mem.pad, r.cp() * sizeof(std::uint64_t), cudaMemcpyDeviceToHost));
  for (std::int32_t p = 0; p < r.cp(); ++p) {
    if (pad[p] == r.barrier_phase) continue;
    record(r.ctx.boot, violation(4, r.ctx.rank, -1, -1, fmt::format("flags not drained: rank {}'s pad word for rank {} is {}, expected {}",
                                                                    r.ctx.rank, p, pad[p], r.barrier_phase)));
    return;
  }
}

}  // namespace

int cuda_rank(const RankContext& ctx) {
  Rank r{ctx};
  ctx.progress.step("setup");
  CPKV_CUDA_CHECK(cudaSetDevice(ctx.rank % ctx.gpus));
  CPKV_CUDA_CHECK(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
  const RankTimelineHandle timeline = open_timeline(r);
  allocate_memory(r);
  map_peers_and_agree(r);
  join_nccl(r);
  if (ctx.cuda.measure_ceilings) measure_ceilings(r, ctx.boot->bench_results[ctx.rank]);
  const std::size_t verify_slots = static_cast<std::size_t>(ctx.options.layers) * ctx.source.setting.kinds.size();
  kernels::VerifyResult* verify = nullptr;
  CPKV_CUDA_CHECK(cudaMalloc(&verify, verify_slots * sizeof(kernels::VerifyResult)));
  run_plugin_batches(r, verify);
  check_drained(r);
  leave_group(r);
  return harness::kRankExitOk;
}

}  // namespace cpkv::cuda

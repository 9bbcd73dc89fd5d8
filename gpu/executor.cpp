// One GPU rank's life: set-up (device, stream, memory, peers, NCCL, the bench's ceilings), every
// batch through the plugin host (plugin_host.cpp: the backend's one rank loop, whatever the
// exchange, with its pool population, verify kernel, findings and drain check), tear-down.
#include "plugin_host.hpp"
#include "timeline.hpp"

namespace cpkv::cuda {

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
  run_plugin_batches(r, verify);  // through the drain check after the plugin's teardown
  leave_group(r);
  return harness::kRankExitOk;
}

}  // namespace cpkv::cuda

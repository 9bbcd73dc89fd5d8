// A GPU rank's set-up: allocation (sizes from the largest batch, fixed before the first batch),
// IPC mapping of every peer, the capability agreed over the group (MIN), NCCL; and its tear-down.
#include <algorithm>

#include "rank.hpp"

namespace cpkv::cuda {

namespace {

std::uint64_t align_up(std::uint64_t v) { return (v + 255) / 256 * 256; }

// Byte offsets of every (layer, kind) pool slab, (half, kind) dense buffer and kind's compact buffer.
void carve_offsets(Rank& r) {
  const model::Setting& setting = r.ctx.source.setting;
  const std::size_t kinds = setting.kinds.size();
  const std::int32_t layers = r.ctx.options.layers;
  RankMemory& mem = r.mem;
  mem.pool_offset.assign(layers, std::vector<std::uint64_t>(kinds));
  for (std::int32_t l = 0; l < layers; ++l) {
    for (std::size_t k = 0; k < kinds; ++k) {
      mem.pool_offset[l][k] = mem.pool_bytes;
      mem.pool_bytes = align_up(mem.pool_bytes + setting.pool_pages_per_rank() * r.page_bytes(k));
    }
  }
  mem.dense_offset.assign(2, std::vector<std::uint64_t>(kinds));
  for (int h = 0; h < 2; ++h) {
    for (std::size_t k = 0; k < kinds; ++k) {
      mem.dense_offset[h][k] = mem.dense_bytes;
      mem.dense_bytes = align_up(mem.dense_bytes + r.ctx.shape.slot_count_max * r.page_bytes(k));
    }
  }
  for (std::size_t k = 0; k < kinds; ++k) {
    mem.compact_offset.push_back(mem.compact_bytes);
    mem.compact_bytes = align_up(mem.compact_bytes + r.ctx.shape.current_pages_max * r.page_bytes(k));
  }
}

}  // namespace

void allocate_memory(Rank& r) {
  const model::Setting& setting = r.ctx.source.setting;
  Bootstrap* boot = r.ctx.boot;
  const std::int32_t rank = r.ctx.rank;
  RankMemory& mem = r.mem;
  r.staging_slots = model::staging_capacity(setting).staging_slots;
  mem.carve = model::carve_arena(setting, r.staging_slots, 0);
  carve_offsets(r);
  const std::uint64_t staging_bytes = std::max<std::uint64_t>(mem.carve.staging_bytes, 256);
  CPKV_CUDA_CHECK(cudaMalloc(&mem.pool, std::max<std::uint64_t>(mem.pool_bytes, 256)));
  CPKV_CUDA_CHECK(cudaMalloc(&mem.staging, staging_bytes));
  CPKV_CUDA_CHECK(cudaMalloc(&mem.dense, std::max<std::uint64_t>(mem.dense_bytes, 256)));
  CPKV_CUDA_CHECK(cudaMalloc(&mem.compact, std::max<std::uint64_t>(mem.compact_bytes, 256)));
  CPKV_CUDA_CHECK(cudaMalloc(&mem.pad, 256));
  CPKV_CUDA_CHECK(cudaMemset(mem.pad, 0, 256));
  CPKV_CUDA_CHECK(cudaMemset(mem.staging, 0xA5, staging_bytes));  // garbage, as fresh memory
  CPKV_CUDA_CHECK(cudaMalloc(&mem.barrier_status, sizeof(kernels::BarrierStatus)));
  CPKV_CUDA_CHECK(cudaMemset(mem.barrier_status, 0, sizeof(kernels::BarrierStatus)));
  CPKV_CUDA_CHECK(cudaMalloc(&mem.barrier_state, sizeof(kernels::BarrierState)));
  CPKV_CUDA_CHECK(cudaMemset(mem.barrier_state, 0, sizeof(kernels::BarrierState)));
  CPKV_CUDA_CHECK(cudaIpcGetMemHandle(&boot->pool[rank], mem.pool));
  CPKV_CUDA_CHECK(cudaIpcGetMemHandle(&boot->staging[rank], mem.staging));
  CPKV_CUDA_CHECK(cudaIpcGetMemHandle(&boot->dense[rank], mem.dense));
  CPKV_CUDA_CHECK(cudaIpcGetMemHandle(&boot->pad[rank], mem.pad));
  CPKV_CUDA_CHECK(cudaIpcGetMemHandle(&boot->compact[rank], mem.compact));
  std::uint64_t page_bytes_max = 0;
  for (std::size_t k = 0; k < setting.kinds.size(); ++k) page_bytes_max = std::max(page_bytes_max, r.page_bytes(k));
  const std::int64_t pages_max = std::max(r.ctx.shape.slot_count_max, r.ctx.shape.current_pages_max);
  mem.scratch_bytes = std::max<std::uint64_t>(256, pages_max * page_bytes_max);
  CPKV_CUDA_CHECK(cudaMalloc(&mem.scratch, mem.scratch_bytes));
  if (r.ctx.cuda.measure_ceilings) {
    CPKV_CUDA_CHECK(cudaMalloc(&mem.bench_buffer, kBenchBufferBytes));
    CPKV_CUDA_CHECK(cudaMemset(mem.bench_buffer, 1, kBenchBufferBytes));
    CPKV_CUDA_CHECK(cudaIpcGetMemHandle(&boot->bench[rank], mem.bench_buffer));
  }
  {
    const harness::Waiting waiting(r.ctx.progress, harness::kWaitingOnDevice);
    CPKV_CUDA_CHECK(cudaDeviceSynchronize());
  }
  r.barrier();
}

// Map every peer once (never the own handles), then agree on the capability (MIN).
void map_peers_and_agree(Rank& r) {
  const std::int32_t cp = r.cp();
  const std::int32_t rank = r.ctx.rank;
  const std::int32_t gpus = r.ctx.gpus;
  Bootstrap* boot = r.ctx.boot;
  RankMemory& mem = r.mem;
  r.ctx.progress.step("ipc");
  mem.peer_pool.assign(cp, nullptr);
  mem.peer_staging.assign(cp, nullptr);
  mem.peer_dense.assign(cp, nullptr);
  mem.peer_pad.assign(cp, nullptr);
  mem.peer_compact.assign(cp, nullptr);
  std::int32_t capable = 1;
  const auto open = [&](const cudaIpcMemHandle_t& handle) -> std::uint8_t* {
    void* ptr = nullptr;
    if (cudaIpcOpenMemHandle(&ptr, handle, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) {
      (void)cudaGetLastError();
      capable = 0;
      return nullptr;
    }
    return static_cast<std::uint8_t*>(ptr);
  };
  for (std::int32_t p = 0; p < cp; ++p) {
    if (p == rank) {
      mem.peer_pool[p] = mem.pool;
      mem.peer_staging[p] = mem.staging;
      mem.peer_dense[p] = mem.dense;
      mem.peer_pad[p] = mem.pad;
      mem.peer_compact[p] = mem.compact;
      continue;
    }
    if (p % gpus != rank % gpus) {
      int can = 0;
      CPKV_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, rank % gpus, p % gpus));
      if (!can) capable = 0;
    }
    mem.peer_pool[p] = open(boot->pool[p]);
    mem.peer_staging[p] = open(boot->staging[p]);
    mem.peer_dense[p] = open(boot->dense[p]);
    mem.peer_pad[p] = reinterpret_cast<std::uint64_t*>(open(boot->pad[p]));
    mem.peer_compact[p] = open(boot->compact[p]);
  }
  if (r.ctx.options.ipc_missing_rank == rank) capable = 0;  // fault injection: this rank's probe fails
  boot->probe[rank].store(capable);
  r.barrier();
  std::int32_t agreed = capable;
  for (std::int32_t p = 0; p < cp; ++p) agreed = std::min(agreed, boot->probe[p].load());
  r.variant = model::path_variant(r.ctx.options.variant, /*ipc_on_every_rank=*/agreed != 0);
  boot->path[rank].store(static_cast<std::int32_t>(r.variant));
  CPKV_CUDA_CHECK(cudaMalloc(&mem.pad_table, cp * sizeof(std::uint64_t*)));
  CPKV_CUDA_CHECK(cudaMemcpy(mem.pad_table, mem.peer_pad.data(), cp * sizeof(std::uint64_t*), cudaMemcpyHostToDevice));
}

// NCCL: rank 0 makes the id, everyone joins. Multicast stays off (DEVICE.md). NCCL refuses two
// ranks on one GPU, so an oversubscribed group (functional runs of cp 4 or 8 on 2 GPUs) sums
// through IPC instead: barrier, every rank sums every peer's bytes, barrier, copy back.
void join_nccl(Rank& r) {
  r.use_nccl = r.ctx.gpus >= r.cp();
  if (!r.use_nccl) return;
  r.ctx.progress.step("nccl");
  if (r.ctx.rank == 0) CPKV_NCCL_CHECK(ncclGetUniqueId(&r.ctx.boot->nccl_id));
  r.barrier();
  {
    const harness::Waiting waiting(r.ctx.progress, harness::kWaitingOnPeers);  // init returns when every rank has joined
    const harness::Quiet quiet(r.ctx.progress.record(), kHostWaitMsMax);      // a first init can take tens of seconds
    CPKV_NCCL_CHECK(ncclCommInitRank(&r.comm, r.cp(), r.ctx.boot->nccl_id, r.ctx.rank));
  }
  r.barrier();
}

void leave_group(Rank& r) {
  r.ctx.progress.step("done");
  r.barrier();  // peers may still read this rank's memory until here
  if (r.comm != nullptr) {
    const harness::Quiet quiet(r.ctx.progress.record(), kHostWaitMsMax);
    CPKV_NCCL_CHECK(ncclCommDestroy(r.comm));
  }
}

void Rank::all_reduce(std::uint8_t* own, const std::vector<std::uint8_t*>& peers, std::uint64_t offset, std::uint64_t bytes) {
  if (use_nccl) {
    CPKV_NCCL_CHECK(ncclAllReduce(own, own, bytes, ncclUint8, ncclSum, comm, stream));
    return;
  }
  kernels::PointerTable sources{};
  for (std::int32_t p = 0; p < cp(); ++p) sources.base[p] = peers[p] + offset;
  device_barrier();
  CPKV_CUDA_CHECK(kernels::launch_sum_bytes(mem.scratch, sources, cp(), bytes, stream));
  device_barrier();
  if (bytes > 0) CPKV_CUDA_CHECK(cudaMemcpyAsync(own, mem.scratch, bytes, cudaMemcpyDeviceToDevice, stream));
}

}  // namespace cpkv::cuda

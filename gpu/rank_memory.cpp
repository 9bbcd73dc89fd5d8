// A GPU rank's set-up: its device and stream, allocation (sizes from the largest batch, fixed before
// the first batch), IPC mapping of every peer, the capability agreed over the group (MIN), NCCL;
// and its tear-down.
#include <unistd.h>

#include <algorithm>

#include "rank.hpp"

namespace cpkv::cuda {

namespace {

// Byte offsets of every (layer, kind) pool slab, (half, kind) dense buffer and kind's compact
// buffer: the run's pool plan, the one the memory check before any allocation read.
void carve_offsets(Rank& r) {
  RankMemory& mem = r.mem;
  mem.layout = r.ctx.pool_share->plan.layout;
  const std::int32_t cp = r.cp();
  mem.pool_referenced.assign(cp, std::vector<bool>(mem.layout.pool_pages_per_rank, false));
  for (std::int64_t g : r.ctx.shape.pool_pages_touched) mem.pool_referenced[g % cp][g / cp] = true;
}

// The pool slabs: the whole reservation, only the referenced pages' chunks backed (sparse), or one
// cudaMalloc of every slab shared through CUDA IPC (dense, CPKV_POOL_MEMORY=dense).
void allocate_pool(Rank& r) {
  RankMemory& mem = r.mem;
  const PoolShare& share = *r.ctx.pool_share;
  if (share.plan.memory == PoolMemory::dense) {
    CPKV_CUDA_CHECK(cudaMalloc(&mem.pool, share.plan.reserved));  // the whole slabs (pool_plan: at least 256 bytes)
    CPKV_CUDA_CHECK(cudaIpcGetMemHandle(&r.ctx.boot->pool[r.ctx.rank], mem.pool));
    return;
  }
  CPKV_ASSERT(share.plan.reserved >= mem.layout.pool_bytes);
  mem.own_pool = create_pool(r.ctx.rank % r.ctx.gpus, share.plan.reserved, share.plan.runs[r.ctx.rank]);
  mem.pool = reinterpret_cast<std::uint8_t*>(mem.own_pool.base);
}

// Every peer's sparse pool mapped here: pair by pair in increasing peer order (the lower rank of a
// pair sends first), so no two ranks wait on each other; each wait bounded by wait_ms_max. False
// when a peer's chunks cannot be made accessible here (no peer access): the group falls back.
bool share_pools(Rank& r) {
  RankMemory& mem = r.mem;
  PoolShare& share = *r.ctx.pool_share;
  const std::int32_t rank = r.ctx.rank;
  const std::int64_t ms = r.ctx.boot->wait_ms_max;
  const std::vector<int> ends = share.channels->own_ends(rank);
  bool capable = true;
  mem.peer_pools.assign(r.cp(), VmmPool{});
  try {
    for (std::int32_t p = 0; p < r.cp(); ++p) {
      if (p == rank) continue;
      const harness::Waiting waiting(r.ctx.progress, p);
      if (rank < p) send_pool(ends[p], mem.own_pool, ms);
      const bool mapped = receive_pool(ends[p], rank % r.ctx.gpus, share.plan.reserved, share.plan.runs[p], ms, mem.peer_pools[p]);
      if (rank > p) send_pool(ends[p], mem.own_pool, ms);
      mem.peer_pool[p] = mapped ? reinterpret_cast<std::uint8_t*>(mem.peer_pools[p].base) : nullptr;
      capable = capable && mapped;
    }
  } catch (...) {
    for (int fd : ends) if (fd >= 0) ::close(fd);
    throw;
  }
  for (int fd : ends) if (fd >= 0) ::close(fd);
  return capable;
}

void allocate_memory(Rank& r) {
  // From here a failed CUDA call of this rank (a device fault's sticky error above all) ends it
  // with a located line, not an abort (bootstrap.hpp: name_device_faults).
  name_device_faults(r.ctx.rank, r.ctx.progress.record());
  const model::Setting& setting = r.ctx.source.setting;
  Bootstrap* boot = r.ctx.boot;
  const std::int32_t rank = r.ctx.rank;
  RankMemory& mem = r.mem;
  r.staging_slots = model::staging_capacity(setting).staging_slots;
  mem.carve = model::carve_arena(setting, r.staging_slots, 0);
  carve_offsets(r);
  const std::uint64_t staging_bytes = mem.layout.staging_bytes;  // the carve's, at least 256 (buffer_layout)
  allocate_pool(r);
  CPKV_CUDA_CHECK(cudaMalloc(&mem.staging, staging_bytes));
  CPKV_CUDA_CHECK(cudaMalloc(&mem.dense, std::max<std::uint64_t>(mem.layout.dense_bytes, 256)));
  CPKV_CUDA_CHECK(cudaMalloc(&mem.compact, std::max<std::uint64_t>(mem.layout.compact_bytes, 256)));
  CPKV_CUDA_CHECK(cudaMalloc(&mem.pad, 256));
  CPKV_CUDA_CHECK(cudaMemset(mem.pad, 0, 256));
  CPKV_CUDA_CHECK(cudaMemset(mem.staging, 0xA5, staging_bytes));  // garbage, as fresh memory
  CPKV_CUDA_CHECK(cudaMalloc(&mem.barrier_status, sizeof(kernels::BarrierStatus)));
  CPKV_CUDA_CHECK(cudaMemset(mem.barrier_status, 0, sizeof(kernels::BarrierStatus)));
  CPKV_CUDA_CHECK(cudaMalloc(&mem.barrier_state, sizeof(kernels::BarrierState)));
  CPKV_CUDA_CHECK(cudaMemset(mem.barrier_state, 0, sizeof(kernels::BarrierState)));
  CPKV_CUDA_CHECK(cudaIpcGetMemHandle(&boot->staging[rank], mem.staging));
  CPKV_CUDA_CHECK(cudaIpcGetMemHandle(&boot->dense[rank], mem.dense));
  CPKV_CUDA_CHECK(cudaIpcGetMemHandle(&boot->pad[rank], mem.pad));
  CPKV_CUDA_CHECK(cudaIpcGetMemHandle(&boot->compact[rank], mem.compact));
  CPKV_CUDA_CHECK(cudaMalloc(&mem.scratch, mem.layout.scratch_bytes));
  CPKV_CUDA_CHECK(cudaMalloc(&mem.verify, static_cast<std::size_t>(r.ctx.options.layers) * setting.kinds.size() * sizeof(kernels::VerifyResult)));
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
  const bool sparse = r.ctx.pool_share->plan.memory == PoolMemory::sparse;
  if (sparse && !share_pools(r)) capable = 0;
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
    if (!sparse) mem.peer_pool[p] = open(boot->pool[p]);
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

}  // namespace

void set_up_rank(Rank& r) {
  r.ctx.progress.step("setup");
  CPKV_CUDA_CHECK(cudaSetDevice(r.ctx.rank % r.ctx.gpus));
  CPKV_CUDA_CHECK(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
  allocate_memory(r);
  map_peers_and_agree(r);
  join_nccl(r);
}

void leave_group(Rank& r) {
  r.ctx.progress.step("done");
  r.barrier();  // peers may still read this rank's memory until here
  if (r.comm != nullptr) {
    const harness::Quiet quiet(r.ctx.progress.record(), kHostWaitMsMax);
    CPKV_NCCL_CHECK(ncclCommDestroy(r.comm));
  }
  CPKV_CUDA_CHECK(cudaDeviceSynchronize());
  for (VmmPool& peer : r.mem.peer_pools) release_pool(peer);
  release_pool(r.mem.own_pool);
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

// NCCL's all-gather with one GPU per rank; where ranks share a GPU, the IPC stand-in: a barrier
// (every rank's send bytes are written), a copy of each rank's bytes from its mapping, a barrier
// (no rank's next layer rewrites its send bytes while a peer still copies them).
void Rank::all_gather(const std::uint8_t* own_send, const std::vector<std::uint8_t*>& peers, std::uint64_t offset, std::uint8_t* recv, std::uint64_t bytes) {
  if (use_nccl) {
    CPKV_NCCL_CHECK(ncclAllGather(own_send, recv, bytes, ncclUint8, comm, stream));
    return;
  }
  device_barrier();
  for (std::int32_t p = 0; p < cp() && bytes > 0; ++p) {
    const std::uint8_t* from = p == ctx.rank ? own_send : peers[p] + offset;
    CPKV_CUDA_CHECK(cudaMemcpyAsync(recv + p * bytes, from, bytes, cudaMemcpyDeviceToDevice, stream));
  }
  device_barrier();
}

}  // namespace cpkv::cuda

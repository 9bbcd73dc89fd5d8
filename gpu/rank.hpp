// One GPU rank process: what it was asked (RankContext), its device memory and the peers' mappings
// (RankMemory), and its running state (Rank: stream, phases, the NCCL communicator). rank_memory.cpp
// sets it up (device, allocation, IPC, capability agreement, NCCL) and tears it down; backend.cpp
// runs its life, the plugin host (plugin_host.cpp) its batches; plugin_bench.cpp and bench.cpp time them.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "bootstrap.hpp"
#include "cpkv/harness/source.hpp"
#include "cpkv/model/plan.hpp"
#include "cpkv/model/staging.hpp"
#include "launchers.cuh"
#include "vmm.hpp"

namespace cpkv::cuda {

class RankTimeline;  // timeline.hpp

struct RankContext {
  Bootstrap* boot;
  const harness::BatchSource& source;
  const harness::RunOptions& options;
  const CudaOptions& cuda;
  harness::SourceShape shape;
  std::int32_t rank;
  std::int32_t gpus;
  harness::RankProgress& progress;
  PoolShare* pool_share;  // how the pool slabs are held and shared (the parent's, inherited at fork)
};

// Device memory of one rank and the peers' mappings of theirs.
struct RankMemory {
  std::uint8_t* pool = nullptr;
  std::uint8_t* staging = nullptr;
  std::uint8_t* dense = nullptr;
  std::uint8_t* compact = nullptr;
  std::uint64_t* pad = nullptr;
  std::vector<std::uint8_t*> peer_pool, peer_staging, peer_dense, peer_compact;
  std::uint8_t* scratch = nullptr;  // the IPC all-reduce's receive buffer
  std::vector<std::uint64_t*> peer_pad;
  std::uint64_t** pad_table = nullptr;  // device array of every rank's pad
  kernels::BarrierStatus* barrier_status = nullptr;
  kernels::BarrierState* barrier_state = nullptr;  // the device's phase count (equals Rank::barrier_phase between launches)
  BufferLayout layout;  // every buffer's offsets and sizes (pool_backing.hpp; scratch_bytes: the most an IPC all-reduce sums at once)
  std::uint8_t* bench_buffer = nullptr;  // ceilings: 256 MiB others pull from, 256 MiB to land in
  kernels::VerifyResult* verify = nullptr;  // [layer][kind]: the verify kernel's result of each, reset every batch
  model::ArenaCarve carve;
  VmmPool own_pool;                 // a sparse pool: the reservation and its backed chunks
  std::vector<VmmPool> peer_pools;  // likewise, each peer's as mapped here (sparse only)
  std::vector<std::vector<bool>> pool_referenced;  // [rank][local page]: some batch reads it (backed)

  // Kind k's part of parity half h of this rank's dense buffer and of its staging.
  std::uint8_t* dense_half(std::int32_t h, std::size_t k) const { return dense + layout.dense_offset[h][k]; }
  std::uint8_t* staging_half(std::int32_t h, std::size_t k) const { return staging + carve.slot_offset(h, k, 0); }
};

struct Rank {
  explicit Rank(const RankContext& context) : ctx(context) {}  // every other member starts at its default

  const RankContext& ctx;
  RankMemory mem;
  cudaStream_t stream = nullptr;
  std::int64_t staging_slots = 0;
  std::uint64_t host_phase = 0;     // host barriers passed
  std::uint64_t barrier_phase = 0;  // device counting barriers issued (the device keeps the same count in mem.barrier_state)
  bool use_nccl = false;
  ncclComm_t comm = nullptr;
  model::Variant variant = model::Variant::staging_direct;  // the path agreed by the group
  // Every host-device synchronization of the batch path goes through sync_stream and is counted, so
  // the benchmark reports how many fall inside the layer loop (the seeds found 642 per forward).
  std::int64_t host_syncs = 0;
  std::int64_t batch_index = 0;     // the batch in flight
  RankTimeline* timeline = nullptr; // --timeline: the rank's recorder (timeline.hpp); null: off

  std::int32_t cp() const { return ctx.source.setting.cp; }
  std::uint64_t page_bytes(std::size_t kind) const {
    return std::uint64_t{ctx.source.setting.kinds[kind].row_bytes} * ctx.source.setting.page_size;
  }
  void barrier() { host_barrier(ctx.boot, ctx.progress, ctx.rank, cp(), host_phase); }
  // Every rank's value of one word, through a bootstrap slot per rank (`slots`, one node's ranks):
  // this rank's `mine` is stored, then read back with the peers' between two host barriers (so the
  // slots may be used again right after). Collective: every rank calls it at the same point.
  std::vector<std::int32_t> share(std::atomic<std::int32_t>* slots, std::int32_t mine) {
    slots[ctx.rank].store(mine);
    barrier();
    std::vector<std::int32_t> all;
    for (std::int32_t p = 0; p < cp(); ++p) all.push_back(slots[p].load());
    barrier();
    return all;
  }
  void sync_stream() {
    ++host_syncs;
    wait_device(ctx.progress, stream);
  }
  // One counting barrier on the device, its phase taken from mem.barrier_state (graph-replayable).
  void device_barrier(std::int32_t lag = 0) {
    ++barrier_phase;
    CPKV_CUDA_CHECK(kernels::launch_barrier_next(mem.pad_table, ctx.rank, cp(), mem.barrier_state, lag, mem.barrier_status, stream));
  }
  // A sum all-reduce of `bytes` at byte offset `offset` of every rank's dense (or compact) buffer.
  void all_reduce(std::uint8_t* own, const std::vector<std::uint8_t*>& peers, std::uint64_t offset, std::uint64_t bytes);
  // An all-gather of `bytes` per rank (PROTOCOL.md section 12): every rank's `bytes` at byte offset
  // `offset` of its send buffer (`peers`: every rank's base of it; own_send this rank's bytes) into
  // recv, rank p's at recv + p * bytes.
  void all_gather(const std::uint8_t* own_send, const std::vector<std::uint8_t*>& peers, std::uint64_t offset, std::uint8_t* recv, std::uint64_t bytes);
};

// rank_memory.cpp: the rank's set-up, in one call (its device and stream, every buffer, the peers
// mapped and the capability agreed over the group, NCCL), and its tear-down.
void set_up_rank(Rank& r);
void leave_group(Rank& r);

// bench.cpp: the ceilings (every rank at once).
void measure_ceilings(Rank& r, BenchRank& out);

}  // namespace cpkv::cuda

namespace cpkv::cuda {
// bench.cpp: the worst rank's figures of every batch and ceiling, into `out`.
void fold_bench(const Bootstrap& boot, std::int32_t cp, std::int64_t batches, BenchResult& out);
}  // namespace cpkv::cuda

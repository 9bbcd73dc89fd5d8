// The fused layer: the producer step (fill + zeroed tails, every kind in one launch) and the compose
// exchange (local copies, peers' pages, the counting barrier folded in, every kind in one launch).
#include "launchers.cuh"
#include "flags.cuh"

#include <algorithm>
#include <cstdlib>

#include "cpkv/model/content.hpp"

namespace cpkv::kernels {

void set_page_geometry(ComposeKind& kind, std::uint64_t page_bytes) {
  kind.page_bytes = page_bytes;
  if (page_bytes % 16 != 0) {  // byte copies, one warp per page
    kind.chunks = 1;
    kind.chunk_bytes = page_bytes;
    return;
  }
  kind.chunks = static_cast<std::int32_t>((page_bytes + kChunkBytesMax - 1) / kChunkBytesMax);
  const std::uint64_t even = (page_bytes + kind.chunks - 1) / kind.chunks;
  kind.chunk_bytes = (even + 15) / 16 * 16;
}

namespace {

__device__ void wait_flag(const ComposeArgs& a, std::int32_t peer, std::uint64_t phase) { wait_flag(a.peer_pads, a.rank, peer, phase, a.status); }

// Lanes p < cp of one warp store `phase` into word `rank` of peer p's pad (this rank's earlier
// writes, made visible system-wide first).
__device__ void signal_peers(std::uint64_t* const* pads, std::int32_t rank, std::int32_t cp, std::uint64_t phase, int lane) {
  __threadfence_system();
  if (lane < cp) store_release_sys(pads[lane] + rank, phase);
}
__device__ void signal_peers(const ComposeArgs& a, std::uint64_t phase, int lane) { signal_peers(a.peer_pads, a.rank, a.cp, phase, lane); }

// One warp copies one chunk of a page (or writes zeros when `in` is null): at most 32 lanes x
// kCopyUnroll 16-byte loads, all in flight before the stores, so remote (NVLink) latency overlaps.
__device__ void warp_copy_chunk(std::uint8_t* out, const std::uint8_t* in, std::uint64_t bytes, int lane) {
  if (bytes % 16 != 0) {
    for (std::uint64_t i = lane; i < bytes; i += 32) out[i] = in ? in[i] : 0;
    return;
  }
  const std::uint64_t n = bytes / 16;
  const uint4* src = reinterpret_cast<const uint4*>(in);
  uint4* dst = reinterpret_cast<uint4*>(out);
  for (std::uint64_t base = lane; base < n; base += 32 * kCopyUnroll) {
    uint4 v[kCopyUnroll];
#pragma unroll
    for (int j = 0; j < kCopyUnroll; ++j) {
      const std::uint64_t i = base + 32 * j;
      v[j] = (in && i < n) ? src[i] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < kCopyUnroll; ++j) {
      const std::uint64_t i = base + 32 * j;
      if (i < n) dst[i] = v[j];
    }
  }
}

// Part `r` of entry `e` (a work item is entry item / items_per_entry, part item % items_per_entry):
// a kind and a chunk of its page. The caller loads the entry once.
__device__ void copy_item(const ComposeArgs& a, const GatherEntry& e, std::int32_t r, int lane) {
  std::int32_t kind = 0;
  while (r >= a.kind[kind].chunks) r -= a.kind[kind++].chunks;
  const ComposeKind& k = a.kind[kind];
  // The host checked the same before upload (gpu/device_plan.cpp): a bad entry is a plan bug.
  CPKV_DEVICE_ASSERT(e.dest >= 0 && e.dest < kComposeDests && e.table_index < kTableEntriesMax);
  const std::uint64_t offset = static_cast<std::uint64_t>(r) * k.chunk_bytes;
  const std::uint64_t bytes = min(k.chunk_bytes, k.page_bytes - offset);
  const std::uint8_t* in = nullptr;
  if (e.table_index >= 0) {
    CPKV_DEVICE_ASSERT(k.table.base[e.table_index] != nullptr && e.src_page >= 0);
    in = k.table.base[e.table_index] + e.src_page * k.page_bytes + offset;
  }
  warp_copy_chunk(k.dst[e.dest] + e.dst_page * k.page_bytes + offset, in, bytes, lane);
}

// Thread 0 takes the block's ticket once every warp of the block is past this point (its copies
// made visible system-wide first: the barrier orders the block's writes before the thread's
// cumulative fence); true in every thread of the block that took the last of `total`, whose
// thread 0 fences again after its ticket (the acquire side: what the other blocks wrote before
// theirs is ordered before what this block does next, as a cooperative-groups grid sync does).
// One atomic per block, not per warp: thousands of warps on one counter serialize at its L2 slice.
__device__ bool last_block_ticket(std::uint32_t* counter, std::uint32_t total) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    last = atomicAdd(counter, 1U) == total - 1;
    if (last) __threadfence_system();
  }
  __syncthreads();
  return last;
}

// Every block of the launch is done with the pre-signal entries (they are visible: each fenced
// before its ticket). Bounded like the barrier; a timeout names this rank as the one waited for.
__device__ void wait_pre_done(const ComposeArgs& a, std::uint32_t blocks) {
  if (threadIdx.x == 0) {
    const long long start = clock64();
    PollBackoff backoff;
    for (;;) {
      std::uint32_t arrived = 0;
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(arrived) : "l"(&a.state->arrived) : "memory");
      if (arrived >= blocks) break;
      if (clock64() - start > kBarrierTimeoutCycles) {
        a.status->timed_out_phase = a.state->phase + 1;
        a.status->rank = a.rank;
        a.status->missing_peer = a.rank;
        break;
      }
      backoff.pause();
    }
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kComposeThreads) compose_kernel(const __grid_constant__ ComposeArgs a) {
  const int lane = threadIdx.x % 32;
  const std::int64_t warp = (std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
  const std::int64_t warps = std::int64_t{gridDim.x} * blockDim.x / 32;
  const std::uint64_t phase = a.state->phase + 1;  // every block reads it before the last one writes it
  const std::uint64_t flag = phase - a.phase_lag;
  if (a.barrier == kSignalAtStart && warp == 0) signal_peers(a, flag, lane);
  const std::int64_t pre_items = a.pre_count * a.items_per_entry;
  for (std::int64_t item = warp; item < pre_items; item += warps) {
    copy_item(a, a.entries[item / a.items_per_entry], static_cast<std::int32_t>(item % a.items_per_entry), lane);
  }
  if (a.barrier == kSignalAfterPre || a.order_pre) {
    const bool last = last_block_ticket(&a.state->arrived, gridDim.x);
    if (a.barrier == kSignalAfterPre && last && threadIdx.x < 32) signal_peers(a, flag, lane);
  }
  if (a.order_pre) wait_pre_done(a, gridDim.x);
  std::uint32_t waited = 0;  // peers whose flag this warp has seen (bit per rank)
  for (std::int64_t item = pre_items + warp; item < a.count * a.items_per_entry; item += warps) {
    const GatherEntry e = a.entries[item / a.items_per_entry];
    const std::int32_t peer = e.table_index - a.cp;
    if (a.barrier != kNoBarrier && peer >= 0 && peer < a.cp && !(waited >> peer & 1U)) {
      if (lane == 0) wait_flag(a, peer, flag);
      __syncwarp();
      if (waited == 0 && a.reader_spin_cycles > 0) {
        const long long start = clock64();
        while (clock64() - start < a.reader_spin_cycles) {
        }
      }
      waited |= 1U << peer;
    }
    copy_item(a, e, static_cast<std::int32_t>(item % a.items_per_entry), lane);
  }
  // The last block out makes the launch a whole barrier (every peer arrived: they are done with the
  // previous layer's reads) and hands the phase to the next launch.
  if (!last_block_ticket(&a.state->finished, gridDim.x) || threadIdx.x >= 32) return;
  if (a.barrier != kNoBarrier && lane < a.cp) {
    wait_flag(a, lane, flag);
  }
  __syncwarp();
  if (lane == 0) {
    if (a.barrier != kNoBarrier) a.state->phase = phase;
    a.state->arrived = 0;
    a.state->finished = 0;
  }
}

// The request's cap per SM (set_compose_blocks_per_sm; 0: kComposeBlocksPerSm), read once by the
// first launch of the process.
int g_compose_blocks_per_sm = 0;

// The compose grid's cap: every block resident at once (its blocks wait on each other), and at most
// kComposeBlocksPerSm per SM (--compose-blocks-per-sm overrides it, for the bench's A/B).
int compose_blocks_max() {
  static const int blocks = [] {
    int device = 0, sms = 0, per_sm = 0;
    CPKV_CUDA_CHECK(cudaGetDevice(&device));
    CPKV_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    CPKV_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, compose_kernel, kComposeThreads, 0));
    int wanted = kComposeBlocksPerSm;
    if (g_compose_blocks_per_sm > 0) wanted = g_compose_blocks_per_sm;
    return std::max(1, sms * std::min(per_sm, wanted));
  }();
  return blocks;
}

}  // namespace

void set_compose_blocks_per_sm(int blocks) { g_compose_blocks_per_sm = blocks; }

cudaError_t launch_compose(const ComposeArgs& args, cudaStream_t stream) {
  CPKV_ASSERT(args.kinds >= 0 && args.kinds <= kKindsMax && args.cp >= 1 && args.cp <= kCpMax);  // 0 kinds: a layer that moves nothing still passes its barrier
  CPKV_ASSERT(args.pre_count >= 0 && args.pre_count <= args.count && args.state != nullptr);
  std::int32_t items_per_entry = 0;
  for (int k = 0; k < args.kinds; ++k) {
    const ComposeKind& kind = args.kind[k];
    CPKV_ASSERT(kind.chunks >= 1 && kind.chunk_bytes * kind.chunks >= kind.page_bytes && kind.chunk_bytes * (kind.chunks - 1) < kind.page_bytes);
    CPKV_ASSERT(kind.page_bytes % 16 != 0 || (kind.chunk_bytes % 16 == 0 && kind.chunk_bytes <= kChunkBytesMax));
    items_per_entry += kind.chunks;
  }
  ComposeArgs launched = args;  // what the kernel derives its work items from, summed here once
  launched.items_per_entry = items_per_entry;
  const std::int64_t items = args.count * items_per_entry;
  const std::int64_t wanted = std::max<std::int64_t>(1, (items + kComposeWarps - 1) / kComposeWarps);
  const int blocks = static_cast<int>(std::min<std::int64_t>(wanted, compose_blocks_max()));
  compose_kernel<<<blocks, kComposeThreads, 0, stream>>>(launched);
  return cudaGetLastError();
}

namespace {

// Stores `bytes` (1..8) of `word` at `out`, the widest stores the row's alignment allows: rows start
// at multiples of row_bytes from a 256-byte-aligned base.
__device__ __forceinline__ void store_word(std::uint8_t* out, std::uint64_t word, std::uint32_t bytes, std::uint32_t row_bytes) {
  if (bytes == 8 && row_bytes % 8 == 0) {
    *reinterpret_cast<std::uint64_t*>(out) = word;
  } else if (bytes % 4 == 0 && row_bytes % 4 == 0) {
    for (std::uint32_t b = 0; b < bytes; b += 4) *reinterpret_cast<std::uint32_t*>(out + b) = static_cast<std::uint32_t>(word >> (8 * b));
  } else {
    for (std::uint32_t b = 0; b < bytes; ++b) out[b] = static_cast<std::uint8_t>(word >> (8 * b));
  }
}

// One warp per produced row, its lanes on consecutive 8-byte words (coalesced stores); blockIdx.y is
// the kind. The row's key and destination are worked out once per row, not once per word: the
// per-word cost is one mix and one store, so the fill runs at the store rate, not the integer rate.
__global__ void produce_kernel(const __grid_constant__ ProduceArgs a) {
  const ProduceKind& k = a.kind[blockIdx.y];
  const std::uint32_t words = (k.row_bytes + 7) / 8;
  const std::int64_t rows = a.page_count * a.page_size;
  const std::uint32_t lane = threadIdx.x % 32;
  const std::int64_t warps_per_block = blockDim.x / 32;
  for (std::int64_t row = blockIdx.x * warps_per_block + threadIdx.x / 32; row < rows; row += gridDim.x * warps_per_block) {
    const std::int32_t t = a.row_token[row];
    if (t == kRowUntouched || (t < 0 && !a.zero_tails)) continue;
    const std::uint64_t key =
        t >= 0 ? model::current_row_key(a.seed, a.layer, k.kind, static_cast<std::uint32_t>(a.request[t]), static_cast<std::uint64_t>(a.token[t])) : 0;
    const std::int64_t page = a.pages[row / a.page_size];
    std::uint8_t* out = k.dest + (page * a.page_size + row % a.page_size) * static_cast<std::uint64_t>(k.row_bytes);
    for (std::uint32_t w = lane; w < words; w += 32) {
      const std::uint64_t word = t >= 0 ? model::content_word(key, w) : 0;
      store_word(out + 8 * w, word, min(8U, k.row_bytes - 8 * w), k.row_bytes);
    }
  }
}

}  // namespace

cudaError_t launch_produce(const ProduceArgs& args, cudaStream_t stream) {
  CPKV_ASSERT(args.kinds >= 0 && args.kinds <= kKindsMax);
  if (args.page_count == 0 || args.kinds == 0) return cudaSuccess;
  const std::int64_t rows = args.page_count * args.page_size;
  const int blocks = static_cast<int>(std::clamp<std::int64_t>((rows + kProduceWarps - 1) / kProduceWarps, 1, kProduceBlocksMax));
  produce_kernel<<<dim3(blocks, args.kinds), kProduceThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

namespace {

// Copies (or zeroes, `in` null) one row with the widest accesses both ends' alignment allows.
__device__ void warp_copy_row(std::uint8_t* out, const std::uint8_t* in, std::uint32_t bytes, std::uint32_t lane) {
  const auto align = reinterpret_cast<std::uintptr_t>(out) | reinterpret_cast<std::uintptr_t>(in) | bytes;
  if (align % 16 == 0) {
    for (std::uint32_t i = lane; i < bytes / 16; i += 32) reinterpret_cast<uint4*>(out)[i] = in ? reinterpret_cast<const uint4*>(in)[i] : uint4{0, 0, 0, 0};
  } else if (align % 4 == 0) {
    for (std::uint32_t i = lane; i < bytes / 4; i += 32) reinterpret_cast<std::uint32_t*>(out)[i] = in ? reinterpret_cast<const std::uint32_t*>(in)[i] : 0U;
  } else {
    for (std::uint32_t i = lane; i < bytes; i += 32) out[i] = in ? in[i] : 0;
  }
}

__global__ void reorder_kernel(const __grid_constant__ ReorderArgs a) {
  const ReorderKind& k = a.kind[blockIdx.y];
  const std::uint32_t lane = threadIdx.x % 32;
  const std::int64_t warps_per_block = blockDim.x / 32;
  for (std::int64_t row = blockIdx.x * warps_per_block + threadIdx.x / 32; row < a.rows; row += gridDim.x * warps_per_block) {
    const std::int64_t source = a.source[row];
    if (source < 0 && a.zero_missing == 0) continue;
    std::uint8_t* out = k.dense + (a.slot[row / a.page_size] * a.page_size + row % a.page_size) * static_cast<std::uint64_t>(k.row_bytes);
    warp_copy_row(out, source < 0 ? nullptr : k.gathered + source * static_cast<std::uint64_t>(k.row_bytes), k.row_bytes, lane);
  }
}

}  // namespace

cudaError_t launch_reorder(const ReorderArgs& args, cudaStream_t stream) {
  CPKV_ASSERT(args.kinds >= 0 && args.kinds <= kKindsMax);
  if (args.rows == 0 || args.kinds == 0) return cudaSuccess;
  const int blocks = static_cast<int>(std::clamp<std::int64_t>((args.rows + kProduceWarps - 1) / kProduceWarps, 1, kProduceBlocksMax));
  reorder_kernel<<<dim3(blocks, args.kinds), kProduceThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

namespace {

__global__ void barrier_next_kernel(std::uint64_t* const* peer_pads, std::int32_t rank, std::int32_t cp, BarrierState* state, std::int32_t lag,
                                    BarrierStatus* status) {
  const std::uint64_t phase = state->phase + 1;
  const int p = threadIdx.x;
  if (p < cp) {
    signal_peers(peer_pads, rank, cp, phase - lag, p);
    wait_flag(peer_pads, rank, p, phase - lag, status);
  }
  __syncthreads();
  if (p == 0) state->phase = phase;
}

}  // namespace

cudaError_t launch_barrier_next(std::uint64_t* const* peer_pads, std::int32_t rank, std::int32_t cp, BarrierState* state, std::int32_t lag,
                                BarrierStatus* status, cudaStream_t stream) {
  barrier_next_kernel<<<kOneBlock, kBarrierThreads, 0, stream>>>(peer_pads, rank, cp, state, lag, status);
  return cudaGetLastError();
}

}  // namespace cpkv::kernels
// Limits and launch shapes of the kernels, each with its reason (every <<<...>>> of kernels/*.cu
// names its shape here).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "cpkv/model/limits.hpp"

namespace cpkv::kernels {

// Ranks of one group: one node's GPUs.
inline constexpr int kCpMax = 8;
static_assert(kCpMax == cpkv::model::limits::cp_max, "the kernels hold every rank count the model accepts, and no more");
// The pointer table: 2*cp gather entries (pools, then staging or symmetric dense) plus the own
// dense and compact bases, for cp up to kCpMax.
inline constexpr int kTableEntriesMax = 2 * kCpMax + 2;
inline constexpr int kTableOwnDense = 2 * kCpMax;
inline constexpr int kTableOwnCompact = 2 * kCpMax + 1;
static_assert(kTableOwnCompact < kTableEntriesMax, "the own bases sit past the 2*cp gather entries, inside the table");
// Threads of a warp (every CUDA GPU so far): the compose and produce kernels hand out work per warp.
inline constexpr int kWarpThreads = 32;
// Launches that are one block: the barrier kernels (their threads wait on each other inside one
// __syncthreads), the stamp check, and the single-thread helpers (spin, stamp).
inline constexpr int kOneBlock = 1;
// The spin and stamp helpers do one thing once: one thread (a slow producer, a single flag store).
inline constexpr int kOneThread = 1;
// A barrier block (barrier, barrier loop, barrier_next) and the stamp check: one warp, thread p
// talks to peer p, so the warp must hold a thread for every rank the kernels accept.
inline constexpr int kBarrierThreads = kWarpThreads;
static_assert(kBarrierThreads >= kCpMax, "a barrier block has one thread per peer, for every cp the model accepts");
// Threads of a gather block: 256 x 16 B = 4 KiB per pass; a 64-row fp8 page (41,984 B) takes 11.
inline constexpr int kGatherThreads = 256;
// The grid-stride element kernels (pool population, verification, the byte sum): 256 threads a
// block (8 warps), each thread one 8-byte word (one byte for the sum)
// per pass. Their grids are capped below; none of the three caps has a recorded measurement (they
// run outside the timed layer: population and verification once per batch, the sum only where ranks
// share a GPU). 4096 x 256 threads is ~3.9 waves of an H200's 132 x 2048 resident threads; 8192 ~7.8.
inline constexpr int kElementwiseThreads = 256;
inline constexpr int kPopulateBlocksMax = 4096;
inline constexpr int kVerifyBlocksMax = 8192;
inline constexpr int kSumBlocksMax = 4096;
static_assert(kElementwiseThreads % kWarpThreads == 0, "whole warps");
// The produce kernel: one warp per produced row, 8 warps a block; grid capped at 4096 blocks
// (32,768 rows in flight, grid-stride beyond; the cap has no recorded measurement).
inline constexpr int kProduceWarps = 8;
inline constexpr int kProduceThreads = kWarpThreads * kProduceWarps;
inline constexpr int kProduceBlocksMax = 4096;
// Blocks in flight for gathers: enough to keep every H200 SM (132) busy several times over.
inline constexpr int kGatherBlocksMax = 132 * 8;
// Buffer kinds one fused launch handles (DeepSeek-V3.2 has two: the MLA KV rows and the indexer
// keys); the host refuses a setting with more before anything is launched.
inline constexpr int kKindsMax = 4;
// The fused compose kernel copies one chunk of a page per warp (several pages per block), each lane
// with kCopyUnroll 16-byte loads in flight before its stores: 32 x 8 x 16 B = 4 KiB per warp pass.
inline constexpr int kComposeThreads = 256;
inline constexpr int kComposeWarps = kComposeThreads / kWarpThreads;
static_assert(kComposeThreads % kWarpThreads == 0, "the compose kernel hands out work per whole warp");
inline constexpr int kCopyUnroll = 8;
// Compose blocks per SM wanted; the grid takes the smaller of this and the occupancy: at 63
// registers a thread (ptxas -v, CUDA 13.0), 4 blocks of 8 warps fit an H200 SM, so the grid is
// every resident block (528). The gather probe (bench/gather_probe.cu, 2xH200, 2026-11-30) pulled at
// about the same rate with 1, 2, 4 or 8 blocks per SM (0.867-0.869 of the copy engines at 4096
// pages of 41,984 B), but in the layers the warps waiting on peers' flags need company: cpkv
// bench, seeds batch, cp 2, staging_direct 126.3 us with 2 blocks per SM against 118.3 us with
// every resident block (--compose-blocks-per-sm, same visit).
inline constexpr int kComposeBlocksPerSm = 8;
// A page is cut into chunks of at most this many bytes, one warp each. Measured on 2xH200
// (2026-11-30, cpkv bench, cp 2): chunks of one warp pass (4 KiB) were slower on real batches than
// a warp per page (seeds batch staging_publish 153.8 -> 172.2 us, a 6.8 MB Mooncake batch
// staging_direct 29.6 -> 42.8 us) and no faster on the gather sweep past 256 pages, so a chunk is
// a whole page up to 64 KiB (both DeepSeek-V3.2 page sizes). Measured again with one ticket per
// block (same date): spreading a launch of few entries over 2112 warps of finer chunks made the
// 6.8 MB Mooncake batch's staging_direct 29.2 -> 35.3 us and staging_publish 41.7 -> 46.3 us.
inline constexpr std::uint64_t kChunkBytesMax = 64ULL << 10;
// The bulk-copy (TMA) gather: chunks of 16 KiB through two shared-memory stages (32 KiB per
// one-thread block, so 7 blocks fit an H200 SM's 228 KiB), up to 8 blocks per SM.
// One warp a block, of which thread 0 drives the copies (a block is scheduled as whole warps anyway).
inline constexpr std::uint64_t kBulkChunkBytes = 16ULL << 10;
inline constexpr int kBulkStages = 2;
inline constexpr int kBulkThreads = kWarpThreads;
inline constexpr int kBulkBlocksMax = 132 * 8;
static_assert(kBulkStages * kBulkChunkBytes <= (48U << 10),
              "the bulk gather's dynamic shared memory stays under the 48 KiB a launch gets without opting in");
// A barrier poll gives up after ~2^34 cycles: ~9 s at 1.98 GHz, far past any legitimate wait
// (oversubscribed functional runs see ~7 ms), short enough that a hang is reported, not waited out.
inline constexpr long long kBarrierTimeoutCycles = 1LL << 34;
// A planted bug's race window (GPU mutants only): the slow producer or reader spins 2^23 cycles,
// ~4 ms at 1.98 GHz, far longer than one layer of the test batches (tens of us), so the race is
// lost on every run rather than once in a while.
inline constexpr long long kMutantWindowCycles = 1LL << 23;

// The plugin host's page hash: one block of 8 warps per pool page (a 64-row fp8 page is 5,248
// words, about 20 per thread), grid-stride over the pages, capped like the element kernels; it
// runs twice per batch, outside the layers (no recorded measurement).
inline constexpr int kHashThreads = 256;
inline constexpr int kHashBlocksMax = 4096;
static_assert(kHashThreads % kWarpThreads == 0, "the hash reduces whole warps");
// Guard regions the plugin host checks after every layer: two per kind (the dense halves), one
// per symmetric allocation (the ABI's CPKV_SYMMETRIC_MAX, the flag pad among them) and one per
// rows buffer.
inline constexpr int kGuardSymmetricMax = 16;
inline constexpr int kGuardRegionsMax = 2 * kKindsMax + kGuardSymmetricMax + kKindsMax;
// Each region's size is the layout's guard_bytes (gpu/pool_backing.hpp).

}  // namespace cpkv::kernels

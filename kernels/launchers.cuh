// Every host launcher of the cpkv kernels (one header lists them, as DeepEP does). Each kernel sits
// beside its launcher in a .cu file; each launcher returns the cudaError_t of its launch so callers
// check it with CPKV_CUDA_CHECK. Limits and launch shapes live in kernels/config.cuh.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "checks.cuh"
#include "config.cuh"

namespace cpkv::kernels {

// The pointer table of a slot-dense gather: entries 0..cp-1 are the pool bases of ranks 0..cp-1 for
// one layer and buffer kind, cp..2cp-1 the staging (or symmetric dense) bases for the layer's half,
// then this rank's own dense and compact bases (local copies use the same kernel). Passed by value:
// no per-layer upload.
struct PointerTable {
  const std::uint8_t* base[kTableEntriesMax];
};

// One gather entry: write page `dst_page` of the destination from page `src_page` of
// table.base[table_index], or zeros when table_index == -1. `dest` picks the destination buffer in
// the fused compose kernel (ComposeDest); the single-list gather ignores it.
struct GatherEntry {
  std::int64_t dst_page;
  std::int64_t src_page;
  std::int32_t table_index;
  std::int32_t dest;
};
enum ComposeDest : std::int32_t { kToDense = 0, kToStaging = 1, kToCompact = 2, kComposeDests = 3 };

// The slot-dense gather: `entries` pages of `page_bytes`, 16-byte accesses when the page size
// allows, one block per page in flight (grid-stride). One launch per buffer kind.
cudaError_t launch_gather(std::uint8_t* dst, std::uint64_t page_bytes, PointerTable table, const GatherEntry* entries,
                          std::int64_t count, cudaStream_t stream);

// The same gather through the bulk-copy engine (TMA), for the bench's gather sweep: page_bytes a
// multiple of 16. A chunk load that never lands is counted in `status` instead of hanging.
struct BulkStatus {
  unsigned long long timeouts;
};
cudaError_t launch_bulk_gather(std::uint8_t* dst, std::uint64_t page_bytes, PointerTable table, const GatherEntry* entries,
                               std::int64_t count, BulkStatus* status, cudaStream_t stream);


// Writes the prefix content of pool pages: page `logical[i]` lands at local page `local[i]` of `pool`.
cudaError_t launch_populate_pool(std::uint8_t* pool, std::uint32_t row_bytes, std::int32_t page_size, const std::int64_t* logical,
                                 const std::int64_t* local, std::int64_t count, std::uint64_t seed, std::uint32_t layer,
                                 std::uint32_t kind, cudaStream_t stream);

// The counting barrier over IPC-mapped flags. Scheme (PyTorch symmetric memory's signal pad, with
// DeepEP's bounded spin): every rank owns a pad of cp 64-bit words; arriving at phase k, rank a
// stores k into word a of every peer's pad (st.release.sys), then polls its own pad until every
// word is >= k (ld.acquire.sys). Words only grow, so the barrier is reusable with no reset and
// back-to-back phases cannot be confused (a fast rank's k+1 still satisfies >= k, and it cannot
// reach k+2 before everyone arrived at k+1). At quiescence every word equals the phase count
// (drained). A poll that exceeds kBarrierTimeoutCycles writes {phase, rank, missing peer} to
// `status` and returns instead of hanging the GPU.
struct BarrierStatus {
  std::uint64_t timed_out_phase;  // 0: no timeout
  std::int32_t rank;
  std::int32_t missing_peer;
};
cudaError_t launch_barrier(std::uint64_t* const* peer_pads, std::int32_t rank, std::int32_t cp, std::uint64_t phase,
                           BarrierStatus* status, cudaStream_t stream);

// The device side of the counting barrier, per rank: the phase of its last barrier (the next one is
// phase + 1, read on the device, so a captured CUDA graph replays with fresh phases) and the tickets
// of the fused compose kernel's warps (zero between launches).
struct BarrierState {
  std::uint64_t phase;
  std::uint32_t arrived;   // blocks done with the pre-signal entries
  std::uint32_t finished;  // blocks done with everything
};
// launch_barrier with the phase taken from (and written back to) `state`: phase = state->phase + 1;
// `lag` 1 signals and waits for phase - 1 (the planted bug barrier_passes_early).
cudaError_t launch_barrier_next(std::uint64_t* const* peer_pads, std::int32_t rank, std::int32_t cp, BarrierState* state,
                                std::int32_t lag, BarrierStatus* status, cudaStream_t stream);

// The producer step of one layer, every active kind in one launch: the current rows this rank
// computed (what the model's own KV write does in serving) land in their pages, and the rows of
// those pages that hold no token are zeroed (PROTOCOL.md: the tail of a partial page reads 0).
// Page i's row r comes from token row_token[i * page_size + r] of the inverse (request[], token[]),
// is zero when that is kRowZero (and zero_tails is set), and is left alone when kRowUntouched (a
// fill destination page the plan does not zero).
inline constexpr std::int32_t kRowZero = -1;
inline constexpr std::int32_t kRowUntouched = -2;
struct ProduceKind {
  std::uint8_t* dest;   // the kind's fill destination (staging half or dense half)
  std::uint32_t row_bytes;
  std::uint32_t kind;   // the kind's index, for the content key
};
struct ProduceArgs {
  ProduceKind kind[kKindsMax];
  std::int32_t kinds;
  std::int32_t page_size;
  const std::int64_t* pages;      // destination page of each produced page
  const std::int32_t* row_token;  // [pages * page_size]
  std::int64_t page_count;
  const std::int32_t* request;
  const std::int64_t* token;
  std::uint64_t seed;
  std::uint32_t layer;
  std::int32_t zero_tails;
};
cudaError_t launch_produce(const ProduceArgs& args, cudaStream_t stream);

// Section 12's re-ordering of one layer, every active kind in one launch (blockIdx.y): current row
// i * page_size + o of the batch (current index i, dense slot slot[i]) is copied from row
// source[i * page_size + o] of the kind's gathered rows (every rank's padded send rows, one
// all-gather's output), or zeroed where that is -1 (past the end of a partial page), or left as it
// is there when zero_missing is 0 (the planted bug skip_zero). One warp per row.
struct ReorderKind {
  std::uint8_t* dense;           // the kind's dense half (slot 0)
  const std::uint8_t* gathered;  // the kind's gathered rows
  std::uint32_t row_bytes;
};
struct ReorderArgs {
  ReorderKind kind[kKindsMax];
  std::int32_t kinds;
  std::int32_t page_size;
  const std::int64_t* slot;    // [current pages]
  const std::int64_t* source;  // [rows]
  std::int64_t rows;           // current pages * page_size
  std::int32_t zero_missing;
};
cudaError_t launch_reorder(const ReorderArgs& args, cudaStream_t stream);

// The compose exchange of one layer, every active kind, in one launch, with the counting barrier
// folded in: warps copy the pre-signal entries (the pack and the publish, which read this layer's
// fill), the rank signals every peer (at the start when nothing of this launch needs to be
// visible first, else when the last block is done with its pre-signal entries), each warp waits for
// the flag of the peer whose staging (or symmetric dense) page it reads next while it copies the
// post entries (local prefix pages, peers' pool pages, peers' current pages), and the launch ends
// only once every peer has arrived (so the next layer may refill the other parity half). The phase
// advances only when the launch has a barrier. Entries
// [0, pre_count) are pre-signal, [pre_count, count) post-wait; a work item is one chunk of one
// kind's page of one entry. The grid never exceeds what fits on the GPU at once (blocks wait on each other).
enum ComposeBarrier : std::int32_t { kNoBarrier = 0, kSignalAtStart = 1, kSignalAfterPre = 2 };
struct ComposeKind {
  std::uint8_t* dst[kComposeDests];
  std::uint64_t page_bytes;
  std::uint64_t chunk_bytes;  // one warp's share of a page (set_page_geometry)
  std::int32_t chunks;        // chunks per page
  PointerTable table;
};
struct ComposeArgs {
  ComposeKind kind[kKindsMax];
  std::int32_t kinds;
  std::int32_t items_per_entry;  // chunks of all kinds: set by launch_compose (callers leave it)
  const GatherEntry* entries;
  std::int64_t pre_count;
  std::int64_t count;
  std::uint64_t* const* peer_pads;
  std::int32_t rank;
  std::int32_t cp;
  BarrierState* state;
  BarrierStatus* status;
  std::int32_t barrier;     // ComposeBarrier
  std::int32_t phase_lag;   // 1: the planted bug barrier_passes_early
  long long reader_spin_cycles;  // the planted bug slow_reader: spin after the first wait
  std::int32_t order_pre;        // post entries start only once every pre entry is done (the pack
                                 // reads fill pages that gather 1 then zeroes)
};
// The page geometry of one kind: page_bytes, cut into equal 16-byte-aligned chunks of at most
// kChunkBytesMax (launch_compose sums the chunks of the kinds).
void set_page_geometry(ComposeKind& kind, std::uint64_t page_bytes);
cudaError_t launch_compose(const ComposeArgs& args, cudaStream_t stream);
// The compose grid's cap per SM for this process (the request's compose_blocks_per_sm; 0: the
// default kComposeBlocksPerSm); set in a rank process before its first launch_compose.
void set_compose_blocks_per_sm(int blocks);

// Per slot of the dense buffer, where its rows come from (uploaded once per batch).
struct SlotSource {
  std::int64_t logical_page;  // prefix: pool page; current: -1
  std::int64_t first_token;   // current: token of row 0
  std::int32_t request;       // current: request index
  std::int32_t rows_valid;    // rows past it are zero
};
struct VerifyResult {
  unsigned long long wrong_bytes;
  // The first wrong byte, packed so one atomicMin keeps index and values together:
  // (byte index << 16) | (expected << 8) | actual; ~0 if none.
  unsigned long long first_wrong;
};
// Recomputes every expected byte of a dense buffer and counts the wrong ones, keeping the first.
cudaError_t launch_verify(const std::uint8_t* dense, std::uint32_t row_bytes, std::int32_t page_size, const SlotSource* slots,
                          std::int64_t slot_count, std::uint64_t seed, std::uint32_t layer, std::uint32_t kind,
                          VerifyResult* result, cudaStream_t stream);

// Sum of `cp` byte buffers (table.base[0..cp-1], each `bytes` long) into `dst`, byte-wise modulo 256:
// the all-reduce used where ranks share a GPU (NCCL refuses two ranks on one device). Exact for
// writer-exclusive bytes, like the NCCL sum it stands in for.
cudaError_t launch_sum_bytes(std::uint8_t* dst, PointerTable table, std::int32_t cp, std::uint64_t bytes, cudaStream_t stream);

// `count` barriers in one launch (phases first_phase .. first_phase + count - 1): the barrier's
// latency without the launch, for the benchmark.
cudaError_t launch_barrier_loop(std::uint64_t* const* peer_pads, std::int32_t rank, std::int32_t cp, std::uint64_t first_phase,
                                std::int32_t count, BarrierStatus* status, cudaStream_t stream);

// Byte ranges zeroed in one launch: the fused plugin's dense half, one range per kind active on
// the layer, the host's guard bytes between two kinds' buffers untouched. A cudaMemsetAsync per
// range is a graph node each, one more per layer than the single memset over the half that cpkv's
// in-process layer used before the guards split it (measured: +1 us per layer at cp 1 on H100,
// mooncake_slice batch 0). Each range 16-byte aligned and a multiple of 16 bytes (zero_ranges_fit
// says whether a set of ranges is; the caller falls back to memsets where not).
struct ZeroRanges {
  void* base[kKindsMax];
  std::uint64_t bytes[kKindsMax];
  std::int32_t count;
};
bool zero_ranges_fit(const ZeroRanges& ranges);
cudaError_t launch_zero_ranges(const ZeroRanges& ranges, cudaStream_t stream);

// Test and benchmark helpers for the barrier: spin for `cycles` on the device (a slow producer),
// stamp `value` into `word`, and count the peers whose stamp word differs from `expected`.
cudaError_t launch_spin(long long cycles, cudaStream_t stream);
cudaError_t launch_stamp(std::uint64_t* word, std::uint64_t value, cudaStream_t stream);
cudaError_t launch_check_stamps(const std::uint64_t* const* words, std::int32_t cp, std::uint64_t expected, unsigned long long* errors,
                                cudaStream_t stream);

// Writes outside an exchange plugin's buffers (gpu/plugin_guards.cpp). A guard region is bytes
// just past a buffer the host hands a plugin (each dense buffer, each symmetric allocation, each
// rows buffer), poisoned with guard_byte(offset within the region): a byte pattern of period 256
// with no two neighbours equal, so a stray store of any constant over two bytes or more is seen,
// and a one-byte store unless it happens to hold that byte's poison.
struct GuardRegion {
  std::uint8_t* base;
  std::uint64_t bytes;
};
__host__ __device__ constexpr std::uint8_t guard_byte(std::uint64_t offset) { return static_cast<std::uint8_t>(0xC3u + 0x9Du * (offset & 0xffu)); }
// The wrong guard bytes of one check and the first, packed for one atomicMin:
// (region << 40) | (offset in the region << 8) | actual; ~0 if none.
struct GuardResult {
  unsigned long long wrong_bytes;
  unsigned long long first_wrong;
};
// Every region's bytes set to the poison (at allocation, and after a finding: each write is reported once).
cudaError_t launch_guard_poison(const GuardRegion* regions, std::int32_t count, cudaStream_t stream);
// Every region compared with the poison, into `result`. First stamps `milestone_value` into the
// host-mapped word `milestone` (null: none): the kernel started, so the work before it on the
// stream ended without a device fault.
cudaError_t launch_guard_check(const GuardRegion* regions, std::int32_t count, GuardResult* result, std::uint64_t* milestone, std::uint64_t milestone_value,
                               cudaStream_t stream);

// One pool page to hash: `bytes` at `offset` from the slab's base.
struct HashedPage {
  std::uint64_t offset;
  std::uint64_t bytes;
};
struct HashCompare {
  unsigned long long changed;        // pages whose hash differs from the reference
  unsigned long long first_changed;  // the lowest such page index; ~0 if none
};
// A hash per page (a sum of a bijective mix of each 8-byte word with its index: a one-word change
// always shows). compare false: written into reference[page]; true: compared with it into `result`,
// and the reference updated (each change is reported once).
cudaError_t launch_hash_pages(const std::uint8_t* base, const HashedPage* pages, std::int64_t count, std::uint64_t* reference, bool compare,
                              HashCompare* result, cudaStream_t stream);

}  // namespace cpkv::kernels

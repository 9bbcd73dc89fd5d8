// What one GPU rank allocates, computed on the host before anything is allocated (no CUDA here):
// the byte layout of its buffers (pool slabs per layer and kind, dense halves, compact, staging,
// the IPC all-reduce scratch), the physical chunks that back the pool slabs (only those holding a
// page some batch of the source references: the rest of each slab is reserved address space that
// nothing reads), and the bytes every GPU needs beside what it has free, refused in one line when
// they do not fit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cpkv/harness/shared_region.hpp"
#include "cpkv/harness/source.hpp"
#include "cpkv/model/setting.hpp"

namespace cpkv::cuda {

// The byte offsets of every buffer of one rank (identical on every rank: a peer's base plus the
// same offset addresses the same object).
struct BufferLayout {
  std::vector<std::vector<std::uint64_t>> pool_offset;   // [layer][kind]: the slab of pool_pages_per_rank pages
  std::vector<std::vector<std::uint64_t>> dense_offset;  // [half][kind]
  std::vector<std::uint64_t> compact_offset;             // [kind]
  std::vector<std::uint64_t> page_bytes;                 // [kind]
  std::int64_t pool_pages_per_rank = 0;
  std::uint64_t pool_bytes = 0, dense_bytes = 0, compact_bytes = 0, staging_bytes = 0, scratch_bytes = 0;
  // Poisoned bytes past every dense buffer (each half and kind: the gap before the next offset,
  // at least this many) and past every allocation the plugin host hands a plugin, which it checks
  // after every layer (gpu/plugin_guards.cpp): one page of the largest kind, so a one-slot overrun
  // lands in the guard whole, and never less than kGuardBytesMin.
  std::uint64_t guard_bytes = 0;
};
inline constexpr std::uint64_t kGuardBytesMin = 4096;
BufferLayout buffer_layout(const model::Setting& setting, std::int32_t layers, const harness::SourceShape& shape);

// A range of a rank's pool reservation backed by one physical allocation.
struct ByteRun {
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
  bool operator==(const ByteRun& o) const { return offset == o.offset && bytes == o.bytes; }
};

// The local pages (g / cp) of rank `rank` among the logical pages the source references (sorted).
std::vector<std::int64_t> local_pages(const std::vector<std::int64_t>& pages_touched, std::int32_t cp, std::int32_t rank);

// The granularity-aligned runs of the pool reservation that hold every byte of every listed local
// page on every layer and kind, adjacent chunks merged into one run, sorted by offset. Every run
// ends within the reservation rounded up to the granularity (a power of two).
std::vector<ByteRun> backed_runs(const BufferLayout& layout, const std::vector<std::int64_t>& local, std::uint64_t granularity);
std::uint64_t total_bytes(const std::vector<ByteRun>& runs);
std::uint64_t round_up(std::uint64_t bytes, std::uint64_t granularity);

// Whether every byte of local page `page` of slab (layer, kind) lies in a run: the cheap check that
// the plan never reads a page with no memory behind it.
bool page_backed(const BufferLayout& layout, const std::vector<ByteRun>& runs, std::int32_t layer, std::size_t kind, std::int64_t page);

// The run as asked does not fit the GPUs (or they cannot hold a sparse pool): one line, said before
// anything is allocated. A kind of SharedMemoryFull so that every front end that maps that to exit
// status 2 (the machine cannot hold the run) does the same for this.
class DeviceRefusal : public harness::SharedMemoryFull {
 public:
  using harness::SharedMemoryFull::SharedMemoryFull;
};

// How the pool slabs are held: sparse (default: the whole slab reserved as address space, only the
// referenced pages' chunks backed, shared with peers as file descriptors) or dense (the whole slab
// allocated with cudaMalloc and shared through CUDA IPC, as before). The request's pool_memory
// (--pool-memory, CPKV_POOL_MEMORY: harness/request.cpp reads it) picks it.
enum class PoolMemory { sparse, dense };
// "sparse" or "dense" (null: sparse); anything else throws std::invalid_argument (the request check refuses it first).
PoolMemory pool_memory_from(const char* value);

// CUDA context, NCCL, per-batch plan uploads and the kernels' own buffers: an allowance per rank
// process, not measured (a context on an H200 takes about 0.5 GiB).
inline constexpr std::uint64_t kRankOverheadBytes = 1ULL << 30;

// The device memory one rank takes.
struct RankNeed {
  std::uint64_t pool_reserved = 0;  // address space (sparse) or memory (dense) of the pool slabs
  std::uint64_t pool_backed = 0;    // physical memory behind them
  std::uint64_t other = 0;          // staging, dense, compact, scratch, flags, verify results
  std::uint64_t bench = 0;          // the ceilings' buffers (bench --ceilings only)
  std::uint64_t overhead = kRankOverheadBytes;
  std::uint64_t total() const { return pool_backed + other + bench + overhead; }
};
struct NeedInputs {
  PoolMemory pool_memory = PoolMemory::sparse;
  std::uint64_t granularity = 2ULL << 20;
  bool measure_ceilings = false;
  std::uint64_t bench_buffer_bytes = 0;
};
// What a run's pools are, computed once and read by the need, the share and every rank's carve:
// sparse or dense, the layout, each rank's reservation and, sparse, its backed runs of the
// referenced pages.
struct PoolPlan {
  std::int32_t cp = 0;
  PoolMemory memory = PoolMemory::sparse;
  BufferLayout layout;
  std::uint64_t reserved = 0;              // each rank's pool slabs: the address space (sparse, rounded up to the granularity) or memory (dense)
  std::vector<std::vector<ByteRun>> runs;  // [rank]; empty for a dense pool
};

// One GPU: the ranks on it (rank r on GPU r % gpus), what they need together and what it has free.
struct GpuNeed {
  std::int32_t gpu = 0;
  std::vector<std::int32_t> ranks;
  RankNeed need;  // summed over its ranks (overhead included, per rank)
  std::uint64_t free = 0;
  bool fits() const { return need.total() <= free; }
};

// What a run asks of the GPUs, all from one pool plan and said before anything is allocated: the
// plan, each GPU's need beside what it has free (one GPU per entry of `free_bytes`), the line that
// says so ("gpu memory (sparse pool): GPU 0 (ranks 0 1) needs 9.3 GiB: pool 4.2 GiB backed of 100.2
// GiB reserved, ..., 139.2 GiB free"), and the refusal: empty when every GPU fits, else one line
// naming the first GPU that does not.
struct PoolVerdict {
  PoolPlan plan;
  std::vector<GpuNeed> needs;
  std::string need_line;
  std::string refusal;
};
PoolVerdict pool_verdict(const model::Setting& setting, std::int32_t layers, const harness::SourceShape& shape, const NeedInputs& in,
                         const std::vector<std::uint64_t>& free_bytes);

}  // namespace cpkv::cuda

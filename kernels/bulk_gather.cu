// The slot-dense gather through Hopper's bulk-copy engine (TMA: cp.async.bulk, through CCCL's
// cuda::ptx wrappers): one thread per block moves page chunks global -> shared -> global, two
// shared stages so a chunk's store overlaps the next chunk's load. Measured beside the SM copy
// kernels in the bench's gather sweep (cpkv bench --bulk, or CPKV_BENCH_BULK=1).
#include "launchers.cuh"

#include <algorithm>

#include <cuda/ptx>

namespace cpkv::kernels {

namespace {

namespace ptx = cuda::ptx;

__global__ void bulk_gather_kernel(std::uint8_t* dst, std::uint64_t page_bytes, const __grid_constant__ PointerTable table, const GatherEntry* entries,
                                   std::int64_t count, BulkStatus* status) {
  extern __shared__ __align__(128) std::uint8_t stage[];
  __shared__ std::uint64_t loaded[kBulkStages];
  if (threadIdx.x != 0) return;  // one thread drives the block's bulk copies
  for (int s = 0; s < kBulkStages; ++s) ptx::mbarrier_init(&loaded[s], 1);
  ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);  // the async proxy sees the initialized barriers
  const std::uint64_t chunks_per_page = (page_bytes + kBulkChunkBytes - 1) / kBulkChunkBytes;
  const std::int64_t chunks = count * static_cast<std::int64_t>(chunks_per_page);
  std::uint32_t parity[kBulkStages] = {0, 0};
  int iteration = 0;
  for (std::int64_t c = blockIdx.x; c < chunks; c += gridDim.x, ++iteration) {
    const GatherEntry e = entries[c / chunks_per_page];
    const std::uint64_t offset = (c % chunks_per_page) * kBulkChunkBytes;
    const auto bytes = static_cast<std::uint32_t>(min(kBulkChunkBytes, page_bytes - offset));
    std::uint8_t* out = dst + e.dst_page * page_bytes + offset;
    if (e.table_index < 0) {
      for (std::uint32_t i = 0; i < bytes / 16; ++i) reinterpret_cast<uint4*>(out)[i] = make_uint4(0, 0, 0, 0);
      continue;
    }
    CPKV_DEVICE_ASSERT(e.table_index < kTableEntriesMax && table.base[e.table_index] != nullptr);
    const std::uint8_t* in = table.base[e.table_index] + e.src_page * page_bytes + offset;
    const int s = iteration % kBulkStages;
    std::uint8_t* buffer = stage + s * kBulkChunkBytes;
    ptx::cp_async_bulk_wait_group_read(ptx::n32_t<kBulkStages - 1>{});  // the store that last read this stage is done reading
    ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, &loaded[s], bytes);
    ptx::cp_async_bulk(ptx::space_cluster, ptx::space_global, buffer, in, bytes, &loaded[s]);
    const long long start = clock64();
    while (!ptx::mbarrier_try_wait_parity(&loaded[s], parity[s])) {
      if (clock64() - start > kBarrierTimeoutCycles) {  // a load that never lands: report, do not hang
        atomicAdd(&status->timeouts, 1ULL);
        return;
      }
    }
    parity[s] ^= 1U;
    ptx::cp_async_bulk(ptx::space_global, ptx::space_shared, out, buffer, bytes);
    ptx::cp_async_bulk_commit_group();
  }
  ptx::cp_async_bulk_wait_group(ptx::n32_t<0>{});  // every store complete before the block exits
}

}  // namespace

cudaError_t launch_bulk_gather(std::uint8_t* dst, std::uint64_t page_bytes, PointerTable table, const GatherEntry* entries,
                               std::int64_t count, BulkStatus* status, cudaStream_t stream) {
  CPKV_ASSERT(page_bytes % 16 == 0);  // bulk copies move 16-byte multiples between 16-byte-aligned addresses
  if (count == 0) return cudaSuccess;
  const std::int64_t chunks = count * static_cast<std::int64_t>((page_bytes + kBulkChunkBytes - 1) / kBulkChunkBytes);
  const int blocks = static_cast<int>(std::min<std::int64_t>(chunks, kBulkBlocksMax));
  bulk_gather_kernel<<<blocks, kBulkThreads, kBulkStages * kBulkChunkBytes, stream>>>(dst, page_bytes, table, entries, count, status);
  return cudaGetLastError();
}

}  // namespace cpkv::kernels

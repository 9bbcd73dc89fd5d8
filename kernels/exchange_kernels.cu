// The exchange kernels: slot-dense gather, pool population, counting barrier, verification.
#include "launchers.cuh"
#include "flags.cuh"

#include <algorithm>

#include "cpkv/model/content.hpp"

namespace cpkv::kernels {

namespace {

// Thread p of the barrier block: signal peer p (write `phase` into word `rank` of its pad), then
// wait until peer p's signal in the own pad reaches `phase`. False (and `status` written) on timeout.
__device__ bool signal_and_wait(std::uint64_t* const* peer_pads, std::int32_t rank, int p, std::uint64_t phase, BarrierStatus* status) {
  store_release_sys(peer_pads[p] + rank, phase);
  return wait_flag(peer_pads, rank, p, phase, status);
}

int blocks_for(std::int64_t items, int threads, int cap) {
  return static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>((items + threads - 1) / threads, cap)));
}

}  // namespace

namespace {

__global__ void gather_kernel(std::uint8_t* __restrict__ dst, std::uint64_t page_bytes, const __grid_constant__ PointerTable table,
                              const GatherEntry* __restrict__ entries, std::int64_t count) {
  const bool vector_ok = page_bytes % 16 == 0;
  for (std::int64_t e = blockIdx.x; e < count; e += gridDim.x) {
    const GatherEntry entry = entries[e];
    std::uint8_t* out = dst + entry.dst_page * page_bytes;
    if (entry.table_index < 0) {
      if (vector_ok) {
        for (std::uint64_t i = threadIdx.x; i < page_bytes / 16; i += blockDim.x) reinterpret_cast<uint4*>(out)[i] = make_uint4(0, 0, 0, 0);
      } else {
        for (std::uint64_t i = threadIdx.x; i < page_bytes; i += blockDim.x) out[i] = 0;
      }
      continue;
    }
    // The host checked the same before upload (gpu/device_plan.cpp): a bad entry is a plan bug.
    CPKV_DEVICE_ASSERT(entry.table_index < kTableEntriesMax && table.base[entry.table_index] != nullptr && entry.src_page >= 0);
    const std::uint8_t* in = table.base[entry.table_index] + entry.src_page * page_bytes;
    if (vector_ok) {
      // Four independent 16-byte loads in flight per thread before any store: remote (NVLink) loads
      // have long latency, and one load at a time leaves the link idle.
      const uint4* src = reinterpret_cast<const uint4*>(in);
      uint4* d = reinterpret_cast<uint4*>(out);
      const std::uint64_t n = page_bytes / 16;
      const std::uint64_t stride = blockDim.x;
      std::uint64_t i = threadIdx.x;
      for (; i + 3 * stride < n; i += 4 * stride) {
        const uint4 a = src[i];
        const uint4 b = src[i + stride];
        const uint4 c = src[i + 2 * stride];
        const uint4 e4 = src[i + 3 * stride];
        d[i] = a;
        d[i + stride] = b;
        d[i + 2 * stride] = c;
        d[i + 3 * stride] = e4;
      }
      for (; i < n; i += stride) d[i] = src[i];
    } else {
      for (std::uint64_t i = threadIdx.x; i < page_bytes; i += blockDim.x) out[i] = in[i];
    }
  }
}

}  // namespace

cudaError_t launch_gather(std::uint8_t* dst, std::uint64_t page_bytes, PointerTable table, const GatherEntry* entries, std::int64_t count,
                          cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const int blocks = static_cast<int>(std::min<std::int64_t>(count, kGatherBlocksMax));
  gather_kernel<<<blocks, kGatherThreads, 0, stream>>>(dst, page_bytes, table, entries, count);
  return cudaGetLastError();
}

namespace {

__global__ void populate_pool_kernel(std::uint8_t* pool, std::uint32_t row_bytes, std::int32_t page_size, const std::int64_t* logical,
                                     const std::int64_t* local, std::int64_t count, std::uint64_t seed, std::uint32_t layer, std::uint32_t kind) {
  const std::uint32_t words = (row_bytes + 7) / 8;
  const std::int64_t per_page = static_cast<std::int64_t>(page_size) * words;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < count * per_page; i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t p = i / per_page;
    const auto row = static_cast<std::uint32_t>((i % per_page) / words);
    const auto w = static_cast<std::uint32_t>(i % words);
    const std::uint64_t key = model::prefix_row_key(seed, layer, kind, static_cast<std::uint64_t>(logical[p]), row);
    const std::uint64_t word = model::content_word(key, w);
    std::uint8_t* out = pool + (local[p] * page_size + row) * static_cast<std::uint64_t>(row_bytes);
    for (std::uint32_t b = 0; b < 8 && 8 * w + b < row_bytes; ++b) out[8 * w + b] = static_cast<std::uint8_t>(word >> (8 * b));
  }
}

}  // namespace

cudaError_t launch_populate_pool(std::uint8_t* pool, std::uint32_t row_bytes, std::int32_t page_size, const std::int64_t* logical,
                                 const std::int64_t* local, std::int64_t count, std::uint64_t seed, std::uint32_t layer, std::uint32_t kind,
                                 cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const std::int64_t items = count * page_size * ((row_bytes + 7) / 8);
  populate_pool_kernel<<<blocks_for(items, kElementwiseThreads, kPopulateBlocksMax), kElementwiseThreads, 0, stream>>>(pool, row_bytes, page_size, logical, local, count, seed, layer, kind);
  return cudaGetLastError();
}

namespace {

// One block; thread p < cp talks to peer p.
__global__ void barrier_kernel(std::uint64_t* const* peer_pads, std::int32_t rank, std::int32_t cp, std::uint64_t phase, BarrierStatus* status) {
  const int p = threadIdx.x;
  if (p < cp) {
    __threadfence_system();  // this rank's earlier writes (fill) are visible before the flag
    signal_and_wait(peer_pads, rank, p, phase, status);
  }
  __syncthreads();
}

}  // namespace

cudaError_t launch_barrier(std::uint64_t* const* peer_pads, std::int32_t rank, std::int32_t cp, std::uint64_t phase, BarrierStatus* status,
                           cudaStream_t stream) {
  barrier_kernel<<<kOneBlock, kBarrierThreads, 0, stream>>>(peer_pads, rank, cp, phase, status);
  return cudaGetLastError();
}

namespace {

// `count` barriers back to back in one launch (the launch-free latency); stops at a timeout.
__global__ void barrier_loop_kernel(std::uint64_t* const* peer_pads, std::int32_t rank, std::int32_t cp, std::uint64_t first_phase,
                                    std::int32_t count, BarrierStatus* status) {
  __shared__ int timed_out;
  if (threadIdx.x == 0) timed_out = 0;
  __syncthreads();
  const int p = threadIdx.x;
  for (std::int32_t i = 0; i < count; ++i) {
    if (p < cp && !signal_and_wait(peer_pads, rank, p, first_phase + i, status)) atomicExch(&timed_out, 1);
    __syncthreads();
    const bool stop = timed_out != 0;
    __syncthreads();  // everyone has read it before anyone can write it again
    if (stop) return;
  }
}

}  // namespace

cudaError_t launch_barrier_loop(std::uint64_t* const* peer_pads, std::int32_t rank, std::int32_t cp, std::uint64_t first_phase,
                                std::int32_t count, BarrierStatus* status, cudaStream_t stream) {
  barrier_loop_kernel<<<kOneBlock, kBarrierThreads, 0, stream>>>(peer_pads, rank, cp, first_phase, count, status);
  return cudaGetLastError();
}

namespace {

__global__ void verify_kernel(const std::uint8_t* dense, std::uint32_t row_bytes, std::int32_t page_size, const SlotSource* slots,
                              std::int64_t slot_count, std::uint64_t seed, std::uint32_t layer, std::uint32_t kind, VerifyResult* result) {
  const std::uint32_t words = (row_bytes + 7) / 8;
  const std::int64_t rows = slot_count * page_size;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < rows * words; i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t row_global = i / words;
    const auto w = static_cast<std::uint32_t>(i % words);
    const std::int64_t slot = row_global / page_size;
    const auto row = static_cast<std::int32_t>(row_global % page_size);
    const SlotSource source = slots[slot];
    std::uint64_t expected_word = 0;
    if (row < source.rows_valid) {
      const std::uint64_t key = source.logical_page >= 0
                                    ? model::prefix_row_key(seed, layer, kind, static_cast<std::uint64_t>(source.logical_page), static_cast<std::uint32_t>(row))
                                    : model::current_row_key(seed, layer, kind, static_cast<std::uint32_t>(source.request),
                                                             static_cast<std::uint64_t>(source.first_token + row));
      expected_word = model::content_word(key, w);
    }
    const std::uint8_t* actual = dense + row_global * row_bytes;
    for (std::uint32_t b = 0; b < 8 && 8 * w + b < row_bytes; ++b) {
      const auto expected = static_cast<std::uint8_t>(expected_word >> (8 * b));
      const std::uint8_t got = actual[8 * w + b];
      if (got == expected) continue;
      atomicAdd(&result->wrong_bytes, 1ULL);
      const unsigned long long index = static_cast<unsigned long long>(row_global) * row_bytes + 8 * w + b;
      atomicMin(&result->first_wrong, (index << 16) | (static_cast<unsigned long long>(expected) << 8) | got);
    }
  }
}

}  // namespace

cudaError_t launch_verify(const std::uint8_t* dense, std::uint32_t row_bytes, std::int32_t page_size, const SlotSource* slots,
                          std::int64_t slot_count, std::uint64_t seed, std::uint32_t layer, std::uint32_t kind, VerifyResult* result,
                          cudaStream_t stream) {
  if (slot_count == 0) return cudaSuccess;
  const std::int64_t items = slot_count * page_size * ((row_bytes + 7) / 8);
  verify_kernel<<<blocks_for(items, kElementwiseThreads, kVerifyBlocksMax), kElementwiseThreads, 0, stream>>>(dense, row_bytes, page_size, slots, slot_count, seed, layer, kind, result);
  return cudaGetLastError();
}

namespace {

__global__ void sum_bytes_kernel(std::uint8_t* dst, const __grid_constant__ PointerTable table, std::int32_t cp, std::uint64_t bytes) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < bytes; i += std::uint64_t{gridDim.x} * blockDim.x) {
    std::uint32_t sum = 0;
    for (std::int32_t p = 0; p < cp; ++p) sum += table.base[p][i];
    dst[i] = static_cast<std::uint8_t>(sum);
  }
}

}  // namespace

cudaError_t launch_sum_bytes(std::uint8_t* dst, PointerTable table, std::int32_t cp, std::uint64_t bytes, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  sum_bytes_kernel<<<blocks_for(static_cast<std::int64_t>(bytes), kElementwiseThreads, kSumBlocksMax), kElementwiseThreads, 0, stream>>>(dst, table, cp, bytes);
  return cudaGetLastError();
}

namespace {

__global__ void spin_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

}  // namespace

namespace {

// Every thread stores four 16-byte zero words per pass, a grid's threads apart, so each warp's
// stores are contiguous and enough are in flight to keep the memory busy (stores wait on nothing).
__global__ void __launch_bounds__(kElementwiseThreads) zero_ranges_kernel(const __grid_constant__ ZeroRanges ranges) {
  const std::uint64_t stride = std::uint64_t{gridDim.x} * blockDim.x;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (std::int32_t i = 0; i < ranges.count; ++i) {
    uint4* words = static_cast<uint4*>(ranges.base[i]);
    const std::uint64_t n = ranges.bytes[i] / 16;
    std::uint64_t x = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
    for (; x + 3 * stride < n; x += 4 * stride) {
      words[x] = zero;
      words[x + stride] = zero;
      words[x + 2 * stride] = zero;
      words[x + 3 * stride] = zero;
    }
    for (; x < n; x += stride) words[x] = zero;
  }
}

}  // namespace

bool zero_ranges_fit(const ZeroRanges& ranges) {
  if (ranges.count < 0 || ranges.count > kKindsMax) return false;
  for (std::int32_t i = 0; i < ranges.count; ++i) {
    if (reinterpret_cast<std::uintptr_t>(ranges.base[i]) % 16 != 0 || ranges.bytes[i] % 16 != 0) return false;
  }
  return true;
}

cudaError_t launch_zero_ranges(const ZeroRanges& ranges, cudaStream_t stream) {
  CPKV_ASSERT(zero_ranges_fit(ranges));
  std::uint64_t words = 0;
  for (std::int32_t i = 0; i < ranges.count; ++i) words = std::max<std::uint64_t>(words, ranges.bytes[i] / 16);
  if (words == 0) return cudaSuccess;
  // A quarter of the words per thread-pass (four stores each), at most kGatherBlocksMax blocks
  // (eight per SM of an H100 or H200): enough to cover the machine, few enough to start at once.
  const int blocks = blocks_for(static_cast<std::int64_t>((words + 3) / 4), kElementwiseThreads, kGatherBlocksMax);
  zero_ranges_kernel<<<blocks, kElementwiseThreads, 0, stream>>>(ranges);
  return cudaGetLastError();
}

cudaError_t launch_spin(long long cycles, cudaStream_t stream) {
  spin_kernel<<<kOneBlock, kOneThread, 0, stream>>>(cycles);
  return cudaGetLastError();
}

namespace {

__global__ void stamp_kernel(std::uint64_t* word, std::uint64_t value) { store_release_sys(word, value); }

}  // namespace

cudaError_t launch_stamp(std::uint64_t* word, std::uint64_t value, cudaStream_t stream) {
  stamp_kernel<<<kOneBlock, kOneThread, 0, stream>>>(word, value);
  return cudaGetLastError();
}

namespace {

__global__ void check_stamps_kernel(const std::uint64_t* const* words, std::int32_t cp, std::uint64_t expected, unsigned long long* errors) {
  const int p = threadIdx.x;
  if (p < cp && load_acquire_sys(words[p]) != expected) atomicAdd(errors, 1ULL);
}

}  // namespace

cudaError_t launch_check_stamps(const std::uint64_t* const* words, std::int32_t cp, std::uint64_t expected, unsigned long long* errors,
                                cudaStream_t stream) {
  check_stamps_kernel<<<kOneBlock, kBarrierThreads, 0, stream>>>(words, cp, expected, errors);
  return cudaGetLastError();
}

}  // namespace cpkv::kernels

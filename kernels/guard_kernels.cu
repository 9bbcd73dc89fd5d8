// The plugin host's checks of writes outside a plugin's buffers: poisoned guard regions (written
// and compared with the pattern of guard_byte, no copy of them kept) and a hash per pool page
// (compared with the hash taken after the prefill, no copy of the slab kept).
#include "launchers.cuh"
#include "flags.cuh"

#include <algorithm>

namespace cpkv::kernels {

namespace {

// splitmix64's finalizer: a bijection of 64-bit words, so a page whose one word changed always
// hashes differently (two changed words cancel with probability about 2^-64).
__device__ __forceinline__ std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Word w of a page (bytes 8w .. 8w+7, little-endian, zero past the page's end).
__device__ __forceinline__ std::uint64_t page_word(const std::uint8_t* page, std::uint64_t bytes, std::uint64_t w, bool aligned) {
  if (aligned) return reinterpret_cast<const std::uint64_t*>(page)[w];
  std::uint64_t word = 0;
  for (std::uint64_t b = 0; b < 8 && 8 * w + b < bytes; ++b) word |= static_cast<std::uint64_t>(page[8 * w + b]) << (8 * b);
  return word;
}

__global__ void guard_poison_kernel(const GuardRegion* regions, std::int32_t count) {
  for (std::int32_t g = blockIdx.x; g < count; g += gridDim.x) {
    const GuardRegion region = regions[g];
    for (std::uint64_t i = threadIdx.x; i < region.bytes; i += blockDim.x) region.base[i] = guard_byte(i);
  }
}

// Thread 0 of block 0 stamps the milestone first: this kernel started, so everything before it on
// the stream ended without a fault (the host names a fault by the last milestone it finds).
__global__ void guard_check_kernel(const GuardRegion* regions, std::int32_t count, GuardResult* result, std::uint64_t* milestone,
                                   std::uint64_t milestone_value) {
  if (milestone != nullptr && blockIdx.x == 0 && threadIdx.x == 0) store_release_sys(milestone, milestone_value);
  for (std::int32_t g = blockIdx.x; g < count; g += gridDim.x) {
    const GuardRegion region = regions[g];
    for (std::uint64_t i = threadIdx.x; i < region.bytes; i += blockDim.x) {
      const std::uint8_t got = region.base[i];
      if (got == guard_byte(i)) continue;
      atomicAdd(&result->wrong_bytes, 1ULL);
      atomicMin(&result->first_wrong, (static_cast<unsigned long long>(g) << 40) | (static_cast<unsigned long long>(i) << 8) | got);
    }
  }
}

// One block per page (grid-stride): the sum over its words of mix64(word + its index's key), then
// either the reference written (compare 0) or compared with it, the reference then updated so a
// write is reported once.
__global__ void hash_pages_kernel(const std::uint8_t* base, const HashedPage* pages, std::int64_t count, std::uint64_t* reference,
                                  std::int32_t compare, HashCompare* result) {
  __shared__ std::uint64_t partial[kHashThreads / kWarpThreads];
  for (std::int64_t p = blockIdx.x; p < count; p += gridDim.x) {
    const HashedPage page = pages[p];
    const std::uint8_t* bytes = base + page.offset;
    const bool aligned = page.offset % 8 == 0 && page.bytes % 8 == 0;
    const std::uint64_t words = (page.bytes + 7) / 8;
    std::uint64_t sum = 0;
    for (std::uint64_t w = threadIdx.x; w < words; w += blockDim.x) sum += mix64(page_word(bytes, page.bytes, w, aligned) + (w + 1) * 0x9E3779B97F4A7C15ULL);
    for (int shift = kWarpThreads / 2; shift > 0; shift /= 2) sum += __shfl_down_sync(0xffffffffu, sum, shift);
    if (threadIdx.x % kWarpThreads == 0) partial[threadIdx.x / kWarpThreads] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
      std::uint64_t hash = 0;
      for (int i = 0; i < kHashThreads / kWarpThreads; ++i) hash += partial[i];
      if (compare != 0 && hash != reference[p]) {
        atomicAdd(&result->changed, 1ULL);
        atomicMin(&result->first_changed, static_cast<unsigned long long>(p));
      }
      reference[p] = hash;
    }
    __syncthreads();  // partial is written again for the next page only once thread 0 has read it
  }
}

}  // namespace

cudaError_t launch_guard_poison(const GuardRegion* regions, std::int32_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  guard_poison_kernel<<<count, kElementwiseThreads, 0, stream>>>(regions, count);
  return cudaGetLastError();
}

cudaError_t launch_guard_check(const GuardRegion* regions, std::int32_t count, GuardResult* result, std::uint64_t* milestone, std::uint64_t milestone_value,
                               cudaStream_t stream) {
  guard_check_kernel<<<std::max(count, 1), kElementwiseThreads, 0, stream>>>(regions, count, result, milestone, milestone_value);
  return cudaGetLastError();
}

cudaError_t launch_hash_pages(const std::uint8_t* base, const HashedPage* pages, std::int64_t count, std::uint64_t* reference, bool compare,
                              HashCompare* result, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const int blocks = static_cast<int>(std::min<std::int64_t>(count, kHashBlocksMax));
  hash_pages_kernel<<<blocks, kHashThreads, 0, stream>>>(base, pages, count, reference, compare ? 1 : 0, result);
  return cudaGetLastError();
}

}  // namespace cpkv::kernels

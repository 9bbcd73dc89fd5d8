// The counting barrier's flag accesses, shared by every kernel that signals or polls a pad:
// system-scope release stores and acquire loads (PTX), so a peer GPU that sees the flag sees the
// writes before it.
#pragma once

#include <cstdint>

namespace cpkv::kernels {

__device__ __forceinline__ void store_release_sys(std::uint64_t* address, std::uint64_t value) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(address), "l"(value) : "memory");
}
__device__ __forceinline__ std::uint64_t load_acquire_sys(const std::uint64_t* address) {
  std::uint64_t value;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(value) : "l"(address) : "memory");
  return value;
}

// Backoff between polls of a flag that many warps of one launch may be waiting on at once (the
// compose launch: every warp whose next page is a peer's current page): a few tight polls, then
// sleeps doubling up to kPollSleepMaxNs, so thousands of spinning warps do not crowd the memory
// system that the copies they wait for (the peer's publish, this GPU's pulls) go through. Every
// flag wait uses it (also the barrier kernels, so the barrier ceilings measure the same wait); it
// adds up to about 2 x kPollSleepMaxNs to a wait (__nanosleep(t) sleeps between 0 and about 2t).
inline constexpr unsigned kPollSleepMaxNs = 256;
struct PollBackoff {
  unsigned polls = 0;
  unsigned sleep_ns = 16;
  __device__ __forceinline__ void pause() {
    if (++polls <= 8) return;
    __nanosleep(sleep_ns);
    if (sleep_ns < kPollSleepMaxNs) sleep_ns *= 2;
  }
};

}  // namespace cpkv::kernels

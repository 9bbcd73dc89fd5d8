// The counting barrier's flag accesses, shared by every kernel that signals or polls a pad:
// system-scope release stores and acquire loads (PTX), so a peer GPU that sees the flag sees the
// writes before it.
#pragma once

#include <cstdint>

#include "launchers.cuh"  // BarrierStatus, kBarrierTimeoutCycles

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

// Polls word `peer` of this rank's pad until it reaches `phase`, backing off; on timeout writes who
// waited for whom into `status` and gives up (false): the host reports it as invariant 8, and the
// bytes read after it are wrong, which the verify kernel says too. Every barrier's wait is this one.
__device__ inline bool wait_flag(std::uint64_t* const* pads, std::int32_t rank, std::int32_t peer, std::uint64_t phase, BarrierStatus* status) {
  const std::uint64_t* word = pads[rank] + peer;
  const long long start = clock64();
  PollBackoff backoff;
  while (load_acquire_sys(word) < phase) {
    backoff.pause();
    if (clock64() - start > kBarrierTimeoutCycles) {
      status->timed_out_phase = phase;
      status->rank = rank;
      status->missing_peer = peer;
      return false;
    }
  }
  return true;
}

}  // namespace cpkv::kernels

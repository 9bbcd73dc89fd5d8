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

}  // namespace cpkv::kernels

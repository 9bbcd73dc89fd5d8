// Checks at the host/device boundary, DeepEP-style: every failure names file, line and condition.
// Host: CUDA and NCCL calls and plan assertions print one line to stderr and abort the rank process
// (the launcher reports which rank died); a GPU rank's failed CUDA call is instead one located line
// through the hook below (where the device faulted, gpu/bootstrap.hpp). Device: an assertion prints
// the same line and traps, so the launch fails with an error the host's next check names.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>

#include <cuda_runtime.h>

#include "cpkv/model/assert.hpp"

namespace cpkv::kernels {

// A process that can say where a failed CUDA call happened (a GPU rank: its rank, batch, layer and
// what the device was running, gpu/bootstrap.hpp: name_device_faults) installs a hook that throws
// one located line instead of the abort; it sets cuda_fault_named first. While an exception
// unwinds (a destructor's cudaFree after a device fault: the context is lost, every call fails),
// a failure is printed unless a fault was named already, and the unwinding goes on.
using CudaFailureHook = void (*)(const char* file, int line, const char* call, cudaError_t error);
inline CudaFailureHook cuda_failure_hook = nullptr;
inline bool cuda_fault_named = false;

inline void cuda_check_failed(const char* file, int line, const char* call, cudaError_t error) {
  if (std::uncaught_exceptions() > 0) {
    if (!cuda_fault_named) std::fprintf(stderr, "cpkv: %s:%d: %s failed: %s\n", file, line, call, cudaGetErrorString(error));
    return;
  }
  if (cuda_failure_hook != nullptr) cuda_failure_hook(file, line, call, error);
  std::fprintf(stderr, "cpkv: %s:%d: %s failed: %s\n", file, line, call, cudaGetErrorString(error));
  std::abort();
}

}  // namespace cpkv::kernels

// Every CUDA call is checked: file, line, the call and the error, then abort (a rank process), or
// the located line of the process's hook.
#define CPKV_CUDA_CHECK(call)                                                          \
  do {                                                                                 \
    const cudaError_t cpkv_err_ = (call);                                              \
    if (cpkv_err_ != cudaSuccess) ::cpkv::kernels::cuda_check_failed(__FILE__, __LINE__, #call, cpkv_err_); \
  } while (0)

// Every NCCL call likewise (the caller includes nccl.h).
#define CPKV_NCCL_CHECK(call)                                                                                          \
  do {                                                                                                                 \
    const ncclResult_t cpkv_nccl_ = (call);                                                                            \
    if (cpkv_nccl_ != ncclSuccess) {                                                                                   \
      std::fprintf(stderr, "cpkv: %s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, ncclGetErrorString(cpkv_nccl_)); \
      std::abort();                                                                                                    \
    }                                                                                                                  \
  } while (0)

// Host assertions on plan data before it is uploaded are the one host macro, CPKV_ASSERT
// (model/assert.hpp: file, line, condition; always on: it guards device memory).

// The device twin, where the kernel reads the same data: printf, then trap (the launch fails).
#define CPKV_DEVICE_ASSERT(condition)                                                                                  \
  do {                                                                                                                 \
    if (!(condition)) {                                                                                                \
      printf("cpkv: %s:%d: device assertion failed: %s (block %d thread %d)\n", __FILE__, __LINE__, #condition,       \
             static_cast<int>(blockIdx.x), static_cast<int>(threadIdx.x));                                             \
      __trap();                                                                                                        \
    }                                                                                                                  \
  } while (0)

// Checks at the host/device boundary, DeepEP-style: every failure names file, line and condition.
// Host: CUDA and NCCL calls and plan assertions print one line to stderr and abort the rank process
// (the launcher reports which rank died). Device: an assertion prints the same line and traps, so
// the launch fails with an error the host's next check names.
#pragma once

#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#include "cpkv/model/assert.hpp"

// Every CUDA call is checked: file, line, the call and the error, then abort (a rank process).
#define CPKV_CUDA_CHECK(call)                                                                             \
  do {                                                                                                    \
    const cudaError_t cpkv_err_ = (call);                                                                 \
    if (cpkv_err_ != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "cpkv: %s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(cpkv_err_)); \
      std::abort();                                                                                       \
    }                                                                                                     \
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

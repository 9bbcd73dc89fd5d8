// The one way a gpu-labelled test says it cannot run here: without a visible CUDA device it skips
// with the reason (ctest reports it as skipped, not passed: SKIP_REGULAR_EXPRESSION "SKIPPED").
#pragma once

#include <gtest/gtest.h>

#include "cuda_backend.hpp"

#define CPKV_REQUIRE_GPU()                                                                           \
  do {                                                                                               \
    if (cpkv::cuda::gpu_count() == 0) GTEST_SKIP() << "no CUDA device visible: GPU test not run here"; \
  } while (0)

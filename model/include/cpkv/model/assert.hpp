// Host assertions, on in every build (Release included): a broken invariant or argument stops the
// process at once with the file, the line and the condition, instead of running on into a wrong
// answer. One condition per assertion, so the message names the one that failed. In model/, the
// lowest layer, and free of every other cpkv header, so every host library can include it; device
// code has its own pair in kernels/checks.cuh.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace cpkv::detail {
[[noreturn]] inline void assertion_failed(const char* file, int line, const char* condition) {
  std::fprintf(stderr, "%s:%d: assertion failed: %s\n", file, line, condition);
  std::fflush(stderr);
  std::abort();
}
}  // namespace cpkv::detail

#define CPKV_ASSERT(condition) \
  ((condition) ? static_cast<void>(0) : ::cpkv::detail::assertion_failed(__FILE__, __LINE__, #condition))

// Content fill: current rows computed on the device from the model's hash, so no host copy is timed.
#include "launchers.cuh"

#include <algorithm>

#include "cpkv/model/content.hpp"

namespace cpkv::kernels {

namespace {
// One thread per 8-byte word of a row; rows are laid out back to back in the grid.
__global__ void fill_current_kernel(std::uint8_t* dest, std::uint32_t row_bytes, const std::int32_t* request,
                                    const std::int64_t* token, const std::int64_t* dest_row, std::int64_t rows,
                                    std::uint64_t seed, std::uint32_t layer, std::uint32_t kind) {
  const std::uint32_t words_per_row = (row_bytes + 7) / 8;
  const std::int64_t total = rows * words_per_row;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < total;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t t = i / words_per_row;
    const auto w = static_cast<std::uint32_t>(i % words_per_row);
    const std::uint64_t key = model::current_row_key(seed, layer, kind, static_cast<std::uint32_t>(request[t]),
                                                     static_cast<std::uint64_t>(token[t]));
    std::uint8_t* row = dest + dest_row[t] * row_bytes;
    const std::uint64_t word = model::content_word(key, w);
    for (std::uint32_t b = 0; b < 8 && 8 * w + b < row_bytes; ++b) row[8 * w + b] = static_cast<std::uint8_t>(word >> (8 * b));
  }
}
}  // namespace

cudaError_t launch_fill_current(std::uint8_t* dest, std::uint32_t row_bytes, const std::int32_t* request,
                                const std::int64_t* token, const std::int64_t* dest_row, std::int64_t rows,
                                std::uint64_t seed, std::uint32_t layer, std::uint32_t kind, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  constexpr int threads = 256;
  const std::int64_t words = rows * ((row_bytes + 7) / 8);
  const int blocks = static_cast<int>(std::min<std::int64_t>((words + threads - 1) / threads, 4096));
  fill_current_kernel<<<blocks, threads, 0, stream>>>(dest, row_bytes, request, token, dest_row, rows, seed, layer, kind);
  return cudaGetLastError();
}

}  // namespace cpkv::kernels

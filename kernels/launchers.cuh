// Every host launcher of the cpkv kernels. Each launcher checks its CUDA calls and returns the
// cudaError_t of the launch; callers check it with CPKV_CUDA_CHECK.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace cpkv::kernels {

// Writes the content rows (model/content.hpp) of `rows` current tokens to `dest`: token t of the
// list has key current_row_key(seed, layer, kind, request[t], token[t]) and lands at row
// dest_row[t] (a page inverse: dense rows or staging rows, the same kernel either way).
cudaError_t launch_fill_current(std::uint8_t* dest, std::uint32_t row_bytes, const std::int32_t* request,
                                const std::int64_t* token, const std::int64_t* dest_row, std::int64_t rows,
                                std::uint64_t seed, std::uint32_t layer, std::uint32_t kind, cudaStream_t stream);

}  // namespace cpkv::kernels

// Every limit of the testbed in one place, with the reason beside it.
#pragma once

#include <cstdint>

namespace cpkv::model::limits {

// One node of H200s holds at most 8 GPUs; the simulator and properties use the same bound.
inline constexpr std::int32_t cp_max = 8;
// Page sizes the tests use (PROTOCOL.md section 1): 1..256, powers of two.
inline constexpr std::int32_t page_size_max = 256;
// GLM-5-class models have 78 layers; leave room for deeper ones without admitting garbage.
inline constexpr std::int32_t layer_count_max = 256;
// Requests per batch: far above any admission cap in use (seeds: 12), low enough that a corrupt
// trace cannot ask for gigabytes of plan.
inline constexpr std::int64_t batch_requests_max = 65536;
// Tokens per request (prefix + extend): 16M tokens, beyond any context length served today.
inline constexpr std::int64_t request_tokens_max = std::int64_t{1} << 24;
// Logical pages in the pool: 2^31 keeps page ids inside int32 descriptors (the GPU plan format).
inline constexpr std::int64_t pool_pages_max = (std::int64_t{1} << 31) - 1;
// Staging override: 1 TiB, far above any GPU's memory, so a typo is caught rather than honoured.
inline constexpr std::int64_t staging_mib_max = std::int64_t{1} << 20;
// Attention-plan segments one rank may hold per batch on the GPU backend: the bootstrap region's
// fixed per-rank array that rank 0 reads to check coverage across ranks (gpu/bootstrap.hpp,
// invariant 9). A page split has about two per request; a continuous token split one per token
// (seeds_batch at cp 2: 22,297). 8 ranks x 65,536 x 12 bytes = 6 MiB of the region. A source whose
// plan needs more is refused before any rank starts (harness/attention_limit.hpp).
inline constexpr std::int64_t attention_segments_max = 65536;

}  // namespace cpkv::model::limits

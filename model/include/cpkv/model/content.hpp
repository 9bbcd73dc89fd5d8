// Deterministic test content (PROTOCOL.md section 8): cheap to recompute anywhere, host or device.
//
// Prefix rows are keyed on their pool location (layer, kind, logical page, row in page): two requests
// that share a cached prefix page (a prefix-cache hit) must read the same bytes, as they would in a
// real pool. Current rows are keyed on (layer, kind, request, token). A domain tag keeps the two
// key spaces apart. Byte b of a row is byte b % 8 of mix(key, b / 8).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define CPKV_HD __host__ __device__ __forceinline__
#else
#define CPKV_HD inline
#endif

namespace cpkv::model {

// splitmix64's finalizer: a full-avalanche 64-bit mix, cheap on both sides.
CPKV_HD std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

inline constexpr std::uint64_t kPrefixDomain = 0x70726566ULL;   // "pref"
inline constexpr std::uint64_t kCurrentDomain = 0x63757272ULL;  // "curr"

CPKV_HD std::uint64_t row_key(std::uint64_t seed, std::uint64_t domain, std::uint32_t layer,
                              std::uint32_t kind, std::uint64_t a, std::uint64_t b) {
  std::uint64_t h = mix64(seed ^ domain);
  h = mix64(h ^ layer);
  h = mix64(h ^ kind);
  h = mix64(h ^ a);
  return mix64(h ^ b);
}

// Key of a prefix row: pool page `logical_page`, row `row_in_page`.
CPKV_HD std::uint64_t prefix_row_key(std::uint64_t seed, std::uint32_t layer, std::uint32_t kind,
                                     std::uint64_t logical_page, std::uint32_t row_in_page) {
  return row_key(seed, kPrefixDomain, layer, kind, logical_page, row_in_page);
}

// Key of a current row: request `request`, sequence position `token`.
CPKV_HD std::uint64_t current_row_key(std::uint64_t seed, std::uint32_t layer, std::uint32_t kind,
                                      std::uint32_t request, std::uint64_t token) {
  return row_key(seed, kCurrentDomain, layer, kind, request, token);
}

// Byte `byte_index` of the row with key `key`.
CPKV_HD std::uint8_t content_byte(std::uint64_t key, std::uint32_t byte_index) {
  const std::uint64_t word = mix64(key ^ (0x100000000ULL + (byte_index >> 3)));
  return static_cast<std::uint8_t>(word >> (8 * (byte_index & 7)));
}

// The 8 bytes starting at byte 8*word_index, as one little-endian word (fast path for fills).
CPKV_HD std::uint64_t content_word(std::uint64_t key, std::uint32_t word_index) {
  return mix64(key ^ (0x100000000ULL + word_index));
}

}  // namespace cpkv::model

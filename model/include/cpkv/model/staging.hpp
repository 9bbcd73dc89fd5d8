// Staging capacity, the overflow verdict, and the deterministic arena carve (PROTOCOL.md section 4).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cpkv/model/batch.hpp"
#include "cpkv/model/setting.hpp"

namespace cpkv::model {

enum class StagingSource : std::uint8_t { caps, pool_fallback, mib_override };

struct StagingCapacity {
  std::int64_t staging_slots = 0;  // page slots per parity half per buffer kind
  StagingSource source = StagingSource::caps;
  std::uint64_t bytes_total = 0;   // 2 * staging_slots * P * sum(row_bytes)
};

// Registration-time capacity. An explicit MiB override wins; else the caps
// (ceil(max_total_extend_tokens / P) + max_batch_requests, both caps needed); else the pool size
// (every current page is also a pool page, so the pool bounds it).
StagingCapacity staging_capacity(const Setting& setting);

std::string_view to_string(StagingSource source);

// The overflow verdict. It takes only batch-logical values, so every rank reaches the same one.
struct Verdict {
  bool overflow = false;
  std::int64_t current_pages_total = 0;
  std::int64_t staging_slots = 0;
  std::string describe() const;  // "ok" or "overflow: 812 current pages > 700 staging slots"
};
Verdict overflow_verdict(std::int64_t current_pages_total, std::int64_t staging_slots);

// Byte offsets of everything one rank registers for IPC, identical on every rank, so
// peer_base + offset addresses the same object on any peer with no handshake.
struct ArenaCarve {
  static constexpr std::uint64_t alignment_bytes = 256;  // GPU allocation granularity for 16-B loads
  std::int64_t staging_slots = 0;
  std::int32_t page_size = 1;
  std::vector<std::uint32_t> row_bytes;          // per buffer kind
  std::vector<std::uint64_t> kind_offset_bytes;  // within one parity half
  std::uint64_t half_bytes = 0;
  std::uint64_t staging_bytes = 0;               // two halves
  std::uint64_t flags_offset_bytes = 0;          // barrier flags after the staging halves
  std::uint64_t flags_bytes = 0;
  std::uint64_t total_bytes = 0;

  std::uint64_t page_bytes(std::size_t kind) const { return std::uint64_t{row_bytes[kind]} * page_size; }
  // Offset of staging slot `slot` of `kind` in parity half `half`.
  std::uint64_t slot_offset(std::int32_t half, std::size_t kind, std::int64_t slot) const {
    return half * half_bytes + kind_offset_bytes[kind] + static_cast<std::uint64_t>(slot) * page_bytes(kind);
  }
};

// flag_words: 64-bit barrier words the backend needs (its choice of barrier scheme).
ArenaCarve carve_arena(const Setting& setting, std::int64_t staging_slots, std::uint64_t flag_words);

// The parity half layer `layer` uses.
inline std::int32_t parity_half(std::int32_t layer) { return layer % 2; }

}  // namespace cpkv::model

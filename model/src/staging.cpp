#include "cpkv/model/staging.hpp"

#include <fmt/format.h>

namespace cpkv::model {

namespace {
std::uint64_t align_up(std::uint64_t value, std::uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}
}  // namespace

StagingCapacity staging_capacity(const Setting& setting) {
  StagingCapacity capacity;
  const std::uint64_t slot_bytes_all_kinds = std::uint64_t{static_cast<std::uint32_t>(setting.page_size)} * setting.row_bytes_all_kinds();
  if (setting.caps.staging_mib_override) {
    capacity.source = StagingSource::mib_override;
    const std::uint64_t bytes = static_cast<std::uint64_t>(*setting.caps.staging_mib_override) << 20;
    capacity.staging_slots = static_cast<std::int64_t>(bytes / (2 * slot_bytes_all_kinds));
  } else if (setting.caps.max_total_extend_tokens && setting.caps.max_batch_requests) {
    capacity.source = StagingSource::caps;
    // Each request adds at most one partial page beyond ceil(tokens / P).
    capacity.staging_slots = (*setting.caps.max_total_extend_tokens + setting.page_size - 1) / setting.page_size +
                             *setting.caps.max_batch_requests;
  } else {
    capacity.source = StagingSource::pool_fallback;
    // Every current page is also a page of the pool, so the pool bounds the current pages of a batch.
    capacity.staging_slots = setting.pool_pages;
  }
  capacity.bytes_total = 2 * static_cast<std::uint64_t>(capacity.staging_slots) * slot_bytes_all_kinds;
  return capacity;
}

std::string_view to_string(StagingSource source) {
  switch (source) {
    case StagingSource::caps: return "caps";
    case StagingSource::pool_fallback: return "pool_fallback";
    case StagingSource::mib_override: return "mib_override";
  }
  return "?";
}

std::string Verdict::describe() const {
  if (!overflow) return "ok";
  return fmt::format("overflow: {} current pages > {} staging slots", current_pages_total, staging_slots);
}

Verdict overflow_verdict(std::int64_t current_pages_total, std::int64_t staging_slots) {
  return Verdict{current_pages_total > staging_slots, current_pages_total, staging_slots};
}

ArenaCarve carve_arena(const Setting& setting, std::int64_t staging_slots, std::uint64_t flag_words) {
  ArenaCarve carve;
  carve.staging_slots = staging_slots;
  carve.page_size = setting.page_size;
  std::uint64_t offset = 0;
  for (const BufferKind& kind : setting.kinds) {
    carve.row_bytes.push_back(kind.row_bytes);
    carve.kind_offset_bytes.push_back(offset);
    offset = align_up(offset + static_cast<std::uint64_t>(staging_slots) * kind.row_bytes * setting.page_size,
                      ArenaCarve::alignment_bytes);
  }
  carve.half_bytes = offset;
  carve.staging_bytes = 2 * carve.half_bytes;
  carve.flags_offset_bytes = carve.staging_bytes;
  carve.flags_bytes = align_up(flag_words * sizeof(std::uint64_t), ArenaCarve::alignment_bytes);
  carve.total_bytes = carve.flags_offset_bytes + carve.flags_bytes;
  return carve;
}

}  // namespace cpkv::model

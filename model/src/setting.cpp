#include "cpkv/model/setting.hpp"

#include <fmt/format.h>

namespace cpkv::model {

std::optional<BufferKind> find_buffer_kind(std::string_view name) {
  for (const BufferKind& kind : kBufferKinds) {
    if (kind.name == name) return kind;
  }
  return std::nullopt;
}

std::uint64_t Setting::row_bytes_all_kinds() const {
  std::uint64_t sum = 0;
  for (const BufferKind& kind : kinds) sum += kind.row_bytes;
  return sum;
}

std::uint64_t Setting::row_bytes_on_layer(std::int32_t layer) const {
  std::uint64_t sum = 0;
  for (std::size_t k = 0; k < kinds.size(); ++k) sum += kind_active(k, layer) ? kinds[k].row_bytes : 0;
  return sum;
}

std::int32_t Setting::kinds_on_layer(std::int32_t layer) const {
  std::int32_t count = 0;
  for (std::size_t k = 0; k < kinds.size(); ++k) count += kind_active(k, layer) ? 1 : 0;
  return count;
}

namespace {
bool is_power_of_two(std::int64_t value) { return value > 0 && (value & (value - 1)) == 0; }

std::optional<Problem> validate_cap(const char* field, const std::optional<std::int64_t>& cap,
                                    std::int64_t max) {
  if (!cap) return std::nullopt;
  if (*cap < 1) return Problem{field, fmt::format("{} must be at least 1 (omit it for no cap)", *cap)};
  if (*cap > max) return Problem{field, fmt::format("{} exceeds the limit {}", *cap, max)};
  return std::nullopt;
}
}  // namespace

std::optional<Problem> validate(const Setting& s) {
  if (s.cp < 1) return Problem{"cp", fmt::format("{} is less than 1", s.cp)};
  if (s.cp > limits::cp_max) return Problem{"cp", fmt::format("{} exceeds the {} ranks of one node", s.cp, limits::cp_max)};
  if (!is_power_of_two(s.page_size)) return Problem{"page_size", fmt::format("{} is not a power of two", s.page_size)};
  if (s.page_size > limits::page_size_max) return Problem{"page_size", fmt::format("{} exceeds the limit {}", s.page_size, limits::page_size_max)};
  if (s.kinds.empty()) return Problem{"buffer_kinds", "no buffer kind given"};
  for (std::size_t i = 0; i < s.kinds.size(); ++i) {
    if (!find_buffer_kind(s.kinds[i].name)) return Problem{fmt::format("buffer_kinds[{}]", i), fmt::format("unknown buffer kind '{}'", s.kinds[i].name)};
    for (std::size_t j = 0; j < i; ++j) {
      if (s.kinds[j].name == s.kinds[i].name) return Problem{fmt::format("buffer_kinds[{}]", i), fmt::format("'{}' is listed twice", s.kinds[i].name)};
    }
  }
  if (s.layer_pattern.empty()) return Problem{"layers.pattern", "no layers"};
  if (s.layer_count() > limits::layer_count_max) return Problem{"layers.count", fmt::format("{} exceeds the limit {}", s.layer_count(), limits::layer_count_max)};
  for (std::size_t i = 0; i < s.layer_pattern.size(); ++i) {
    const char c = s.layer_pattern[i];
    if (c != 'F' && c != 'S') return Problem{"layers.pattern", fmt::format("layer {} is '{}', expected 'F' or 'S'", i, c)};
  }
  if (s.pool_pages < 1) return Problem{"pool_pages", fmt::format("{} is less than 1", s.pool_pages)};
  if (s.pool_pages > limits::pool_pages_max) return Problem{"pool_pages", fmt::format("{} exceeds the limit {}", s.pool_pages, limits::pool_pages_max)};
  if (auto p = validate_cap("caps.max_total_extend_tokens", s.caps.max_total_extend_tokens, limits::request_tokens_max * limits::batch_requests_max)) return p;
  if (auto p = validate_cap("caps.max_batch_requests", s.caps.max_batch_requests, limits::batch_requests_max)) return p;
  if (auto p = validate_cap("caps.staging_mib", s.caps.staging_mib_override, limits::staging_mib_max)) return p;
  if (s.caps.max_total_extend_tokens.has_value() != s.caps.max_batch_requests.has_value()) {
    return Problem{"caps", "max_total_extend_tokens and max_batch_requests size staging together: give both or neither"};
  }
  return std::nullopt;
}

std::string_view to_string(SplitPolicy policy) {
  switch (policy) {
    case SplitPolicy::zigzag: return "zigzag";
    case SplitPolicy::contiguous: return "contiguous";
    case SplitPolicy::round_robin: return "round_robin";
    case SplitPolicy::zigzag_tokens: return "zigzag_tokens";
    case SplitPolicy::continuous_tokens: return "continuous_tokens";
  }
  return "?";
}

std::optional<SplitPolicy> parse_split_policy(std::string_view text) {
  for (SplitPolicy p : {SplitPolicy::zigzag, SplitPolicy::contiguous, SplitPolicy::round_robin, SplitPolicy::zigzag_tokens,
                        SplitPolicy::continuous_tokens}) {
    if (to_string(p) == text) return p;
  }
  return std::nullopt;
}

}  // namespace cpkv::model

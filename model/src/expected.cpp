#include "cpkv/model/expected.hpp"

#include "cpkv/model/assert.hpp"
#include <cstring>

#include <fmt/format.h>

namespace cpkv::model {

void expected_row(const BatchLayout& layout, std::uint64_t seed, std::int32_t layer, std::uint32_t kind,
                  std::int64_t slot, std::int32_t row, std::span<std::uint8_t> out) {
  const std::optional<RowSource> source = row_source(layout, slot, row);
  if (!source) {
    std::memset(out.data(), 0, out.size());
    return;
  }
  const std::uint64_t key =
      source->kind == SlotKind::prefix
          ? prefix_row_key(seed, layer, kind, source->logical_page, source->row_in_page)
          : current_row_key(seed, layer, kind, source->request, source->token);
  const std::size_t words = out.size() / 8;
  for (std::size_t w = 0; w < words; ++w) {
    const std::uint64_t word = content_word(key, static_cast<std::uint32_t>(w));
    std::memcpy(out.data() + 8 * w, &word, 8);  // little-endian: byte b is byte b % 8 of the word
  }
  for (std::size_t b = words * 8; b < out.size(); ++b) out[b] = content_byte(key, static_cast<std::uint32_t>(b));
}

std::vector<std::uint8_t> expected_dense(const BatchLayout& layout, std::uint64_t seed, std::int32_t layer,
                                         std::uint32_t kind, std::uint32_t row_bytes) {
  std::vector<std::uint8_t> dense(static_cast<std::size_t>(layout.slot_count) * layout.page_size * row_bytes);
  for (std::int64_t s = 0; s < layout.slot_count; ++s) {
    for (std::int32_t r = 0; r < layout.page_size; ++r) {
      const std::size_t offset = (static_cast<std::size_t>(s) * layout.page_size + r) * row_bytes;
      expected_row(layout, seed, layer, kind, s, r, std::span(dense.data() + offset, row_bytes));
    }
  }
  return dense;
}

std::string Mismatch::describe(std::int32_t rank, std::int64_t batch, std::int32_t layer, std::string_view kind_name) const {
  return fmt::format("mismatch: rank {} batch {} layer {} kind {} slot {} row {} byte {}: expected 0x{:02x} got 0x{:02x} ({} wrong bytes)",
                     rank, batch, layer, kind_name, slot, row, byte, expected, actual, wrong_bytes);
}

std::string Mismatch::describe(std::int32_t rank, std::int32_t layer, std::string_view kind_name) const {
  return fmt::format("mismatch: rank {} layer {} kind {} slot {} row {} byte {}: expected 0x{:02x} got 0x{:02x} ({} wrong bytes)",
                     rank, layer, kind_name, slot, row, byte, expected, actual, wrong_bytes);
}

void add_row_mismatches(const std::uint8_t* actual, std::span<const std::uint8_t> expected, std::int64_t slot, std::int32_t row, Mismatch& m) {
  if (std::memcmp(actual, expected.data(), expected.size()) == 0) return;
  for (std::uint32_t b = 0; b < expected.size(); ++b) {
    if (actual[b] == expected[b]) continue;
    if (m.wrong_bytes == 0) m = {0, slot, row, b, expected[b], actual[b]};
    ++m.wrong_bytes;
  }
}

std::optional<Mismatch> compare_dense(std::span<const std::uint8_t> actual, std::span<const std::uint8_t> expected,
                                      std::int32_t page_size, std::uint32_t row_bytes) {
  CPKV_ASSERT(actual.size() == expected.size());
  if (std::memcmp(actual.data(), expected.data(), actual.size()) == 0) return std::nullopt;
  Mismatch m;
  bool located = false;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    if (actual[i] == expected[i]) continue;
    ++m.wrong_bytes;
    if (located) continue;
    located = true;
    const std::size_t row_global = i / row_bytes;
    m.slot = static_cast<std::int64_t>(row_global / page_size);
    m.row = static_cast<std::int32_t>(row_global % page_size);
    m.byte = static_cast<std::uint32_t>(i % row_bytes);
    m.expected = expected[i];
    m.actual = actual[i];
  }
  return m;
}

}  // namespace cpkv::model

// The expected dense buffer of any rank, layer and buffer kind, and a located comparison.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cpkv/model/batch.hpp"
#include "cpkv/model/content.hpp"

namespace cpkv::model {

// Fill `row` (row_bytes long) with the content of dense row `row_index` of slot `slot`.
// Zero rows (past the end of a partial page) become all zero.
void expected_row(const BatchLayout& layout, std::uint64_t seed, std::int32_t layer,
                  std::uint32_t kind, std::int64_t slot, std::int32_t row, std::span<std::uint8_t> out);

// The whole dense buffer: slot_count * P rows of row_bytes. It is the same on every rank: every rank
// composes the whole sequence of every request.
std::vector<std::uint8_t> expected_dense(const BatchLayout& layout, std::uint64_t seed,
                                         std::int32_t layer, std::uint32_t kind,
                                         std::uint32_t row_bytes);

// The first difference between an actual and the expected dense buffer, located.
struct Mismatch {
  std::int64_t wrong_bytes = 0;  // count over the whole buffer (nccl-tests' #wrong)
  std::int64_t slot = 0;
  std::int32_t row = 0;
  std::uint32_t byte = 0;
  std::uint8_t expected = 0;
  std::uint8_t actual = 0;
  std::string describe(std::int32_t rank, std::int32_t layer, std::string_view kind_name) const;
  // The same line with the batch named too (replays of several batches).
  std::string describe(std::int32_t rank, std::int64_t batch, std::int32_t layer, std::string_view kind_name) const;
};
// Adds row `row` of slot `slot` to `m`: its wrong bytes counted, the first one located when `m`
// has none yet. The one row comparison of every byte check (the oracle's, the simulator's).
void add_row_mismatches(const std::uint8_t* actual, std::span<const std::uint8_t> expected, std::int64_t slot, std::int32_t row, Mismatch& m);
std::optional<Mismatch> compare_dense(std::span<const std::uint8_t> actual,
                                      std::span<const std::uint8_t> expected,
                                      std::int32_t page_size, std::uint32_t row_bytes);

}  // namespace cpkv::model

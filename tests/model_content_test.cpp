// Deterministic content and the expected dense buffer (PROTOCOL.md section 8). Byte exactness is the
// testbed's final verdict: the expected buffer must be recomputable anywhere from the keys alone,
// prefix-cache hits must read identical bytes, padding must be zero, and a mismatch must be located
// precisely enough to debug (rank, layer, kind, slot, row, byte).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cpkv/model/content.hpp"
#include "cpkv/model/expected.hpp"
#include "model_tiny_batch.hpp"

namespace cpkv::model {
namespace {

using testing::kIndexerRowBytes;
using testing::kKvFp8RowBytes;
using testing::tiny_batch;
using testing::tiny_setting;

constexpr std::uint64_t kSeed = 0x5eed;
constexpr std::uint32_t kKvKind = 0;       // kinds[0] = kv_fp8
constexpr std::uint32_t kIndexerKind = 1;  // kinds[1] = indexer_k

// Offset of byte `byte` of row `row` of slot `slot` in a dense buffer.
std::size_t at(std::int64_t slot, std::int32_t row, std::uint32_t byte, std::uint32_t row_bytes) {
  return (static_cast<std::size_t>(slot) * 4 + row) * row_bytes + byte;
}

TEST(ModelContent, RowKeysAreDeterministic) {
  // Host and device recompute the same content with no shared state.
  EXPECT_EQ(prefix_row_key(kSeed, 3, 1, 5, 2), prefix_row_key(kSeed, 3, 1, 5, 2));
  EXPECT_EQ(current_row_key(kSeed, 3, 1, 0, 13), current_row_key(kSeed, 3, 1, 0, 13));
  const std::uint64_t key = prefix_row_key(kSeed, 0, 0, 5, 0);
  EXPECT_EQ(content_byte(key, 17), content_byte(key, 17));
}

TEST(ModelContent, RowKeysDifferInEveryComponentAndBetweenDomains) {
  // A collision would let a misplaced row pass the byte-exact check.
  const std::uint64_t base = prefix_row_key(kSeed, 3, 1, 5, 2);
  EXPECT_NE(base, prefix_row_key(kSeed + 1, 3, 1, 5, 2));
  EXPECT_NE(base, prefix_row_key(kSeed, 4, 1, 5, 2));
  EXPECT_NE(base, prefix_row_key(kSeed, 3, 0, 5, 2));
  EXPECT_NE(base, prefix_row_key(kSeed, 3, 1, 6, 2));
  EXPECT_NE(base, prefix_row_key(kSeed, 3, 1, 5, 3));
  // Same numbers, different domain: a current row never aliases a prefix row.
  EXPECT_NE(base, current_row_key(kSeed, 3, 1, 5, 2));
  const std::uint64_t cur = current_row_key(kSeed, 3, 1, 0, 13);
  EXPECT_NE(cur, current_row_key(kSeed, 3, 1, 1, 13));
  EXPECT_NE(cur, current_row_key(kSeed, 3, 1, 0, 12));
}

TEST(ModelContent, ContentByteIsTheMatchingByteOfContentWord) {
  // The fill's fast path writes whole words; it must agree with the byte-wise definition.
  const std::uint64_t key = current_row_key(kSeed, 1, 0, 1, 8);
  for (std::uint32_t b = 0; b < kKvFp8RowBytes; ++b) {
    const std::uint64_t word = content_word(key, b / 8);
    ASSERT_EQ(content_byte(key, b), static_cast<std::uint8_t>(word >> (8 * (b % 8)))) << "byte " << b;
  }
}

TEST(ModelContent, ExpectedDenseHoldsPrefixRowsByPoolPageAndCurrentRowsByRequestToken) {
  // Tiny batch, layer 0, indexer_k: slot 0 = pool page 5, slot 1 = page 2 (r0 prefix), slots 2..3
  // r0 tokens 8..13, slots 4..6 r1 tokens 0..8. Each row checked against the header's key rule.
  const BatchLayout layout = layout_batch(tiny_setting(), tiny_batch());
  const std::vector<std::uint8_t> dense = expected_dense(layout, kSeed, 0, kIndexerKind, kIndexerRowBytes);
  ASSERT_EQ(dense.size(), 7u * 4 * kIndexerRowBytes);
  struct RowWant {
    std::int64_t slot;
    std::int32_t row;
    std::uint64_t key;
  };
  const RowWant rows[] = {
      {0, 0, prefix_row_key(kSeed, 0, kIndexerKind, 5, 0)},
      {0, 3, prefix_row_key(kSeed, 0, kIndexerKind, 5, 3)},
      {1, 2, prefix_row_key(kSeed, 0, kIndexerKind, 2, 2)},
      {2, 0, current_row_key(kSeed, 0, kIndexerKind, 0, 8)},
      {3, 1, current_row_key(kSeed, 0, kIndexerKind, 0, 13)},
      {4, 0, current_row_key(kSeed, 0, kIndexerKind, 1, 0)},
      {5, 3, current_row_key(kSeed, 0, kIndexerKind, 1, 7)},
      {6, 0, current_row_key(kSeed, 0, kIndexerKind, 1, 8)},
  };
  for (const RowWant& w : rows) {
    for (std::uint32_t b = 0; b < kIndexerRowBytes; ++b) {
      ASSERT_EQ(dense[at(w.slot, w.row, b, kIndexerRowBytes)], content_byte(w.key, b))
          << "slot " << w.slot << " row " << w.row << " byte " << b;
    }
  }
}

TEST(ModelContent, RowsPastThePartialPageEndAreZero) {
  // Slot 3 (r0's last page) has rows 2, 3 past the end; slot 6 (r1's) rows 1..3.
  const BatchLayout layout = layout_batch(tiny_setting(), tiny_batch());
  const std::vector<std::uint8_t> dense = expected_dense(layout, kSeed, 1, kKvKind, kKvFp8RowBytes);
  const std::pair<std::int64_t, std::int32_t> zero_rows[] = {{3, 2}, {3, 3}, {6, 1}, {6, 2}, {6, 3}};
  for (const auto& [slot, row] : zero_rows) {
    for (std::uint32_t b = 0; b < kKvFp8RowBytes; ++b) {
      ASSERT_EQ(dense[at(slot, row, b, kKvFp8RowBytes)], 0) << "slot " << slot << " row " << row;
    }
  }
  // A valid row is not all zero (656 hashed bytes all zero would be a broken hash).
  std::uint32_t nonzero = 0;
  for (std::uint32_t b = 0; b < kKvFp8RowBytes; ++b) nonzero += dense[at(6, 0, b, kKvFp8RowBytes)] != 0;
  EXPECT_GT(nonzero, 0u);
}

TEST(ModelContent, ExpectedRowAgreesWithExpectedDenseAndZeroesPaddingRows) {
  const BatchLayout layout = layout_batch(tiny_setting(), tiny_batch());
  const std::vector<std::uint8_t> dense = expected_dense(layout, kSeed, 1, kKvKind, kKvFp8RowBytes);
  std::vector<std::uint8_t> row(kKvFp8RowBytes, 0xAB);
  for (std::int64_t slot = 0; slot < 7; ++slot) {
    for (std::int32_t r = 0; r < 4; ++r) {
      std::fill(row.begin(), row.end(), 0xAB);  // stale bytes must be overwritten, zeros included
      expected_row(layout, kSeed, 1, kKvKind, slot, r, row);
      for (std::uint32_t b = 0; b < kKvFp8RowBytes; ++b) {
        ASSERT_EQ(row[b], dense[at(slot, r, b, kKvFp8RowBytes)]) << "slot " << slot << " row " << r;
      }
    }
  }
}

TEST(ModelContent, RequestsSharingAPrefixPageSeeIdenticalRows) {
  // A prefix-cache hit: r0 and r1 both reference logical page 7. Their prefix rows come from the same
  // pool page, so they must be the same bytes, while their current rows differ.
  // Slots: r0 {0: page 7, 1: current (token 4)}, r1 {2: page 7, 3: page 3, 4: current (token 8)}.
  Batch batch;
  batch.requests.push_back(Request{.prefix_len = 4, .extend_len = 1, .prefix_pages = {7}});
  batch.requests.push_back(Request{.prefix_len = 8, .extend_len = 1, .prefix_pages = {7, 3}});
  const BatchLayout layout = layout_batch(tiny_setting(), batch);
  ASSERT_EQ(layout.slot_count, 5);
  const std::vector<std::uint8_t> dense = expected_dense(layout, kSeed, 1, kKvKind, kKvFp8RowBytes);
  for (std::int32_t r = 0; r < 4; ++r) {
    for (std::uint32_t b = 0; b < kKvFp8RowBytes; ++b) {
      ASSERT_EQ(dense[at(0, r, b, kKvFp8RowBytes)], dense[at(2, r, b, kKvFp8RowBytes)]) << "row " << r;
    }
  }
  bool differ = false;
  for (std::uint32_t b = 0; b < kKvFp8RowBytes; ++b) {
    differ |= dense[at(1, 0, b, kKvFp8RowBytes)] != dense[at(4, 0, b, kKvFp8RowBytes)];
  }
  EXPECT_TRUE(differ);
}

TEST(ModelContent, ExpectedDenseDiffersBetweenLayersAndKinds) {
  // A variant that reads the wrong parity half (the previous layer) must fail the check.
  const BatchLayout layout = layout_batch(tiny_setting(), tiny_batch());
  EXPECT_NE(expected_dense(layout, kSeed, 0, kKvKind, kKvFp8RowBytes),
            expected_dense(layout, kSeed, 1, kKvKind, kKvFp8RowBytes));
  EXPECT_NE(expected_dense(layout, kSeed, 0, kKvKind, kIndexerRowBytes),
            expected_dense(layout, kSeed, 0, kIndexerKind, kIndexerRowBytes));
}

// PROTOCOL.md section 8: a row's bytes are a hash of (layer, buffer kind, request, token) and the
// seed. The layer is what lets the byte check see a read of the stale parity half (the previous
// layer's rows, same slot): rows of different layers must differ for EVERY kind, prefix and
// current rows alike, and so must every valid row of the expected buffers of two layers.
TEST(ModelContent, RowsOfDifferentLayersDifferForEveryKind) {
  constexpr std::uint32_t kKindsMax = std::size(kBufferKinds);  // a setting names each kind once
  for (std::uint32_t kind = 0; kind < kKindsMax; ++kind) {
    for (std::uint32_t layer = 0; layer < 4; ++layer) {
      for (std::uint32_t other = layer + 1; other < 5; ++other) {
        EXPECT_NE(prefix_row_key(kSeed, layer, kind, 5, 2), prefix_row_key(kSeed, other, kind, 5, 2)) << "kind " << kind;
        EXPECT_NE(current_row_key(kSeed, layer, kind, 1, 7), current_row_key(kSeed, other, kind, 1, 7)) << "kind " << kind;
      }
    }
  }
  const BatchLayout layout = layout_batch(tiny_setting(), tiny_batch());
  const std::pair<std::uint32_t, std::uint32_t> kinds[] = {{kKvKind, kKvFp8RowBytes}, {kIndexerKind, kIndexerRowBytes}};
  for (const auto& [kind, row_bytes] : kinds) {
    const std::vector<std::uint8_t> even = expected_dense(layout, kSeed, 0, kind, row_bytes);
    const std::vector<std::uint8_t> odd = expected_dense(layout, kSeed, 1, kind, row_bytes);
    for (std::int64_t slot = 0; slot < layout.slot_count; ++slot) {
      const std::int32_t rows_valid = slot == 3 ? 2 : slot == 6 ? 1 : 4;  // model_tiny_batch.hpp
      for (std::int32_t row = 0; row < rows_valid; ++row) {
        const auto at_row = [&](const std::vector<std::uint8_t>& dense) {
          return std::vector<std::uint8_t>(dense.begin() + at(slot, row, 0, row_bytes), dense.begin() + at(slot, row + 1, 0, row_bytes));
        };
        EXPECT_NE(at_row(even), at_row(odd)) << "kind " << kind << " slot " << slot << " row " << row;
      }
    }
  }
}

TEST(ModelContent, CompareDenseOfEqualBuffersFindsNothing) {
  const BatchLayout layout = layout_batch(tiny_setting(), tiny_batch());
  const auto expected = expected_dense(layout, kSeed, 0, kIndexerKind, kIndexerRowBytes);
  EXPECT_FALSE(compare_dense(expected, expected, 4, kIndexerRowBytes).has_value());
}

TEST(ModelContent, CompareDenseLocatesTheFirstWrongByteAndCountsAllWrongBytes) {
  // Corrupt (slot 5, row 0, byte 3), (slot 3, row 1, byte 17) and (slot 6, row 2, byte 0) - the
  // last a padding row. In memory order the first is slot 3 row 1 byte 17 at offset
  // (3*4 + 1) * 132 + 17 = 1733.
  const BatchLayout layout = layout_batch(tiny_setting(), tiny_batch());
  const auto expected = expected_dense(layout, kSeed, 0, kIndexerKind, kIndexerRowBytes);
  std::vector<std::uint8_t> actual = expected;
  ASSERT_EQ(at(3, 1, 17, kIndexerRowBytes), 1733u);
  actual[at(5, 0, 3, kIndexerRowBytes)] ^= 0x01;
  actual[at(3, 1, 17, kIndexerRowBytes)] ^= 0xFF;
  actual[at(6, 2, 0, kIndexerRowBytes)] = 0x42;  // expected 0 there
  const auto m = compare_dense(actual, expected, 4, kIndexerRowBytes);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->wrong_bytes, 3);
  EXPECT_EQ(m->slot, 3);
  EXPECT_EQ(m->row, 1);
  EXPECT_EQ(m->byte, 17u);
  EXPECT_EQ(m->expected, expected[1733]);
  EXPECT_EQ(m->actual, static_cast<std::uint8_t>(expected[1733] ^ 0xFF));
}

TEST(ModelContent, CompareDenseLocatesAWrongByteInAPaddingRow) {
  const BatchLayout layout = layout_batch(tiny_setting(), tiny_batch());
  const auto expected = expected_dense(layout, kSeed, 1, kKvKind, kKvFp8RowBytes);
  std::vector<std::uint8_t> actual = expected;
  actual[at(6, 3, 655, kKvFp8RowBytes)] = 7;  // the very last byte of the buffer
  const auto m = compare_dense(actual, expected, 4, kKvFp8RowBytes);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->wrong_bytes, 1);
  EXPECT_EQ(m->slot, 6);
  EXPECT_EQ(m->row, 3);
  EXPECT_EQ(m->byte, 655u);
  EXPECT_EQ(m->expected, 0);
  EXPECT_EQ(m->actual, 7);
}

TEST(ModelContent, MismatchDescriptionNamesRankLayerKindSlotRowAndByte) {
  // Distinct numbers so each one's presence is checked on its own.
  Mismatch m;
  m.wrong_bytes = 9;
  m.slot = 123;
  m.row = 45;
  m.byte = 678;
  m.expected = 0x11;
  m.actual = 0x22;
  const std::string text = m.describe(6, 59, "indexer_k");
  for (const char* part : {"rank", "6", "layer", "59", "indexer_k", "slot", "123", "row", "45",
                           "byte", "678"}) {
    EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' missing from: " << text;
  }
}

}  // namespace
}  // namespace cpkv::model

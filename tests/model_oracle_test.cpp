// The plain oracle (model/oracle.hpp): a second account of PROTOCOL.md sections 2, 3 and 8 that
// never reads BatchLayout. Its worth is independence: where it and the layout agree over many
// shapes, both are likely right; where a layout bug is self-consistent (the gather and the
// layout-based expectation agree), it still disagrees. Expectations here come from the spec text.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpkv/model/batch.hpp"
#include "cpkv/model/content.hpp"
#include "cpkv/model/expected.hpp"
#include "cpkv/model/oracle.hpp"
#include "cpkv/model/plan.hpp"
#include "cpkv/model/staging.hpp"
#include "model_tiny_batch.hpp"

namespace cpkv::model {
namespace {

using testing::tiny_batch;
using testing::tiny_setting;

// Shapes to sweep: every request mix below under cp 1..5 and P 1, 2, 4, 8: page-exact, partial,
// one-token extends, empty and long prefixes, more pages than 2*cp blocks and fewer.
std::vector<Batch> sweep_batches(std::int32_t page_size) {
  const std::int64_t P = page_size;
  std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> mixes = {  // (prefix pages, extend tokens)
      {{0, 1}},
      {{1, P}},
      {{2, 3 * P + 1}, {0, 2}},
      {{0, 11 * P}, {3, 1}, {1, 5 * P - 1}},
      {{4, 17 * P + 3}},
      {{0, 1}, {0, 1}, {0, 1}, {2, 2 * P}},
  };
  std::vector<Batch> out;
  std::int64_t next_page = 3;
  for (const auto& mix : mixes) {
    Batch batch;
    for (const auto& [prefix_pages, extend] : mix) {
      Request r;
      r.prefix_len = prefix_pages * P;
      r.extend_len = extend;
      for (std::int64_t k = 0; k < prefix_pages; ++k) r.prefix_pages.push_back((next_page += 7) % 61);
      batch.requests.push_back(r);
    }
    out.push_back(batch);
  }
  return out;
}

Setting sweep_setting(std::int32_t cp, std::int32_t page_size, SplitPolicy split) {
  Setting s = tiny_setting();
  s.cp = cp;
  s.page_size = page_size;
  s.split = split;
  s.pool_pages = 64;
  return s;
}

TEST(ModelOracle, TinyBatchSlotsFollowMergedSpanOrderWorkedByHand) {
  // model_tiny_batch.hpp: slots 0-1 r0's prefix pages 5 and 2, 2-3 r0's current pages (tokens 8..11
  // and 12..13), 4-6 r1's current pages (tokens 0..3, 4..7, 8).
  const spec::ByteOracle oracle(4, tiny_batch());
  ASSERT_EQ(oracle.slot_count(), 7);
  EXPECT_EQ(oracle.current_pages_total(), 5);
  EXPECT_TRUE(oracle.slot(0).prefix);
  EXPECT_EQ(oracle.slot(0).logical_page, 5);
  EXPECT_EQ(oracle.slot(1).logical_page, 2);
  EXPECT_FALSE(oracle.slot(2).prefix);
  EXPECT_EQ(oracle.slot(2).first_token, 8);
  EXPECT_EQ(oracle.slot(3).first_token, 12);
  EXPECT_EQ(oracle.slot(3).rows_valid, 2);
  EXPECT_EQ(oracle.slot(3).current_index, 1);
  EXPECT_EQ(oracle.slot(4).request, 1);
  EXPECT_EQ(oracle.slot(4).first_token, 0);
  EXPECT_EQ(oracle.slot(6).first_token, 8);
  EXPECT_EQ(oracle.slot(6).rows_valid, 1);
  EXPECT_EQ(oracle.slot(6).current_index, 4);
}

TEST(ModelOracle, RowsArePoolContentForPrefixWriterContentForCurrentAndZeroPastTheEnd) {
  const spec::ByteOracle oracle(4, tiny_batch());
  std::vector<std::uint8_t> row(656);
  oracle.row(7, 1, 0, 1, 3, row);  // slot 1: logical page 2, row 3
  EXPECT_EQ(row[0], content_byte(prefix_row_key(7, 1, 0, 2, 3), 0));
  EXPECT_EQ(row[655], content_byte(prefix_row_key(7, 1, 0, 2, 3), 655));
  oracle.row(7, 1, 0, 3, 1, row);  // slot 3: r0 token 13
  EXPECT_EQ(row[100], content_byte(current_row_key(7, 1, 0, 0, 13), 100));
  oracle.row(7, 1, 0, 3, 2, row);  // slot 3 row 2: past the 2 valid rows
  EXPECT_TRUE(std::all_of(row.begin(), row.end(), [](std::uint8_t b) { return b == 0; }));
}

TEST(ModelOracle, AgreesWithTheLayoutExpectationOverManyShapes) {
  // Two accounts written apart must agree everywhere the layout is right.
  for (std::int32_t P : {1, 2, 4, 8}) {
    for (std::int32_t cp = 1; cp <= 5; ++cp) {
      const Setting setting = sweep_setting(cp, P, SplitPolicy::zigzag);
      for (const Batch& batch : sweep_batches(P)) {
        const BatchLayout layout = layout_batch(setting, batch);
        const spec::ByteOracle oracle(P, batch);
        ASSERT_EQ(oracle.slot_count(), layout.slot_count);
        ASSERT_EQ(oracle.current_pages_total(), layout.current_pages_total);
        for (std::uint32_t kind : {0u, 1u}) {
          const std::uint32_t row_bytes = kind == 0 ? 656 : 132;
          const std::vector<std::uint8_t> dense = expected_dense(layout, 99, 1, kind, row_bytes);
          const auto mismatch = oracle.check(dense, 99, 1, kind, row_bytes);
          EXPECT_FALSE(mismatch) << "P " << P << " cp " << cp << ": " << mismatch->describe(0, 1, "kind");
        }
      }
    }
  }
}

TEST(ModelOracle, WritersFromTheSpecTextMatchTheLayoutUnderEveryPolicy) {
  // Section 2, including zigzag when C % (2cp) != 0 and round_robin by batch current index.
  for (SplitPolicy policy : {SplitPolicy::zigzag, SplitPolicy::contiguous, SplitPolicy::round_robin}) {
    for (std::int32_t cp = 1; cp <= 5; ++cp) {
      for (const Batch& batch : sweep_batches(2)) {
        const BatchLayout layout = layout_batch(sweep_setting(cp, 2, policy), batch);
        const spec::ByteOracle oracle(2, batch);
        for (std::int64_t s = 0; s < oracle.slot_count(); ++s) {
          const spec::DenseSlot& slot = oracle.slot(s);
          if (slot.prefix) continue;
          const Request& r = batch.requests[static_cast<std::size_t>(slot.request)];
          const std::int64_t pages = (r.extend_len + 1) / 2;
          const std::int64_t page = (slot.first_token - r.prefix_len) / 2;
          const std::int32_t want = spec::writer(policy, page, pages, slot.current_index, cp);
          EXPECT_EQ(layout.current[static_cast<std::size_t>(slot.current_index)].writer, want)
              << to_string(policy) << " cp " << cp << " current index " << slot.current_index;
          EXPECT_EQ(layout.current[static_cast<std::size_t>(slot.current_index)].slot, s);
        }
      }
    }
  }
}

TEST(ModelOracle, ZigzagBlocksOfThirteenPagesOverSixBlocksAreThreeThenTwo) {
  // C = 13, cp = 3: 2cp = 6 blocks of 13/6 = 2 pages, the first 13 % 6 = 1 block one more: 3,2,2,2,2,2.
  // Rank k owns blocks k and 5-k: pages 0-2 rank 0, 3-4 rank 1, 5-6 rank 2, 7-8 rank 2, 9-10 rank 1, 11-12 rank 0.
  const std::vector<std::int32_t> want = {0, 0, 0, 1, 1, 2, 2, 2, 2, 1, 1, 0, 0};
  for (std::int64_t p = 0; p < 13; ++p) {
    EXPECT_EQ(spec::writer(SplitPolicy::zigzag, p, 13, 0, 3), want[p]) << "page " << p;
    EXPECT_EQ(writer_in_request(SplitPolicy::zigzag, p, 13, 3), want[p]) << "page " << p;
  }
}

TEST(ModelOracle, StagingDirectDescriptorsAreOwnerAndLocalPageForPrefixAndWriterAndIndexForCurrent) {
  // Section 5: prefix slot of page g reads (g % cp, g / cp); current index i of writer w reads (cp + w, i).
  for (std::int32_t cp = 1; cp <= 5; ++cp) {
    for (const Batch& batch : sweep_batches(4)) {
      const Setting setting = sweep_setting(cp, 4, SplitPolicy::round_robin);
      const std::vector<SlotDescriptor> plan = staging_direct_plan(layout_batch(setting, batch));
      const spec::ByteOracle oracle(4, batch);
      ASSERT_EQ(static_cast<std::int64_t>(plan.size()), oracle.slot_count());
      for (std::int64_t s = 0; s < oracle.slot_count(); ++s) {
        const spec::DenseSlot& slot = oracle.slot(s);
        const SlotDescriptor want = slot.prefix ? SlotDescriptor{static_cast<std::int32_t>(slot.logical_page % cp), slot.logical_page / cp}
                                                : SlotDescriptor{cp + static_cast<std::int32_t>(slot.current_index % cp), slot.current_index};
        EXPECT_EQ(plan[static_cast<std::size_t>(s)], want) << "cp " << cp << " slot " << s;
      }
    }
  }
}

TEST(ModelOracle, StagingSlotsAreCeilTokensOverPagePlusRequestsAtEveryBoundary) {
  // Section 4: staging_slots = ceil(max_total_extend_tokens / P) + max_batch_requests, and
  // bytes = 2 * staging_slots * P * sum(row_bytes), around each multiple of P.
  for (std::int32_t P : {1, 4, 64}) {
    for (std::int64_t tokens = 1; tokens <= 3 * P + 1; ++tokens) {
      for (std::int64_t requests = 1; requests <= 3; ++requests) {
        Setting s = sweep_setting(2, P, SplitPolicy::zigzag);
        s.caps.max_total_extend_tokens = tokens;
        s.caps.max_batch_requests = requests;
        const StagingCapacity c = staging_capacity(s);
        const std::int64_t want = (tokens + P - 1) / P + requests;
        EXPECT_EQ(spec::staging_slots_from_caps(tokens, requests, P), want);
        EXPECT_EQ(c.staging_slots, want) << "P " << P << " tokens " << tokens << " requests " << requests;
        EXPECT_EQ(c.bytes_total, 2ULL * static_cast<std::uint64_t>(want) * P * (656 + 132));
      }
    }
  }
}

TEST(ModelOracle, SeesASelfConsistentReversedLayoutThatTheLayoutExpectationAccepts) {
  // The reversed_request_order planted bug, in the model: requests laid out in reverse order with
  // their ids kept. The layout's own expectation describes exactly what a gather from it leaves, so
  // it cannot object; the oracle, which walks the requests itself, finds slot 0 wrong.
  Batch reversed = tiny_batch();
  std::reverse(reversed.requests.begin(), reversed.requests.end());
  BatchLayout layout = layout_batch(tiny_setting(), reversed);
  for (Slot& slot : layout.slots) slot.request = 1 - slot.request;
  for (CurrentPage& page : layout.current) page.request = 1 - page.request;
  std::reverse(layout.request_first_slot.begin(), layout.request_first_slot.end());
  std::reverse(layout.request_first_current_slot.begin(), layout.request_first_current_slot.end());
  std::reverse(layout.request_first_current_index.begin(), layout.request_first_current_index.end());
  const std::vector<std::uint8_t> gathered = expected_dense(layout, 5, 0, 0, 656);
  EXPECT_FALSE(compare_dense(gathered, expected_dense(layout, 5, 0, 0, 656), 4, 656));
  const auto mismatch = spec::ByteOracle(4, tiny_batch()).check(gathered, 5, 0, 0, 656);
  ASSERT_TRUE(mismatch);
  EXPECT_EQ(mismatch->slot, 0);
  EXPECT_EQ(mismatch->row, 0);
}

}  // namespace
}  // namespace cpkv::model

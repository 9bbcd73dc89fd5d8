// Slots in merged-span order and the batch-logical current index (PROTOCOL.md section 3), and the
// validation of settings and batches. Peers address each other's staging by current index with no
// handshake, so every rank must derive the same slots and indices from the batch alone; and a bad
// setting or batch must be refused by field before anything is sized from it.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cpkv/model/batch.hpp"
#include "cpkv/model/setting.hpp"
#include "model_tiny_batch.hpp"

namespace cpkv::model {
namespace {

using testing::tiny_batch;
using testing::tiny_setting;

TEST(ModelLayout, SlotsFollowMergedSpanOrderPrefixThenCurrentPerRequest) {
  const BatchLayout layout = layout_batch(tiny_setting(), tiny_batch());
  EXPECT_EQ(layout.cp, 2);
  EXPECT_EQ(layout.page_size, 4);
  EXPECT_EQ(layout.slot_count, 7);
  EXPECT_EQ(layout.current_pages_total, 5);
  ASSERT_EQ(layout.slots.size(), 7u);
  struct Want {
    SlotKind kind;
    std::int32_t request;
    std::int64_t page_or_index;
  };
  const Want want[] = {
      {SlotKind::prefix, 0, 5},  {SlotKind::prefix, 0, 2},  {SlotKind::current, 0, 0},
      {SlotKind::current, 0, 1}, {SlotKind::current, 1, 2}, {SlotKind::current, 1, 3},
      {SlotKind::current, 1, 4},
  };
  for (std::size_t s = 0; s < 7; ++s) {
    EXPECT_EQ(layout.slots[s].kind, want[s].kind) << "slot " << s;
    EXPECT_EQ(layout.slots[s].request, want[s].request) << "slot " << s;
    EXPECT_EQ(layout.slots[s].page_or_index, want[s].page_or_index) << "slot " << s;
  }
  // r1 has an empty prefix span: it begins where its current span begins.
  EXPECT_EQ(layout.request_first_slot, (std::vector<std::int64_t>{0, 4}));
  EXPECT_EQ(layout.request_first_current_slot, (std::vector<std::int64_t>{2, 4}));
  EXPECT_EQ(layout.request_first_current_index, (std::vector<std::int64_t>{0, 2}));
}

TEST(ModelLayout, CurrentPagesCarryRequestPageSlotWriterAndValidRows) {
  // rows_valid: r0 extend 6 = 4 + 2; r1 extend 9 = 4 + 4 + 1.
  const BatchLayout layout = layout_batch(tiny_setting(), tiny_batch());
  ASSERT_EQ(layout.current.size(), 5u);
  const CurrentPage want[] = {
      {.request = 0, .writer = 0, .page_in_request = 0, .slot = 2, .rows_valid = 4},
      {.request = 0, .writer = 1, .page_in_request = 1, .slot = 3, .rows_valid = 2},
      {.request = 1, .writer = 0, .page_in_request = 0, .slot = 4, .rows_valid = 4},
      {.request = 1, .writer = 1, .page_in_request = 1, .slot = 5, .rows_valid = 4},
      {.request = 1, .writer = 1, .page_in_request = 2, .slot = 6, .rows_valid = 1},
  };
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(layout.current[i].request, want[i].request) << "index " << i;
    EXPECT_EQ(layout.current[i].writer, want[i].writer) << "index " << i;
    EXPECT_EQ(layout.current[i].page_in_request, want[i].page_in_request) << "index " << i;
    EXPECT_EQ(layout.current[i].slot, want[i].slot) << "index " << i;
    EXPECT_EQ(layout.current[i].rows_valid, want[i].rows_valid) << "index " << i;
  }
}

TEST(ModelLayout, FullLastPageHasAllRowsValid) {
  // extend_len a multiple of P: no partial page, every row of the last page is valid.
  Setting setting = tiny_setting();
  Batch batch;
  batch.requests.push_back(Request{.prefix_len = 4, .extend_len = 8, .prefix_pages = {9}});
  const BatchLayout layout = layout_batch(setting, batch);
  EXPECT_EQ(layout.slot_count, 3);
  EXPECT_EQ(layout.current_pages_total, 2);
  ASSERT_EQ(layout.current.size(), 2u);
  EXPECT_EQ(layout.current[0].rows_valid, 4);
  EXPECT_EQ(layout.current[1].rows_valid, 4);
  EXPECT_EQ(layout.current[1].slot, 2);
}

TEST(ModelLayout, RowSourceOfPrefixRowNamesLogicalPageAndRow) {
  // Slot 0 holds logical page 5 = r0's tokens 0..3; slot 1 logical page 2 = tokens 4..7.
  const BatchLayout layout = layout_batch(tiny_setting(), tiny_batch());
  const auto a = row_source(layout, 0, 1);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->kind, SlotKind::prefix);
  EXPECT_EQ(a->request, 0);
  EXPECT_EQ(a->token, 1);
  EXPECT_EQ(a->logical_page, 5);
  EXPECT_EQ(a->row_in_page, 1);
  const auto b = row_source(layout, 1, 3);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->kind, SlotKind::prefix);
  EXPECT_EQ(b->token, 7);
  EXPECT_EQ(b->logical_page, 2);
  EXPECT_EQ(b->row_in_page, 3);
}

TEST(ModelLayout, RowSourceOfCurrentRowNamesSequenceTokenAndNoPoolPage) {
  // Current tokens follow the prefix in the sequence: r0's current page 1 row 1 is token 8+4+1.
  const BatchLayout layout = layout_batch(tiny_setting(), tiny_batch());
  const auto a = row_source(layout, 3, 1);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->kind, SlotKind::current);
  EXPECT_EQ(a->request, 0);
  EXPECT_EQ(a->token, 13);
  EXPECT_EQ(a->logical_page, -1);
  EXPECT_EQ(a->row_in_page, 1);
  const auto b = row_source(layout, 4, 2);  // r1 (no prefix) current page 0 row 2
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->request, 1);
  EXPECT_EQ(b->token, 2);
  const auto c = row_source(layout, 6, 0);  // r1's last page, its only valid row: token 8
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->request, 1);
  EXPECT_EQ(c->token, 8);
  EXPECT_EQ(c->row_in_page, 0);
}

TEST(ModelLayout, RowsPastTheEndOfAPartialPageAreZeroRows) {
  // Section 1: rows of tokens past the end are zero in every output.
  const BatchLayout layout = layout_batch(tiny_setting(), tiny_batch());
  EXPECT_FALSE(row_source(layout, 3, 2).has_value());
  EXPECT_FALSE(row_source(layout, 3, 3).has_value());
  for (std::int32_t row = 1; row < 4; ++row) {
    EXPECT_FALSE(row_source(layout, 6, row).has_value()) << "row " << row;
  }
  EXPECT_TRUE(row_source(layout, 5, 3).has_value());
}

TEST(ModelLayout, TinySettingAndBatchAreValid) {
  EXPECT_FALSE(validate(tiny_setting()).has_value());
  EXPECT_FALSE(validate(tiny_setting(), tiny_batch()).has_value());
  EXPECT_EQ(tiny_setting().row_bytes_all_kinds(), 788u);
  EXPECT_EQ(tiny_setting().pool_pages_per_rank(), 8);
}

// The field names are matched as substrings so that a field path such as "requests[1].extend_len"
// also passes; what matters is that the offending field is named.
void expect_refused(const std::optional<Problem>& problem, const std::string& field_part) {
  ASSERT_TRUE(problem.has_value()) << "expected a refusal naming " << field_part;
  EXPECT_NE(problem->field.find(field_part), std::string::npos)
      << "field '" << problem->field << "' does not name " << field_part;
  EXPECT_FALSE(problem->reason.empty());
}

TEST(ModelLayout, SettingWithGroupSizeOutsideOneToEightIsRefusedNamingCp) {
  Setting s = tiny_setting();
  s.cp = 0;
  expect_refused(validate(s), "cp");
  s.cp = -3;
  expect_refused(validate(s), "cp");
  s.cp = limits::cp_max + 1;
  expect_refused(validate(s), "cp");
  s.cp = limits::cp_max;
  EXPECT_FALSE(validate(s).has_value());
  s.cp = 3;  // odd sizes are allowed (property tests use them)
  EXPECT_FALSE(validate(s).has_value());
}

TEST(ModelLayout, SettingWithPageSizeNotAPowerOfTwoUpTo256IsRefusedNamingPageSize) {
  Setting s = tiny_setting();
  for (std::int32_t bad : {0, -4, 3, 6, 12, 100, 512}) {
    s.page_size = bad;
    expect_refused(validate(s), "page_size");
  }
  for (std::int32_t good : {1, 2, 64, 256}) {
    s.page_size = good;
    EXPECT_FALSE(validate(s).has_value()) << "page_size " << good;
  }
}

TEST(ModelLayout, SettingWithoutBufferKindsIsRefusedNamingKinds) {
  Setting s = tiny_setting();
  s.kinds.clear();
  expect_refused(validate(s), "kind");
}

TEST(ModelLayout, SettingWithPatternCharOtherThanFOrSIsRefusedNamingThePattern) {
  Setting s = tiny_setting();
  s.layer_pattern = "FSX";
  expect_refused(validate(s), "pattern");
  s.layer_pattern = "Fs";
  expect_refused(validate(s), "pattern");
}

TEST(ModelLayout, BufferKindRegistryIsClosed) {
  // Unknown kinds are refused because every byte count depends on the row size.
  ASSERT_TRUE(find_buffer_kind("kv_fp8").has_value());
  EXPECT_EQ(find_buffer_kind("kv_fp8")->row_bytes, 656u);
  EXPECT_EQ(find_buffer_kind("kv_bf16")->row_bytes, 1152u);
  EXPECT_EQ(find_buffer_kind("indexer_k")->row_bytes, 132u);
  EXPECT_TRUE(find_buffer_kind("indexer_k")->full_layers_only);
  EXPECT_FALSE(find_buffer_kind("kv_fp8")->full_layers_only);
  EXPECT_FALSE(find_buffer_kind("kv_fp16").has_value());
}

TEST(ModelLayout, PrefixLengthNotAMultipleOfPageSizeIsRefusedNamingPrefixLen) {
  // The prefix cache matches whole pages; a ragged prefix would misplace every later slot.
  Batch b = tiny_batch();
  b.requests[0].prefix_len = 7;
  expect_refused(validate(tiny_setting(), b), "prefix_len");
  b.requests[0].prefix_len = -4;
  expect_refused(validate(tiny_setting(), b), "prefix_len");
}

TEST(ModelLayout, PrefixPageCountOtherThanPrefixLenOverPageSizeIsRefused) {
  Batch b = tiny_batch();
  b.requests[0].prefix_pages = {5};
  expect_refused(validate(tiny_setting(), b), "prefix_pages");
  b.requests[0].prefix_pages = {5, 2, 3};
  expect_refused(validate(tiny_setting(), b), "prefix_pages");
  b = tiny_batch();
  b.requests[1].prefix_pages = {1};  // prefix_len 0 but one page
  expect_refused(validate(tiny_setting(), b), "prefix_pages");
}

TEST(ModelLayout, PrefixPageIdOutsideThePoolIsRefused) {
  Batch b = tiny_batch();
  b.requests[0].prefix_pages = {16, 2};  // pool_pages is 16: ids 0..15
  expect_refused(validate(tiny_setting(), b), "prefix_pages");
  b.requests[0].prefix_pages = {5, -1};
  expect_refused(validate(tiny_setting(), b), "prefix_pages");
  b.requests[0].prefix_pages = {15, 0};
  EXPECT_FALSE(validate(tiny_setting(), b).has_value());
}

TEST(ModelLayout, ExtendLengthBelowOneIsRefusedNamingExtendLen) {
  Batch b = tiny_batch();
  b.requests[1].extend_len = 0;
  expect_refused(validate(tiny_setting(), b), "extend_len");
  b.requests[1].extend_len = -5;
  expect_refused(validate(tiny_setting(), b), "extend_len");
}

}  // namespace
}  // namespace cpkv::model

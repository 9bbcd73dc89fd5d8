// A batch and its batch-logical layout: current pages, their writers, slots in merged-span order
// (PROTOCOL.md sections 2 and 3). Every rank computes the same layout with no communication.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "cpkv/model/setting.hpp"

namespace cpkv::model {

struct Request {
  std::int64_t prefix_len = 0;            // tokens, a multiple of P
  std::int64_t extend_len = 1;            // tokens computed in this batch, >= 1
  std::vector<std::int64_t> prefix_pages; // logical page ids, prefix_len / P of them
};

struct Batch {
  std::vector<Request> requests;
};

std::optional<Problem> validate(const Setting& setting, const Batch& batch);

// Current pages of one request: ceil(extend_len / P).
std::int64_t current_page_count(std::int64_t extend_len, std::int32_t page_size);

// The writer of page `page_in_request` among `page_count` current pages of one request, under the
// zigzag or contiguous policy. round_robin needs the batch current index: see writer_of().
std::int32_t writer_in_request(SplitPolicy policy, std::int64_t page_in_request,
                               std::int64_t page_count, std::int32_t cp);

// The writer of a current page under any page policy (not a token split: see below).
std::int32_t writer_of(SplitPolicy policy, std::int64_t page_in_request, std::int64_t page_count,
                       std::int64_t current_index, std::int32_t cp);

// The page writer on a trace of a token split (setting.hpp): the rank that computes the page's first
// token under that split (model::token_owner), for the variants that need one writer per page.
std::int32_t page_writer_of_token_split(SplitPolicy policy, std::int64_t page_in_request, std::int64_t extend_len,
                                        std::int32_t page_size, std::int32_t cp);

// One current page of the batch, by its current index.
struct CurrentPage {
  std::int32_t request = 0;
  std::int32_t writer = 0;
  std::int64_t page_in_request = 0;  // 0..C_r-1
  std::int64_t slot = 0;             // its slot in the dense buffer
  std::int32_t rows_valid = 0;       // 1..P; rows past it are zero (partial last page)
};

enum class SlotKind : std::uint8_t { prefix, current };

// What one dense slot holds.
struct Slot {
  SlotKind kind = SlotKind::prefix;
  std::int32_t request = 0;
  // prefix: the logical page id; current: the current index.
  std::int64_t page_or_index = 0;
};

// The batch-logical layout. Built once per batch; every rank builds the same one.
struct BatchLayout {
  std::int32_t cp = 1;
  std::int32_t page_size = 1;
  std::int64_t slot_count = 0;
  std::int64_t current_pages_total = 0;
  std::vector<std::int64_t> request_first_slot;           // prefix span begins here
  std::vector<std::int64_t> request_first_current_slot;   // current span begins here
  std::vector<std::int64_t> request_first_current_index;  // first current index of the request
  std::vector<Slot> slots;                                // by slot
  std::vector<CurrentPage> current;                       // by current index
};

BatchLayout layout_batch(const Setting& setting, const Batch& batch);

// The sequence token that row `row` of slot `slot` holds, or nullopt for a zero row (a row past
// the end of a partial current page).
struct RowSource {
  SlotKind kind;
  std::int32_t request;
  std::int64_t token;         // position in the request's sequence (prefix then extend)
  std::int64_t logical_page;  // prefix rows: the pool page; current rows: -1
  std::int32_t row_in_page;
};
std::optional<RowSource> row_source(const BatchLayout& layout, std::int64_t slot, std::int32_t row);

}  // namespace cpkv::model

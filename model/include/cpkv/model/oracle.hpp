// A second, deliberately plain oracle written straight from PROTOCOL.md sections 2, 3 and 8.
//
// Why a second one: the byte check used to take its expected bytes from BatchLayout, the very
// structure that drives the gather, so a layout bug that is self-consistent (requests laid out in
// reverse order, say) produced gathers and expectations that agreed. This oracle walks the batch's
// requests alone (request order, prefix page ids, extend lengths) and never calls layout_batch, the
// plans or the page inverses. It shares only the content hash of section 8 (content.hpp), which is
// the definition of what a row holds, and the Mismatch record (expected.hpp), which is only the
// report format. It was written from the specification and the public headers, without reading
// model/src/batch.cpp or model/src/expected.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "cpkv/model/batch.hpp"
#include "cpkv/model/expected.hpp"
#include "cpkv/model/setting.hpp"

namespace cpkv::model::spec {

// What slot `s` of every rank's dense buffer holds (section 3: merged-span order).
struct DenseSlot {
  std::int32_t request = 0;        // position of the request in the batch
  bool prefix = false;
  std::int64_t logical_page = -1;  // prefix: page_table[r][k]; current: -1
  std::int64_t first_token = 0;    // sequence position of the slot's row 0 (prefix first, then extend)
  std::int32_t rows_valid = 0;     // rows holding a token; rows past it are zero (partial last page)
  std::int64_t current_index = -1; // current: index among all current pages of the batch; prefix: -1
};

// The dense buffer every rank must hold for one batch, slot by slot.
class ByteOracle {
 public:
  ByteOracle(std::int32_t page_size, const Batch& batch);

  std::int64_t slot_count() const { return static_cast<std::int64_t>(slots_.size()); }
  std::int64_t current_pages_total() const { return current_pages_total_; }
  std::int32_t page_size() const { return page_size_; }
  const DenseSlot& slot(std::int64_t s) const { return slots_[static_cast<std::size_t>(s)]; }

  // Fills `out` (row_bytes long) with what row `row` of slot `slot` must hold on `layer` for `kind`.
  void row(std::uint64_t seed, std::int32_t layer, std::uint32_t kind, std::int64_t slot, std::int32_t row,
           std::span<std::uint8_t> out) const;

  // Compares a whole dense buffer (slot_count * P rows of row_bytes) row by row; the first wrong
  // byte, located, and the count of wrong bytes, or nullopt when every byte is right.
  std::optional<Mismatch> check(std::span<const std::uint8_t> dense, std::uint64_t seed, std::int32_t layer,
                                std::uint32_t kind, std::uint32_t row_bytes) const;

 private:
  std::int32_t page_size_ = 1;
  std::int64_t current_pages_total_ = 0;
  std::vector<DenseSlot> slots_;
};

// Section 2, written out with loops over the blocks: the writer of current page `page` (0..C-1) of a
// request with `pages` current pages, whose batch current index is `current_index`.
std::int32_t writer(SplitPolicy policy, std::int64_t page, std::int64_t pages, std::int64_t current_index, std::int32_t cp);

// Section 4: staging_slots from the two admission caps, ceil(tokens / P) + requests.
std::int64_t staging_slots_from_caps(std::int64_t max_total_extend_tokens, std::int64_t max_batch_requests, std::int32_t page_size);

}  // namespace cpkv::model::spec

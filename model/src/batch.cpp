#include "cpkv/model/batch.hpp"

#include "cpkv/model/assert.hpp"
#include "cpkv/model/plan.hpp"

#include <fmt/format.h>

namespace cpkv::model {

std::optional<Problem> validate(const Setting& setting, const Batch& batch) {
  if (batch.requests.empty()) return Problem{"requests", "a batch needs at least one request"};
  if (static_cast<std::int64_t>(batch.requests.size()) > limits::batch_requests_max) {
    return Problem{"requests", fmt::format("{} requests exceed the limit {}", batch.requests.size(), limits::batch_requests_max)};
  }
  for (std::size_t r = 0; r < batch.requests.size(); ++r) {
    const Request& req = batch.requests[r];
    const auto field = [r](std::string_view name) { return fmt::format("requests[{}].{}", r, name); };
    if (req.prefix_len < 0) return Problem{field("prefix_len"), fmt::format("{} is negative", req.prefix_len)};
    if (req.prefix_len % setting.page_size != 0) {
      return Problem{field("prefix_len"), fmt::format("{} is not a multiple of page_size {}", req.prefix_len, setting.page_size)};
    }
    if (req.extend_len < 1) return Problem{field("extend_len"), fmt::format("{} is less than 1", req.extend_len)};
    if (req.prefix_len + req.extend_len > limits::request_tokens_max) {
      return Problem{field("extend_len"), fmt::format("prefix_len + extend_len = {} exceeds the limit {}", req.prefix_len + req.extend_len, limits::request_tokens_max)};
    }
    const std::int64_t pages_expected = req.prefix_len / setting.page_size;
    if (static_cast<std::int64_t>(req.prefix_pages.size()) != pages_expected) {
      return Problem{field("prefix_pages"), fmt::format("{} page ids for prefix_len {} (expected {})", req.prefix_pages.size(), req.prefix_len, pages_expected)};
    }
    for (std::size_t k = 0; k < req.prefix_pages.size(); ++k) {
      const std::int64_t page = req.prefix_pages[k];
      if (page < 0 || page >= setting.pool_pages) {
        return Problem{fmt::format("requests[{}].prefix_pages[{}]", r, k), fmt::format("page id {} is outside the pool [0, {})", page, setting.pool_pages)};
      }
    }
  }
  return std::nullopt;
}

std::int64_t current_page_count(std::int64_t extend_len, std::int32_t page_size) {
  return (extend_len + page_size - 1) / page_size;
}

std::int32_t writer_in_request(SplitPolicy policy, std::int64_t page, std::int64_t count, std::int32_t cp) {
  CPKV_ASSERT(page >= 0);
  CPKV_ASSERT(page < count);
  CPKV_ASSERT(cp >= 1);
  if (policy == SplitPolicy::contiguous) {
    // Rank k owns [count*k/cp, count*(k+1)/cp): the largest k whose range starts at or before `page`.
    return static_cast<std::int32_t>(((page + 1) * cp - 1) / count);
  }
  CPKV_ASSERT(policy == SplitPolicy::zigzag);
  // 2*cp blocks: the first `count % (2cp)` hold one page more than the rest.
  const std::int64_t blocks = 2 * std::int64_t{cp};
  const std::int64_t small = count / blocks;
  const std::int64_t big_blocks = count % blocks;
  const std::int64_t big_pages = big_blocks * (small + 1);
  const std::int64_t block = page < big_pages ? page / (small + 1) : big_blocks + (page - big_pages) / small;
  CPKV_ASSERT(block < blocks);
  return static_cast<std::int32_t>(block < cp ? block : blocks - 1 - block);
}

std::int32_t writer_of(SplitPolicy policy, std::int64_t page, std::int64_t count, std::int64_t current_index, std::int32_t cp) {
  CPKV_ASSERT(!is_token_split(policy));
  if (policy == SplitPolicy::round_robin) return static_cast<std::int32_t>(current_index % cp);
  return writer_in_request(policy, page, count, cp);
}

// Here, beside the block rule it uses, not in plan.cpp: the trace readers (and the fuzz build,
// which links no plan) need it for a token-split trace's page writers.
std::int32_t token_owner(TokenSplit split, std::int64_t token, std::int64_t extend_len, std::int32_t cp) {
  CPKV_ASSERT(token >= 0 && token < extend_len);
  if (split == TokenSplit::continuous) return static_cast<std::int32_t>(token % cp);
  CPKV_ASSERT(split == TokenSplit::zigzag);
  return writer_in_request(SplitPolicy::zigzag, token, extend_len, cp);
}

std::int32_t page_writer_of_token_split(SplitPolicy policy, std::int64_t page, std::int64_t extend_len, std::int32_t page_size,
                                        std::int32_t cp) {
  CPKV_ASSERT(is_token_split(policy));
  return token_owner(policy == SplitPolicy::zigzag_tokens ? TokenSplit::zigzag : TokenSplit::continuous, page * page_size, extend_len, cp);
}

BatchLayout layout_batch(const Setting& setting, const Batch& batch) {
  BatchLayout layout;
  layout.cp = setting.cp;
  layout.page_size = setting.page_size;
  const std::size_t bs = batch.requests.size();
  layout.request_first_slot.resize(bs);
  layout.request_first_current_slot.resize(bs);
  layout.request_first_current_index.resize(bs);
  std::int64_t slots_total = 0;
  std::int64_t current_total = 0;
  for (const Request& req : batch.requests) {
    const std::int64_t current = current_page_count(req.extend_len, setting.page_size);
    slots_total += req.prefix_len / setting.page_size + current;
    current_total += current;
  }
  layout.slots.reserve(slots_total);
  layout.current.reserve(current_total);
  std::int64_t slot = 0;
  for (std::size_t r = 0; r < bs; ++r) {
    const Request& req = batch.requests[r];
    const auto request = static_cast<std::int32_t>(r);
    layout.request_first_slot[r] = slot;
    for (std::int64_t page : req.prefix_pages) {
      layout.slots.push_back({SlotKind::prefix, request, page});
      ++slot;
    }
    layout.request_first_current_slot[r] = slot;
    layout.request_first_current_index[r] = static_cast<std::int64_t>(layout.current.size());
    const std::int64_t count = current_page_count(req.extend_len, setting.page_size);
    const auto first_index = static_cast<std::int64_t>(layout.current.size());
    for (std::int64_t j = 0; j < count; ++j) {
      const std::int64_t index = first_index + j;
      const std::int64_t rows_left = req.extend_len - j * setting.page_size;
      CurrentPage page;
      page.request = request;
      // Zigzag writers are assigned block by block below (no divisions per page).
      page.writer = setting.split == SplitPolicy::zigzag    ? 0
                    : is_token_split(setting.split) ? page_writer_of_token_split(setting.split, j, req.extend_len, setting.page_size, setting.cp)
                                                    : writer_of(setting.split, j, count, index, setting.cp);
      page.page_in_request = j;
      page.slot = slot;
      page.rows_valid = static_cast<std::int32_t>(rows_left < setting.page_size ? rows_left : setting.page_size);
      layout.current.push_back(page);
      layout.slots.push_back({SlotKind::current, request, index});
      ++slot;
    }
    if (setting.split == SplitPolicy::zigzag && count > 0) {
      // Same assignment as writer_in_request(zigzag, ...): 2*cp blocks in page order, the first
      // `count % (2cp)` one page longer; block b belongs to rank b (b < cp) or 2cp-1-b.
      const std::int64_t blocks = 2 * std::int64_t{setting.cp};
      const std::int64_t small = count / blocks;
      const std::int64_t big_blocks = count % blocks;
      CurrentPage* out = layout.current.data() + first_index;
      for (std::int64_t b = 0; b < blocks; ++b) {
        const std::int64_t len = b < big_blocks ? small + 1 : small;
        const auto writer = static_cast<std::int32_t>(b < setting.cp ? b : blocks - 1 - b);
        for (std::int64_t k = 0; k < len; ++k) (out++)->writer = writer;
      }
      CPKV_ASSERT(out == layout.current.data() + first_index + count);
    }
  }
  layout.slot_count = slot;
  layout.current_pages_total = static_cast<std::int64_t>(layout.current.size());
  return layout;
}

std::optional<RowSource> row_source(const BatchLayout& layout, std::int64_t slot, std::int32_t row) {
  CPKV_ASSERT(slot >= 0 && slot < layout.slot_count);
  CPKV_ASSERT(row >= 0 && row < layout.page_size);
  const Slot& s = layout.slots[slot];
  if (s.kind == SlotKind::prefix) {
    const std::int64_t token = (slot - layout.request_first_slot[s.request]) * layout.page_size + row;
    return RowSource{SlotKind::prefix, s.request, token, s.page_or_index, row};
  }
  const CurrentPage& page = layout.current[s.page_or_index];
  if (row >= page.rows_valid) return std::nullopt;
  const std::int64_t prefix_tokens = (layout.request_first_current_slot[s.request] - layout.request_first_slot[s.request]) * layout.page_size;
  const std::int64_t token = prefix_tokens + page.page_in_request * layout.page_size + row;
  return RowSource{SlotKind::current, s.request, token, -1, row};
}

}  // namespace cpkv::model

#include "cpkv/model/plan.hpp"

#include <algorithm>
#include <bit>
#include "cpkv/model/assert.hpp"
#include <cstddef>
#include <iterator>
#include <string>

namespace cpkv::model {

std::optional<Variant> parse_variant(std::string_view text) {
  for (const VariantInfo& row : kVariantTable) {
    if (row.name == text) return row.variant;
  }
  return std::nullopt;
}

std::string_view variant_names() {
  static const std::string names = [] {
    std::string joined;
    for (const VariantInfo& row : kVariantTable) joined += (joined.empty() ? "" : ", ") + std::string(row.name);
    return joined;
  }();
  return names;
}

namespace {

SlotDescriptor pool_descriptor(std::int64_t logical_page, std::int32_t cp) {
  // Power-of-two cp (the common case) with a non-negative page: mask and shift instead of two
  // 64-bit divisions; identical results.
  if (logical_page >= 0 && cp > 0 && (cp & (cp - 1)) == 0) {
    const int shift = std::countr_zero(static_cast<std::uint32_t>(cp));
    return {static_cast<std::int32_t>(logical_page & (cp - 1)), logical_page >> shift};
  }
  return {static_cast<std::int32_t>(logical_page % cp), logical_page / cp};
}

// Prefix slots from the pool; current slots get `current_fill`.
std::vector<SlotDescriptor> prefix_gather(const BatchLayout& layout, std::int32_t current_fill) {
  std::vector<SlotDescriptor> plan(layout.slot_count);
  for (std::int64_t s = 0; s < layout.slot_count; ++s) {
    const Slot& slot = layout.slots[s];
    plan[s] = slot.kind == SlotKind::prefix ? pool_descriptor(slot.page_or_index, layout.cp)
                                            : SlotDescriptor{current_fill, 0};
  }
  return plan;
}

// Current slots written by peers, read from (cp + writer, page) where `page` is the slot
// (same_slot) or the current index; every other slot is skipped.
std::vector<SlotDescriptor> peer_current_gather(const BatchLayout& layout, std::int32_t rank, bool same_slot) {
  std::vector<SlotDescriptor> plan(layout.slot_count);
  for (std::int64_t i = 0; i < layout.current_pages_total; ++i) {
    const CurrentPage& page = layout.current[i];
    if (page.writer == rank) continue;
    plan[page.slot] = {layout.cp + page.writer, same_slot ? page.slot : i};
  }
  return plan;
}

// Forward iterators over consecutive tokens / rows of one page, for vector range inserts (which
// size once and copy-construct in place).
struct RowCounter {
  using iterator_category = std::forward_iterator_tag;
  using value_type = std::int64_t;
  using difference_type = std::ptrdiff_t;
  using pointer = const std::int64_t*;
  using reference = std::int64_t;
  std::int64_t row = 0;
  std::int64_t operator*() const { return row; }
  RowCounter& operator++() { ++row; return *this; }
  RowCounter operator++(int) { RowCounter old = *this; ++row; return old; }
  friend bool operator==(const RowCounter&, const RowCounter&) = default;
  friend difference_type operator-(const RowCounter& a, const RowCounter& b) { return a.row - b.row; }
};
struct TokenCounter {
  using iterator_category = std::forward_iterator_tag;
  using value_type = LocalToken;
  using difference_type = std::ptrdiff_t;
  using pointer = const LocalToken*;
  using reference = LocalToken;
  std::int32_t request = 0;
  std::int64_t token = 0;
  LocalToken operator*() const { return {request, token}; }
  TokenCounter& operator++() { ++token; return *this; }
  TokenCounter operator++(int) { TokenCounter old = *this; ++token; return old; }
  friend bool operator==(const TokenCounter&, const TokenCounter&) = default;
};

std::vector<std::int64_t> owned_prefix_slots(const BatchLayout& layout, std::int32_t rank) {
  std::vector<std::int64_t> slots;
  for (std::int64_t s = 0; s < layout.slot_count; ++s) {
    const Slot& slot = layout.slots[s];
    if (slot.kind == SlotKind::prefix && slot.page_or_index % layout.cp == rank) slots.push_back(s);
  }
  return slots;
}

}  // namespace

std::vector<SlotDescriptor> staging_direct_plan(const BatchLayout& layout) {
  std::vector<SlotDescriptor> plan(layout.slot_count);
  for (std::int64_t s = 0; s < layout.slot_count; ++s) {
    const Slot& slot = layout.slots[s];
    if (slot.kind == SlotKind::prefix) {
      plan[s] = pool_descriptor(slot.page_or_index, layout.cp);
    } else {
      plan[s] = {layout.cp + layout.current[slot.page_or_index].writer, slot.page_or_index};
    }
  }
  return plan;
}

namespace plans {

void span_allreduce(const BatchLayout& layout, std::int32_t rank, VariantPlan& plan) {
  plan.zero_dense = true;
  plan.local_prefix_slots = owned_prefix_slots(layout, rank);
  // One all-reduce per span, empty spans included: every rank must issue the same collectives.
  const std::size_t bs = layout.request_first_slot.size();
  for (std::size_t r = 0; r < bs; ++r) {
    const std::int64_t end = r + 1 < bs ? layout.request_first_slot[r + 1] : layout.slot_count;
    plan.allreduce_ranges.push_back({layout.request_first_slot[r], layout.request_first_current_slot[r]});
    plan.allreduce_ranges.push_back({layout.request_first_current_slot[r], end});
  }
}

void dense_allreduce(const BatchLayout& layout, std::int32_t rank, VariantPlan& plan) {
  plan.zero_dense = true;
  plan.local_prefix_slots = owned_prefix_slots(layout, rank);
  plan.allreduce_ranges.push_back({0, layout.slot_count});
}

void compact_allreduce(const BatchLayout& layout, std::int32_t /*rank*/, VariantPlan& plan) {
  plan.zero_own_current = true;
  plan.gather1 = prefix_gather(layout, SlotDescriptor::kZeroFill);
  plan.compact_allreduce = true;
  plan.compact_pages = layout.current_pages_total;
}

void symmetric_dense(const BatchLayout& layout, std::int32_t rank, VariantPlan& plan) {
  plan.zero_own_current = true;
  plan.gather1 = prefix_gather(layout, SlotDescriptor::kSkip);
  plan.barrier = true;
  plan.gather2 = peer_current_gather(layout, rank, /*same_slot=*/true);
}

void staging_publish(const BatchLayout& layout, std::int32_t rank, VariantPlan& plan) {
  plan.zero_own_current = true;
  plan.gather1 = prefix_gather(layout, SlotDescriptor::kSkip);
  plan.publish = true;
  plan.barrier = true;
  plan.gather2 = peer_current_gather(layout, rank, /*same_slot=*/false);
}

void staging_direct(const BatchLayout& layout, std::int32_t /*rank*/, VariantPlan& plan) {
  plan.zero_own_current = true;
  plan.fill_to_staging = true;
  plan.barrier = true;
  plan.gather2 = staging_direct_plan(layout);  // after the barrier: it reads peers' staging
}

}  // namespace plans

namespace {

// Section 12: the prefix from the pool; every token row by its owner into the all-gather, padded to
// the largest rank's count, then re-ordered into the dense current slots. Pages are walked by
// current index and each request's extend is summed from its pages, so nothing assumes the requests'
// spans follow one another (a layout bug must reach the checkers, not an assertion).
void token_allgather(const BatchLayout& layout, std::int32_t rank, TokenSplit split, VariantPlan& plan) {
  CPKV_ASSERT(split != TokenSplit::none);
  const std::int64_t page_size = layout.page_size;
  plan.token_split = split;
  plan.gather1 = prefix_gather(layout, SlotDescriptor::kSkip);
  plan.reorder_source.assign(static_cast<std::size_t>(layout.current_pages_total * page_size), -1);
  std::vector<std::int64_t> extend(layout.request_first_slot.size(), 0);
  for (const CurrentPage& page : layout.current) extend[page.request] += page.rows_valid;
  std::vector<std::int32_t> owner(plan.reorder_source.size(), -1);
  std::vector<std::int64_t> rank_rows(layout.cp, 0);
  for (std::int64_t i = 0; i < layout.current_pages_total; ++i) {
    const CurrentPage& page = layout.current[i];
    for (std::int64_t row = 0; row < page.rows_valid; ++row) {
      const std::int32_t k = token_owner(split, page.page_in_request * page_size + row, extend[page.request], layout.cp);
      owner[i * page_size + row] = k;
      plan.reorder_source[i * page_size + row] = rank_rows[k]++;  // its position among rank k's rows
    }
  }
  plan.allgather_rank_rows = *std::max_element(rank_rows.begin(), rank_rows.end());
  plan.own_current.clear();
  for (std::size_t row = 0; row < owner.size(); ++row) {
    if (owner[row] < 0) continue;
    plan.reorder_source[row] += owner[row] * plan.allgather_rank_rows;
    const auto index = static_cast<std::int64_t>(row) / page_size;
    if (owner[row] == rank && (plan.own_current.empty() || plan.own_current.back() != index)) plan.own_current.push_back(index);
  }
}

}  // namespace

namespace plans {

void allgather_zigzag(const BatchLayout& layout, std::int32_t rank, VariantPlan& plan) {
  token_allgather(layout, rank, TokenSplit::zigzag, plan);
}

void allgather_continuous(const BatchLayout& layout, std::int32_t rank, VariantPlan& plan) {
  token_allgather(layout, rank, TokenSplit::continuous, plan);
}

}  // namespace plans

VariantPlan variant_plan(const BatchLayout& layout, Variant variant, std::int32_t rank) {
  CPKV_ASSERT(rank >= 0 && rank < layout.cp);
  VariantPlan plan;
  plan.variant = variant;
  plan.rank = rank;
  for (std::int64_t i = 0; i < layout.current_pages_total; ++i) {
    if (layout.current[i].writer == rank) plan.own_current.push_back(i);
  }
  info(variant).plan(layout, rank, plan);
  return plan;
}

PageInverse page_inverse(const BatchLayout& layout, const Batch& batch, std::int32_t rank, InverseTarget target) {
  PageInverse inverse;
  std::size_t rows = 0;
  for (const CurrentPage& page : layout.current) rows += page.writer == rank ? static_cast<std::size_t>(page.rows_valid) : 0;
  inverse.tokens.reserve(rows);
  inverse.dest_row.reserve(rows);
  // One range insert per page: no per-row capacity checks and no zero-initialization pass.
  const std::int64_t page_size = layout.page_size;
  for (std::int64_t i = 0; i < layout.current_pages_total; ++i) {
    const CurrentPage& page = layout.current[i];
    if (page.writer != rank) continue;
    const std::int64_t first_token = batch.requests[page.request].prefix_len + page.page_in_request * page_size;
    const std::int64_t first_row = (target == InverseTarget::dense ? page.slot : i) * page_size;
    inverse.tokens.insert(inverse.tokens.end(), TokenCounter{page.request, first_token},
                          TokenCounter{page.request, first_token + page.rows_valid});
    inverse.dest_row.insert(inverse.dest_row.end(), RowCounter{first_row}, RowCounter{first_row + page.rows_valid});
  }
  return inverse;
}

RaggedIndexPlan ragged_index_plan(const BatchLayout& layout, const Batch& batch, std::int32_t rank) {
  RaggedIndexPlan plan;
  plan.rank = rank;
  const CurrentPage* previous = nullptr;
  for (const CurrentPage& page : layout.current) {
    if (page.writer != rank) {
      previous = nullptr;
      continue;
    }
    const bool continues = previous != nullptr && previous->request == page.request &&
                           previous->page_in_request + 1 == page.page_in_request;
    if (!continues) {
      RaggedSegment segment;
      segment.request = page.request;
      segment.q_start = plan.q_tokens_total;
      segment.q_base = page.page_in_request * layout.page_size;
      segment.k_base = layout.request_first_slot[page.request] * layout.page_size;
      segment.current_base = layout.request_first_current_slot[page.request] * layout.page_size;
      plan.segments.push_back(segment);
    }
    RaggedSegment& segment = plan.segments.back();
    segment.q_len += page.rows_valid;
    segment.kv_len = batch.requests[page.request].prefix_len + segment.q_base + segment.q_len;
    plan.q_tokens_total += page.rows_valid;
    previous = &page;
  }
  return plan;
}

RaggedIndexPlan variant_index_plan(const BatchLayout& layout, const Batch& batch, const VariantPlan& plan) {
  return plan.token_split != TokenSplit::none ? token_split_index_plan(layout, batch, plan) : ragged_index_plan(layout, batch, plan.rank);
}

RaggedIndexPlan token_split_index_plan(const BatchLayout& layout, const Batch& batch, const VariantPlan& variant_plan) {
  CPKV_ASSERT(variant_plan.token_split != TokenSplit::none);
  CPKV_ASSERT(variant_plan.allgather_rank_rows > 0);
  RaggedIndexPlan plan;
  plan.rank = variant_plan.rank;
  const std::int64_t page_size = layout.page_size;
  for (std::size_t r = 0; r < batch.requests.size(); ++r) {
    const std::int64_t first_row = layout.request_first_current_index[r] * page_size;
    bool continues = false;
    for (std::int64_t t = 0; t < batch.requests[r].extend_len; ++t) {
      // A plan of another batch (a stale cache, a planted bug) may be shorter: such a row is no query here.
      const auto index = static_cast<std::size_t>(first_row + t);
      const std::int64_t source = index < variant_plan.reorder_source.size() ? variant_plan.reorder_source[index] : -1;
      if (source < 0) {
        continues = false;
        continue;
      }
      if (source / variant_plan.allgather_rank_rows != variant_plan.rank) {
        continues = false;
        continue;
      }
      if (!continues) {
        RaggedSegment segment;
        segment.request = static_cast<std::int32_t>(r);
        segment.q_start = plan.q_tokens_total;
        segment.q_base = t;
        segment.k_base = layout.request_first_slot[r] * page_size;
        segment.current_base = layout.request_first_current_slot[r] * page_size;
        plan.segments.push_back(segment);
      }
      RaggedSegment& segment = plan.segments.back();
      ++segment.q_len;
      segment.kv_len = batch.requests[r].prefix_len + segment.q_base + segment.q_len;
      ++plan.q_tokens_total;
      continues = true;
    }
  }
  return plan;
}

std::uint64_t LayerBytes::pulled_from_peers() const {
  std::uint64_t sum = 0;
  for (std::size_t p = 0; p < pulled_from.size(); ++p) sum += pulled_from[p];
  return sum - (own_rank >= 0 ? pulled_from[own_rank] : 0);
}

LayerBytes layer_bytes(const Setting& setting, const VariantPlan& plan, std::int32_t layer) {
  const std::int32_t cp = setting.cp;
  LayerBytes bytes;
  bytes.own_rank = plan.rank;
  bytes.pulled_from.assign(cp, 0);
  const std::int32_t kinds_active = setting.kinds_on_layer(layer);
  const std::uint64_t page_bytes = setting.row_bytes_on_layer(layer) * static_cast<std::uint32_t>(setting.page_size);
  for (const auto* gather : {&plan.gather1, &plan.gather2}) {
    if (gather->empty()) continue;
    bytes.gathers += kinds_active;
    for (const SlotDescriptor& d : *gather) {
      if (d.table_index >= 0) bytes.pulled_from[d.table_index % cp] += page_bytes;
    }
  }
  std::uint64_t allreduce_pages = 0;
  for (const SlotRange& range : plan.allreduce_ranges) allreduce_pages += range.slot_end - range.slot_begin;
  // The compact buffer holds every current page of the batch: every peer's plus this rank's.
  const auto compact_pages = static_cast<std::uint64_t>(plan.compact_pages);
  allreduce_pages += compact_pages;
  bytes.allreduces = plan.allreduce_count() * kinds_active;
  bytes.allreduce_bytes = allreduce_pages * page_bytes;
  if (cp > 1) bytes.pulled_from[(plan.rank + cp - 1) % cp] += 2 * (cp - 1) * bytes.allreduce_bytes / cp;
  bytes.barriers = plan.barrier ? 1 : 0;
  const std::uint64_t own_pages = plan.own_current.size();
  bytes.local_copy_bytes = plan.local_prefix_slots.size() * page_bytes;
  if (plan.publish) bytes.local_copy_bytes += own_pages * page_bytes;
  if (plan.compact_allreduce) bytes.local_copy_bytes += (own_pages + compact_pages) * page_bytes;
  if (plan.token_split != TokenSplit::none) {
    // One all-gather per kind of every rank's padded rows, then the re-ordering writes every current
    // page of the dense buffer from the gathered rows (a local copy, zero tails included).
    const std::uint64_t rows = static_cast<std::uint64_t>(cp) * static_cast<std::uint64_t>(plan.allgather_rank_rows);
    bytes.allgathers = kinds_active;
    bytes.allgather_bytes = rows * setting.row_bytes_on_layer(layer);
    if (cp > 1) bytes.pulled_from[(plan.rank + cp - 1) % cp] += (cp - 1) * bytes.allgather_bytes / cp;
    bytes.local_copy_bytes += plan.reorder_source.size() / static_cast<std::uint64_t>(setting.page_size) * page_bytes;
  }
  return bytes;
}

std::vector<std::vector<std::uint64_t>> batch_bytes_pulled(const Setting& setting, const BatchLayout& layout, Variant variant) {
  std::vector<std::vector<std::uint64_t>> matrix(setting.cp, std::vector<std::uint64_t>(setting.cp, 0));
  for (std::int32_t rank = 0; rank < setting.cp; ++rank) {
    const VariantPlan plan = variant_plan(layout, variant, rank);
    for (std::int32_t layer = 0; layer < setting.layer_count(); ++layer) {
      const LayerBytes bytes = layer_bytes(setting, plan, layer);
      for (std::int32_t from = 0; from < setting.cp; ++from) matrix[rank][from] += bytes.pulled_from[from];
    }
  }
  return matrix;
}

}  // namespace cpkv::model

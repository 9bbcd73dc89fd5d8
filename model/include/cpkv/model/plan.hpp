// Per-batch plans: the compose plan of every variant (PROTOCOL.md sections 5 and 7), the page
// inverses that steer the fill, the ragged index plan of the indexer, and the bytes each rank pulls.
// Everything here depends only on the batch and the rank, never on buffer addresses: build once per
// batch, reuse on every layer.
#pragma once

#include <cstdint>
#include <vector>

#include "cpkv/model/batch.hpp"
#include "cpkv/model/setting.hpp"
#include "cpkv/model/variants.hpp"

namespace cpkv::model {


// One dense slot's source in a slot-dense gather over the 2*cp pointer table: entries 0..cp-1 are
// the pool bases of ranks 0..cp-1, entries cp..2cp-1 the staging (or symmetric dense) bases.
// table_index == kZeroFill (-1) means "write zeros" (v2's sentinel); kSkip means "leave as is".
struct SlotDescriptor {
  static constexpr std::int32_t kZeroFill = -1;
  static constexpr std::int32_t kSkip = -2;
  std::int32_t table_index = kSkip;
  std::int64_t source_page = 0;
  friend bool operator==(const SlotDescriptor&, const SlotDescriptor&) = default;
};

// The staging_direct compose plan: one descriptor per dense slot (prefix: (g % cp, g / cp);
// current index i of writer w: (cp + w, i) in half l % 2). Identical on every rank and layer.
std::vector<SlotDescriptor> staging_direct_plan(const BatchLayout& layout);

// A contiguous range of dense slots [slot_begin, slot_end) reduced by one sum all-reduce.
struct SlotRange {
  std::int64_t slot_begin = 0;
  std::int64_t slot_end = 0;
  friend bool operator==(const SlotRange&, const SlotRange&) = default;
};

// What one rank does per layer and buffer kind under one variant, as data. The steps run in this
// order: zero_dense, local prefix materialize, zero_own_current, fill, compact pack, gather1,
// publish, barrier, gather2, all-reduces, compact unpack; a token-split variant (section 12): gather1
// (the prefix), the fill of its token rows into its all-gather send rows, the all-gather, the
// re-ordering into the dense current slots.
struct VariantPlan {
  Variant variant = Variant::staging_direct;
  std::int32_t rank = 0;
  bool zero_dense = false;                       // zero every dense slot first (AR variants)
  std::vector<std::int64_t> local_prefix_slots;  // prefix slots this rank copies from its own pool
  bool zero_own_current = false;                 // zero the pages the fill writes (partial pages keep zero tails)
  bool fill_to_staging = false;                  // fill through the staging-remapped inverse
  std::vector<std::int64_t> own_current;         // current indices this rank writes
  std::vector<SlotDescriptor> gather1;           // per dense slot (empty: no gather)
  bool barrier = false;                          // counting barrier after gather1/publish
  std::vector<SlotDescriptor> gather2;           // per dense slot (empty: no gather)
  std::vector<SlotRange> allreduce_ranges;       // sum all-reduces over dense slot ranges
  bool compact_allreduce = false;                // v2: pack own pages, one AR over all current pages
  std::int64_t compact_pages = 0;                // v2: pages of the compact buffer (current_pages_total)
  bool publish = false;                          // staging_publish: copy own current pages dense -> staging
  // Section 12's token-split variants. own_current then holds the current pages with at least one
  // of this rank's tokens (a page can have several writers). Every rank sends allgather_rank_rows
  // rows (the largest rank's token count: the others pad) of its tokens in its query order
  // (request by request, ascending); reorder_source gives every current row of the batch (current
  // index * P + row) the gathered row it is copied from (owner * allgather_rank_rows + the token's
  // position among its owner's), or -1 for a row past the end of a partial page (written zero).
  TokenSplit token_split = TokenSplit::none;
  std::int64_t allgather_rank_rows = 0;
  std::vector<std::int64_t> reorder_source;
  std::int32_t allreduce_count() const {
    return static_cast<std::int32_t>(allreduce_ranges.size()) + (compact_allreduce ? 1 : 0);
  }
};

VariantPlan variant_plan(const BatchLayout& layout, Variant variant, std::int32_t rank);

// The rank that computes token `token` (0..extend_len-1) of a request under a token split (section
// 12): zigzag over 2*cp token blocks (section 2's block rule on tokens), or continuous (token % cp).
std::int32_t token_owner(TokenSplit split, std::int64_t token, std::int64_t extend_len, std::int32_t cp);

// The page inverse: for every current token this rank computes, in merged-span order, the row the
// fill writes it to. Default: the dense row slot * P + offset. Staging-remapped: i * P + offset,
// with i the page's current index.
struct LocalToken {
  std::int32_t request = 0;
  std::int64_t token = 0;  // position in the request's sequence
};
struct PageInverse {
  std::vector<LocalToken> tokens;
  std::vector<std::int64_t> dest_row;
};
enum class InverseTarget : std::uint8_t { dense, staging };
PageInverse page_inverse(const BatchLayout& layout, const Batch& batch, std::int32_t rank,
                         InverseTarget target);

// The per-batch ragged index plan of the indexer on one rank (the seeds' _CpRaggedIndexPlan): one
// segment per maximal run of consecutive current pages of one request that this rank writes.
struct RaggedSegment {
  std::int32_t request = 0;
  std::int64_t q_start = 0;        // first row of the segment in this rank's packed query tokens
  std::int64_t q_len = 0;          // query tokens in the segment
  std::int64_t q_base = 0;         // offset of its first token within the request's extend
  std::int64_t kv_len = 0;         // keys visible to its last query: prefix_len + q_base + q_len
  std::int64_t k_base = 0;         // dense row where the request's span (prefix first) begins
  std::int64_t current_base = 0;   // dense row where the request's current span begins
  friend bool operator==(const RaggedSegment&, const RaggedSegment&) = default;
};
struct RaggedIndexPlan {
  std::int32_t rank = 0;
  std::int64_t q_tokens_total = 0;
  std::vector<RaggedSegment> segments;
};
RaggedIndexPlan ragged_index_plan(const BatchLayout& layout, const Batch& batch, std::int32_t rank);
// The same for a rank of a token-split variant (section 12), read off its plan: its queries are the
// tokens it sends to the all-gather, one segment per maximal run of consecutive tokens of one request.
RaggedIndexPlan token_split_index_plan(const BatchLayout& layout, const Batch& batch, const VariantPlan& plan);
// The attention plan the rank of `plan` runs (section 11): the token split's for a token-split
// variant, else the page split's ragged index plan. The one choice between the two.
RaggedIndexPlan variant_index_plan(const BatchLayout& layout, const Batch& batch, const VariantPlan& plan);

// Bytes one rank moves for one layer (all buffer kinds active on it) under one variant.
// pulled_from[p]: bytes its gathers read from rank p's memory (p == rank: its own), plus, for
// all-reduces, the ring algorithm's receive volume 2 * (cp - 1) / cp * N, attributed to the ring
// predecessor (rank - 1) mod cp. allreduce_bytes: the summed buffer sizes N.
struct LayerBytes {
  std::vector<std::uint64_t> pulled_from;
  std::uint64_t allreduce_bytes = 0;
  std::uint64_t local_copy_bytes = 0;  // publish copies, local materialize, compact pack/unpack
  std::int32_t allreduces = 0;
  std::int32_t barriers = 0;
  std::int32_t gathers = 0;
  std::int32_t own_rank = -1;
  // Token-split variants: the gathered buffer's bytes (cp * allgather_rank_rows rows, padding
  // included; a ring all-gather receives (cp - 1) / cp of it, attributed to the ring predecessor
  // in pulled_from) and the calls (one per active kind).
  std::uint64_t allgather_bytes = 0;
  std::int32_t allgathers = 0;
  std::uint64_t pulled_from_peers() const;  // excluding its own memory
};
LayerBytes layer_bytes(const Setting& setting, const VariantPlan& plan, std::int32_t layer);

// The whole batch's bytes each rank pulls from each rank ([rank][from], the rank itself included:
// its own pool pages and staging), summed over every layer and active kind: what `cpkv plan` and
// Python's plan() report.
std::vector<std::vector<std::uint64_t>> batch_bytes_pulled(const Setting& setting, const BatchLayout& layout, Variant variant);

}  // namespace cpkv::model

// What attention reads (PROTOCOL.md section 11): each rank's attention plan in the neutral form,
// the plain oracle of the plan a rank must hold, and the located checker of invariant 9.
//
// The oracle is written from section 11 alone: it reads the batch, the setting's page size, cp and
// split (or a token split, section 12) and the rank, and nothing of the layout's or
// ragged_index_plan's code. model::ragged_index_plan is one implementation it checks.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cpkv/model/batch.hpp"
#include "cpkv/model/plan.hpp"
#include "cpkv/model/setting.hpp"

namespace cpkv::model {

// One segment of a rank's attention plan: the queries are the current tokens q_base .. q_base +
// q_len - 1 of request `request` (offsets within its extend), packed in the rank's query order; the
// last of them sees kv_len keys (prefix_len + q_base + q_len: causal, per request); key j of the
// request is dense row k_base + j (k_base: the request's first prefix row, or its first current row
// when it has no prefix).
struct AttentionSegment {
  std::int64_t request = 0;
  std::int64_t q_base = 0;
  std::int64_t q_len = 0;
  std::int64_t kv_len = 0;
  std::int64_t k_base = 0;
  friend bool operator==(const AttentionSegment&, const AttentionSegment&) = default;
};

// One query token: request `request`, offset `token` within its extend (0..extend_len-1).
struct QueryToken {
  std::int32_t request = 0;
  std::int64_t token = 0;
  friend bool operator==(const QueryToken&, const QueryToken&) = default;
};

// How a rank's queries are chosen: the page-aligned split of section 2 (the setting's policy), or
// one of section 12's token splits (zigzag over 2*cp token blocks of each request; continuous:
// token t of a request to rank t % cp). A rank's queries are packed request by request, each
// request's in ascending token order.
enum class QuerySplit : std::uint8_t { pages, zigzag_tokens, continuous_tokens };
std::string_view to_string(QuerySplit split);
std::optional<QuerySplit> parse_query_split(std::string_view text);

// The tokens rank `rank` computes, in its query order.
std::vector<QueryToken> rank_queries(const Setting& setting, const Batch& batch, std::int32_t rank,
                                     QuerySplit split = QuerySplit::pages);
// The dense row where request r's span begins (section 3: prefix slots then current slots per
// request, each P rows), for every request.
std::vector<std::int64_t> request_key_base(std::int32_t page_size, const Batch& batch);
// The plan rank `rank` must hold: one segment per maximal run of consecutive tokens of one request
// among its queries.
std::vector<AttentionSegment> expected_attention_plan(const Setting& setting, const Batch& batch, std::int32_t rank,
                                                      QuerySplit split = QuerySplit::pages);
// A RaggedIndexPlan in the neutral form.
std::vector<AttentionSegment> attention_segments(const RaggedIndexPlan& plan);

// The first wrong thing in a plan: which segment (-1: the plan as a whole), the request and tokens
// it names, the field, what the specification expects and what the plan holds, and the likely cause
// (empty when none is recognised).
struct AttentionFinding {
  std::int64_t segment = -1;
  std::int64_t request = -1;
  std::int64_t token_first = -1;  // extend offsets, inclusive
  std::int64_t token_last = -1;
  std::string field;               // request, q_base, q_len, queries, kv_len, k_base, coverage
  std::int64_t expected = 0;
  std::int64_t got = 0;
  std::string what;                // the finding itself, in words
  std::string why;                 // the likely cause, or empty
  // "invariant 9 (attention plan exactness): rank R batch B: segment S (request r tokens a..b): ..."
  std::string describe(std::int32_t rank, std::int64_t batch) const;
  // The same without "invariant 9 (...): rank R batch B: " (for a report that locates it itself).
  std::string detail() const;
};

// Invariant 9 on one rank: every segment names tokens of a request of the batch, the segments'
// queries are exactly the tokens the rank computed in its query order (`queries`; by default the
// page-aligned split's, computed from `setting`), and every kv_len and k_base is section 11's.
std::optional<AttentionFinding> check_attention_plan(const Setting& setting, const Batch& batch, std::int32_t rank,
                                                     std::span<const AttentionSegment> segments,
                                                     QuerySplit split = QuerySplit::pages);
std::optional<AttentionFinding> check_attention_plan(const Setting& setting, const Batch& batch, std::int32_t rank,
                                                     std::span<const AttentionSegment> segments,
                                                     std::span<const QueryToken> queries);
// The layout form the issue names: the setting's cp, P and split are the layout's (its writers are
// not read: the oracle derives them).
std::optional<AttentionFinding> check_attention_plan(const Batch& batch, const BatchLayout& layout, SplitPolicy split,
                                                     std::int32_t rank, std::span<const AttentionSegment> segments);

// Invariant 9 over the group: every current token of every request is a query on exactly one rank.
// `per_rank[k]`: rank k's segments (each already checked on its own or not). The finding names the
// token and the ranks holding it ("token 7 of request 1 is a query on ranks 0 and 1"); `rank_out`
// receives the first rank named (or 0 for a token no rank holds).
std::optional<AttentionFinding> check_attention_coverage(const Batch& batch,
                                                         const std::vector<std::vector<AttentionSegment>>& per_rank,
                                                         std::int32_t* rank_out = nullptr);

}  // namespace cpkv::model

#include "cpkv/model/attention.hpp"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "cpkv/model/assert.hpp"

namespace cpkv::model {

std::string_view to_string(QuerySplit split) {
  switch (split) {
    case QuerySplit::pages: return "pages";
    case QuerySplit::zigzag_tokens: return "zigzag_tokens";
    case QuerySplit::continuous_tokens: return "continuous_tokens";
  }
  return "?";
}

std::optional<QuerySplit> parse_query_split(std::string_view text) {
  for (QuerySplit s : {QuerySplit::pages, QuerySplit::zigzag_tokens, QuerySplit::continuous_tokens}) {
    if (to_string(s) == text) return s;
  }
  return std::nullopt;
}

namespace {

// The owner of each of `units` units (pages or tokens) of one request. Section 2's zigzag: 2*cp
// blocks in order, block j holding units / (2cp) plus one if j < units % (2cp), block j to rank j
// (j < cp) or 2cp-1-j. contiguous: rank k takes [units*k/cp, units*(k+1)/cp). round_robin: the unit
// with batch current index first_index + u goes to rank (first_index + u) % cp. continuous tokens
// (section 12): unit u to rank u % cp, as round_robin from 0.
enum class UnitSplit : std::uint8_t { zigzag, contiguous, round_robin };
std::vector<std::int32_t> unit_owners(UnitSplit split, std::int64_t units, std::int64_t first_index, std::int32_t cp) {
  std::vector<std::int32_t> owner(static_cast<std::size_t>(units), -1);
  if (split == UnitSplit::round_robin) {
    for (std::int64_t u = 0; u < units; ++u) owner[u] = static_cast<std::int32_t>((first_index + u) % cp);
    return owner;
  }
  if (split == UnitSplit::contiguous) {
    for (std::int32_t k = 0; k < cp; ++k) {
      for (std::int64_t u = units * k / cp; u < units * (k + 1) / cp; ++u) owner[u] = k;
    }
    return owner;
  }
  const std::int64_t blocks = 2 * std::int64_t{cp};
  std::int64_t begin = 0;
  for (std::int64_t j = 0; j < blocks; ++j) {
    const std::int64_t len = units / blocks + (j < units % blocks ? 1 : 0);
    for (std::int64_t u = begin; u < begin + len; ++u) owner[u] = static_cast<std::int32_t>(j < cp ? j : blocks - 1 - j);
    begin += len;
  }
  CPKV_ASSERT(begin == units);
  return owner;
}

UnitSplit unit_split(SplitPolicy policy) {
  switch (policy) {
    case SplitPolicy::zigzag: return UnitSplit::zigzag;
    case SplitPolicy::contiguous: return UnitSplit::contiguous;
    case SplitPolicy::round_robin: return UnitSplit::round_robin;
    case SplitPolicy::zigzag_tokens:
    case SplitPolicy::continuous_tokens: break;  // pages by their first token's owner: rank_queries
  }
  return UnitSplit::zigzag;
}

}  // namespace

std::vector<QueryToken> rank_queries(const Setting& setting, const Batch& batch, std::int32_t rank, QuerySplit split) {
  CPKV_ASSERT(rank >= 0);
  CPKV_ASSERT(rank < setting.cp);
  const std::int64_t P = setting.page_size;
  std::vector<QueryToken> out;
  std::int64_t first_index = 0;  // the batch current index of the request's first current page
  for (std::size_t r = 0; r < batch.requests.size(); ++r) {
    const std::int64_t n = batch.requests[r].extend_len;
    const std::int64_t pages = (n + P - 1) / P;
    // Pages own their tokens (section 2); a token split owns each token itself (section 12).
    // On a trace of a token split the page split gives each page to its first token's owner (setting.hpp).
    const bool by_page = split == QuerySplit::pages && !is_token_split(setting.split);
    const bool first_token = split == QuerySplit::pages && !by_page;
    const bool zigzag_tokens = first_token ? setting.split == SplitPolicy::zigzag_tokens : split == QuerySplit::zigzag_tokens;
    const std::vector<std::int32_t> owner =
        by_page ? unit_owners(unit_split(setting.split), pages, first_index, setting.cp)
                : unit_owners(zigzag_tokens ? UnitSplit::zigzag : UnitSplit::round_robin, n, 0, setting.cp);
    for (std::int64_t t = 0; t < n; ++t) {
      if (owner[by_page ? t / P : first_token ? t / P * P : t] == rank) out.push_back({static_cast<std::int32_t>(r), t});
    }
    first_index += pages;
  }
  return out;
}

std::vector<std::int64_t> request_key_base(std::int32_t page_size, const Batch& batch) {
  std::vector<std::int64_t> base(batch.requests.size());
  std::int64_t row = 0;
  for (std::size_t r = 0; r < batch.requests.size(); ++r) {
    base[r] = row;
    const Request& req = batch.requests[r];
    row += req.prefix_len + (req.extend_len + page_size - 1) / page_size * page_size;
  }
  return base;
}

namespace {

std::vector<AttentionSegment> runs_of(const Batch& batch, std::span<const QueryToken> queries, std::span<const std::int64_t> key_base) {
  std::vector<AttentionSegment> out;
  for (std::size_t i = 0; i < queries.size(); ++i) {
    const QueryToken& q = queries[i];
    const bool continues = i > 0 && queries[i - 1].request == q.request && queries[i - 1].token + 1 == q.token;
    if (!continues) out.push_back({q.request, q.token, 0, 0, key_base[q.request]});
    AttentionSegment& s = out.back();
    ++s.q_len;
    s.kv_len = batch.requests[q.request].prefix_len + s.q_base + s.q_len;
  }
  return out;
}

}  // namespace

std::vector<AttentionSegment> expected_attention_plan(const Setting& setting, const Batch& batch, std::int32_t rank, QuerySplit split) {
  const std::vector<QueryToken> queries = rank_queries(setting, batch, rank, split);
  const std::vector<std::int64_t> key_base = request_key_base(setting.page_size, batch);
  return runs_of(batch, queries, key_base);
}

std::vector<AttentionSegment> attention_segments(const RaggedIndexPlan& plan) {
  std::vector<AttentionSegment> out;
  out.reserve(plan.segments.size());
  for (const RaggedSegment& s : plan.segments) out.push_back({s.request, s.q_base, s.q_len, s.kv_len, s.k_base});
  return out;
}

std::string AttentionFinding::detail() const {
  std::string where;
  if (segment >= 0) {
    where = request >= 0 && token_first >= 0
                ? fmt::format("segment {} (request {} tokens {}..{}): ", segment, request, token_first, token_last)
                : fmt::format("segment {}: ", segment);
  }
  return why.empty() ? where + what : fmt::format("{}{}: {}", where, what, why);
}

std::string AttentionFinding::describe(std::int32_t rank, std::int64_t batch) const {
  return fmt::format("invariant 9 (attention plan exactness): rank {} batch {}: {}", rank, batch, detail());
}

namespace {

AttentionFinding finding_at(std::size_t index, const AttentionSegment& s, std::string field, std::int64_t expected, std::int64_t got) {
  AttentionFinding f;
  f.segment = static_cast<std::int64_t>(index);
  f.request = s.request;
  f.token_first = s.q_base;
  f.token_last = s.q_base + s.q_len - 1;
  f.field = std::move(field);
  f.expected = expected;
  f.got = got;
  return f;
}

std::string request_list(std::int64_t r) {
  return r == 1 ? "request 0's" : fmt::format("requests 0..{}'s", r - 1);
}

// The likely cause of a wrong kv_len, from the batch's numbers (empty when none fits).
std::string why_kv_len(const Batch& batch, const AttentionSegment& s, std::int64_t expected, std::span<const std::int64_t> key_base) {
  const std::int64_t r = s.request;
  const std::int64_t prefix = batch.requests[r].prefix_len;
  const std::int64_t diff = s.kv_len - expected;
  std::int64_t keys_before = 0;
  std::int64_t extend_before = 0;
  for (std::int64_t q = 0; q < r; ++q) {
    keys_before += batch.requests[q].prefix_len + batch.requests[q].extend_len;
    extend_before += batch.requests[q].extend_len;
  }
  if (r > 0 && diff == keys_before) {
    return fmt::format("kv_len counts {} {} keys too: the batch taken as one sequence?", request_list(r), keys_before);
  }
  if (r > 0 && diff == extend_before) {
    return fmt::format("kv_len counts {} {} current tokens too: the batch's current tokens taken as one sequence?", request_list(r),
                       extend_before);
  }
  if (r > 0 && diff == key_base[r]) {
    return fmt::format("kv_len counts the {} dense rows before the request: the batch taken as one sequence?", key_base[r]);
  }
  if (diff == -1) return "one key short: query t sees keys 0..prefix_len+t, itself included (causal off by one?)";
  if (diff == 1) return "one key too many: query t sees keys 0..prefix_len+t (causal off by one?)";
  if (prefix > 0 && diff == -prefix) return fmt::format("kv_len leaves out the request's {} prefix keys", prefix);
  if (s.kv_len == prefix + batch.requests[r].extend_len && diff > 0) {
    return "kv_len is the whole request's: every query sees every key (not causal?)";
  }
  if (s.q_base > 0 && diff == -s.q_base) return "kv_len leaves out the request's tokens before the segment (q_base not counted?)";
  return {};
}

std::string why_k_base(const Batch& batch, std::int32_t page_size, const AttentionSegment& s, std::int64_t expected,
                       std::span<const std::int64_t> key_base) {
  const std::int64_t r = s.request;
  const std::int64_t prefix = batch.requests[r].prefix_len;
  if (prefix > 0 && s.k_base == expected + prefix) return "k_base is the current span's: the prefix was skipped?";
  if (s.k_base == 0 && r > 0) return "k_base 0: the batch taken as one sequence?";
  for (std::size_t q = 0; q < key_base.size(); ++q) {
    if (static_cast<std::int64_t>(q) != r && key_base[q] == s.k_base) return fmt::format("k_base is request {}'s", q);
  }
  if (page_size > 1 && s.k_base * page_size == expected) return "k_base counts slots, not rows (times page_size)?";
  return {};
}

std::optional<AttentionFinding> check_bounds(const Batch& batch, std::size_t i, const AttentionSegment& s) {
  const auto requests = static_cast<std::int64_t>(batch.requests.size());
  if (s.request < 0 || s.request >= requests) {
    AttentionFinding f = finding_at(i, s, "request", requests - 1, s.request);
    f.request = -1;
    f.what = fmt::format("request {} is not in the batch (requests 0..{})", s.request, requests - 1);
    return f;
  }
  const std::int64_t n = batch.requests[s.request].extend_len;
  if (s.q_len < 1) {
    AttentionFinding f = finding_at(i, s, "q_len", 1, s.q_len);
    f.token_first = f.token_last = -1;
    f.what = fmt::format("q_len {}: a segment holds at least one query", s.q_len);
    return f;
  }
  if (s.q_base < 0 || s.q_base + s.q_len > n) {
    AttentionFinding f = finding_at(i, s, "q_base", 0, s.q_base);
    f.token_first = f.token_last = -1;
    f.what = fmt::format("tokens {}..{} are outside request {}'s extend (tokens 0..{})", s.q_base, s.q_base + s.q_len - 1, s.request, n - 1);
    return f;
  }
  return std::nullopt;
}

// The rank's queries, as the segments hold them, against the tokens it computed.
std::optional<AttentionFinding> check_queries(std::span<const AttentionSegment> segments, std::span<const QueryToken> queries) {
  std::size_t k = 0;  // position in the rank's query order
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const AttentionSegment& s = segments[i];
    for (std::int64_t t = s.q_base; t < s.q_base + s.q_len; ++t, ++k) {
      if (k < queries.size() && queries[k].request == s.request && queries[k].token == t) continue;
      AttentionFinding f = finding_at(i, s, "queries", static_cast<std::int64_t>(queries.size()), static_cast<std::int64_t>(k));
      if (k >= queries.size()) {
        f.what = fmt::format("query {} (token {} of request {}) is past the {} tokens the rank computed", k, t, s.request, queries.size());
        return f;
      }
      const bool held = std::find(queries.begin(), queries.end(), QueryToken{static_cast<std::int32_t>(s.request), t}) != queries.end();
      f.what = fmt::format("query {} is token {} of request {}, but the rank's query {} is token {} of request {}", k, t, s.request, k,
                           queries[k].token, queries[k].request);
      f.why = held ? "the rank's queries are packed in another order" : fmt::format("token {} of request {} is computed on another rank", t, s.request);
      return f;
    }
  }
  if (k < queries.size()) {
    AttentionFinding f;
    f.field = "queries";
    f.expected = static_cast<std::int64_t>(queries.size());
    f.got = static_cast<std::int64_t>(k);
    f.request = queries[k].request;
    f.what = fmt::format("the plan holds {} queries, the rank computed {}: token {} of request {} is no query", k, queries.size(),
                         queries[k].token, queries[k].request);
    return f;
  }
  return std::nullopt;
}

}  // namespace

std::optional<AttentionFinding> check_attention_plan(const Setting& setting, const Batch& batch, std::int32_t rank,
                                                     std::span<const AttentionSegment> segments, std::span<const QueryToken> queries) {
  (void)rank;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    if (auto f = check_bounds(batch, i, segments[i])) return f;
  }
  if (auto f = check_queries(segments, queries)) return f;
  const std::vector<std::int64_t> key_base = request_key_base(setting.page_size, batch);
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const AttentionSegment& s = segments[i];
    const std::int64_t kv_len = batch.requests[s.request].prefix_len + s.q_base + s.q_len;
    if (s.kv_len != kv_len) {
      AttentionFinding f = finding_at(i, s, "kv_len", kv_len, s.kv_len);
      f.what = fmt::format("q_len {} kv_len {}, the request needs kv_len {}", s.q_len, s.kv_len, kv_len);
      f.why = why_kv_len(batch, s, kv_len, key_base);
      return f;
    }
    if (s.k_base != key_base[s.request]) {
      AttentionFinding f = finding_at(i, s, "k_base", key_base[s.request], s.k_base);
      f.what = fmt::format("k_base {}, the request's keys begin at dense row {}", s.k_base, key_base[s.request]);
      f.why = why_k_base(batch, setting.page_size, s, key_base[s.request], key_base);
      return f;
    }
  }
  return std::nullopt;
}

std::optional<AttentionFinding> check_attention_plan(const Setting& setting, const Batch& batch, std::int32_t rank,
                                                     std::span<const AttentionSegment> segments, QuerySplit split) {
  const std::vector<QueryToken> queries = rank_queries(setting, batch, rank, split);
  return check_attention_plan(setting, batch, rank, segments, std::span<const QueryToken>(queries));
}

std::optional<AttentionFinding> check_attention_plan(const Batch& batch, const BatchLayout& layout, SplitPolicy split,
                                                     std::int32_t rank, std::span<const AttentionSegment> segments) {
  Setting setting;
  setting.cp = layout.cp;
  setting.page_size = layout.page_size;
  setting.split = split;
  return check_attention_plan(setting, batch, rank, segments, QuerySplit::pages);
}

std::optional<AttentionFinding> check_attention_coverage(const Batch& batch, const std::vector<std::vector<AttentionSegment>>& per_rank,
                                                         std::int32_t* rank_out) {
  // holder[r][t]: the first rank holding token t of request r as a query (-1: none).
  std::vector<std::vector<std::int32_t>> holder(batch.requests.size());
  for (std::size_t r = 0; r < batch.requests.size(); ++r) holder[r].assign(batch.requests[r].extend_len, -1);
  for (std::size_t k = 0; k < per_rank.size(); ++k) {
    for (const AttentionSegment& s : per_rank[k]) {
      if (s.request < 0 || s.request >= static_cast<std::int64_t>(holder.size())) continue;  // the per-rank check names it
      std::vector<std::int32_t>& tokens = holder[s.request];
      for (std::int64_t t = std::max<std::int64_t>(s.q_base, 0); t < s.q_base + s.q_len && t < static_cast<std::int64_t>(tokens.size()); ++t) {
        if (tokens[t] >= 0) {
          AttentionFinding f;
          f.field = "coverage";
          f.request = s.request;
          f.token_first = f.token_last = t;
          f.expected = 1;
          f.got = 2;
          f.what = fmt::format("token {} of request {} is a query on ranks {} and {}", t, s.request, tokens[t], k);
          if (rank_out != nullptr) *rank_out = tokens[t];
          return f;
        }
        tokens[t] = static_cast<std::int32_t>(k);
      }
    }
  }
  for (std::size_t r = 0; r < holder.size(); ++r) {
    for (std::size_t t = 0; t < holder[r].size(); ++t) {
      if (holder[r][t] >= 0) continue;
      AttentionFinding f;
      f.field = "coverage";
      f.request = static_cast<std::int64_t>(r);
      f.token_first = f.token_last = static_cast<std::int64_t>(t);
      f.expected = 1;
      f.got = 0;
      f.what = fmt::format("token {} of request {} is a query on no rank", t, r);
      if (rank_out != nullptr) *rank_out = 0;
      return f;
    }
  }
  return std::nullopt;
}

}  // namespace cpkv::model

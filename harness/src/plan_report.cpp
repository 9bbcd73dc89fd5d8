#include "cpkv/harness/plan_report.hpp"

#include "cpkv/model/assert.hpp"
#include "cpkv/model/plan.hpp"

namespace cpkv::harness {
namespace {

std::vector<std::vector<std::int32_t>> writers_by_request(const model::BatchLayout& layout, std::size_t requests) {
  std::vector<std::vector<std::int32_t>> writers(requests);
  for (const model::CurrentPage& page : layout.current) writers[page.request].push_back(page.writer);
  return writers;
}

nlohmann::json segments_json(const std::vector<model::AttentionSegment>& plan) {
  nlohmann::json segments = nlohmann::json::array();
  for (const model::AttentionSegment& s : plan) {
    segments.push_back({{"request", s.request}, {"q_base", s.q_base}, {"q_len", s.q_len}, {"kv_len", s.kv_len}, {"k_base", s.k_base}});
  }
  return segments;
}

// A token-split variant's batch (PROTOCOL.md section 12): the keys of the page split's that still
// mean something, staging and verdict null (no staging), and per rank its tokens as runs, the
// all-gather's bytes, the prefix pulls by owner, the model's row of bytes and its attention plan.
nlohmann::json token_split_json(const PlannedBatch& p) {
  const model::TokenSplitPlan& t = *p.tokens;
  nlohmann::json out = {{"batch", p.index}, {"requests", p.requests}, {"current_pages_total", p.layout.current_pages_total},
                        {"slot_count", p.layout.slot_count}, {"staging_slots", nullptr}, {"staging_source", nullptr}, {"verdict", "no_staging"},
                        {"verdict_detail", t.no_staging_detail}, {"writers", nullptr}, {"variant", model::to_string(p.variant)},
                        {"layers", p.layers}, {"token_split", model::to_string(t.split)}, {"tokens_total", t.tokens_total},
                        {"max_rank_tokens", t.max_rank_tokens}, {"allgather_rows", t.allgather_rows}, {"padding_rows", t.padding_rows},
                        {"allgathers", t.allgathers}};
  nlohmann::json ranks = nlohmann::json::array();
  for (std::int32_t rank = p.rank_first; rank < p.rank_end; ++rank) {
    const model::TokenSplitRank& r = t.ranks[rank];
    nlohmann::json runs = nlohmann::json::array();
    for (const model::TokenRun& run : r.tokens) runs.push_back({{"request", run.request}, {"first", run.first}, {"count", run.count}, {"step", run.step}});
    ranks.push_back({{"rank", rank}, {"tokens", runs}, {"token_count", r.token_count}, {"padding_rows", r.padding_rows},
                     {"allgather_bytes", r.allgather_bytes}, {"allgather_peer_bytes", r.allgather_peer_bytes},
                     {"prefix_pages_from", r.prefix_pages_from}, {"prefix_bytes_from", r.prefix_bytes_from},
                     {"bytes_pulled_from", p.matrix[rank]}, {"local_bytes", p.matrix[rank][rank]}, {"peer_bytes", pulled_from_peers(p.matrix[rank], rank)},
                     {"attention", segments_json(r.attention)}});
  }
  out["ranks"] = ranks;
  return out;
}

}  // namespace

std::uint64_t pulled_from_peers(const std::vector<std::uint64_t>& row, std::int32_t rank) {
  std::uint64_t sum = 0;
  for (std::size_t from = 0; from < row.size(); ++from) sum += static_cast<std::int32_t>(from) == rank ? 0 : row[from];
  return sum;
}

PlannedBatch plan_batch(const model::Setting& setting, const model::Batch& batch, std::int64_t index, model::Variant variant,
                        std::optional<std::int32_t> rank) {
  CPKV_ASSERT(!rank || (*rank >= 0 && *rank < setting.cp));
  PlannedBatch p;
  p.index = index;
  p.requests = batch.requests.size();
  p.layout = model::layout_batch(setting, batch);
  p.capacity = model::staging_capacity(setting);
  p.variant = variant;
  p.layers = setting.layer_count();
  if (model::splits_tokens(variant)) {
    // Section 12: no staging, so no verdict; the attention plans are the token split's.
    p.tokens = model::token_split_plan(setting, p.layout, batch, variant);
    p.matrix = model::batch_bytes_pulled(setting, p.layout, variant);
    for (const model::TokenSplitRank& r : p.tokens->ranks) p.attention.push_back(r.attention);
  } else {
    p.verdict = model::overflow_verdict(p.layout.current_pages_total, p.capacity.staging_slots);
    p.writers = writers_by_request(p.layout, batch.requests.size());
  }
  // A rejected batch moves nothing: no rank writes staging or waits at a barrier.
  if (!p.tokens && !p.verdict.overflow) {
    p.matrix = model::batch_bytes_pulled(setting, p.layout, variant);
    for (std::int32_t r = 0; r < setting.cp; ++r) p.attention.push_back(model::attention_segments(model::ragged_index_plan(p.layout, batch, r)));
  }
  p.rank_first = rank.value_or(0);
  p.rank_end = rank ? *rank + 1 : setting.cp;
  return p;
}

nlohmann::json plan_json(const PlannedBatch& p) {
  if (p.tokens) return token_split_json(p);
  nlohmann::json out;
  out["batch"] = p.index;
  out["requests"] = p.requests;
  out["current_pages_total"] = p.layout.current_pages_total;
  out["slot_count"] = p.layout.slot_count;
  out["staging_slots"] = p.capacity.staging_slots;
  out["staging_source"] = model::to_string(p.capacity.source);
  out["verdict"] = p.verdict.overflow ? "overflow" : "ok";
  out["verdict_detail"] = p.verdict.describe();
  out["writers"] = p.writers;
  out["variant"] = model::to_string(p.variant);
  out["layers"] = p.layers;
  nlohmann::json ranks = nlohmann::json::array();
  for (std::int32_t rank = p.rank_first; rank < p.rank_end; ++rank) {
    nlohmann::json entry = {{"rank", rank}, {"bytes_pulled_from", nullptr}, {"local_bytes", nullptr}, {"peer_bytes", nullptr}, {"attention", nullptr}};
    if (!p.verdict.overflow) {
      entry["bytes_pulled_from"] = p.matrix[rank];
      entry["local_bytes"] = p.matrix[rank][rank];
      entry["peer_bytes"] = pulled_from_peers(p.matrix[rank], rank);
      entry["attention"] = segments_json(p.attention[rank]);
    }
    ranks.push_back(entry);
  }
  out["ranks"] = ranks;
  return out;
}

}  // namespace cpkv::harness

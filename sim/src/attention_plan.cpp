#include "cpkv/sim/attention_plan.hpp"

#include "cpkv/model/plan.hpp"

namespace cpkv::sim {

std::vector<model::AttentionSegment> rank_attention_plan(const model::BatchLayout& layout, const model::Batch& batch, std::int32_t rank,
                                                         const MutantPolicy& mutant, const model::VariantPlan* token_plan) {
  const model::RaggedIndexPlan plan =
      token_plan != nullptr ? model::token_split_index_plan(layout, batch, *token_plan) : model::ragged_index_plan(layout, batch, rank);
  std::vector<model::AttentionSegment> segments = model::attention_segments(plan);
  // Keys of every request before r (prefix and extend): what a plan that runs the batch as one
  // causal sequence adds to r's window.
  std::vector<std::int64_t> keys_before(batch.requests.size(), 0);
  for (std::size_t r = 1; r < batch.requests.size(); ++r) {
    keys_before[r] = keys_before[r - 1] + batch.requests[r - 1].prefix_len + batch.requests[r - 1].extend_len;
  }
  for (std::size_t i = 0; i < segments.size(); ++i) {
    model::AttentionSegment& s = segments[i];
    if (mutant.plan_takes_batch_as_one_sequence()) s.kv_len += keys_before[s.request];
    s.kv_len += mutant.causal_window_shift();
    if (mutant.key_base_skips_prefix()) s.k_base = plan.segments[i].current_base;
  }
  return segments;
}

}  // namespace cpkv::sim

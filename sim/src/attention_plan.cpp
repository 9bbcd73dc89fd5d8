#include "cpkv/sim/attention_plan.hpp"

#include "cpkv/model/attention_bug.hpp"
#include "cpkv/model/plan.hpp"

namespace cpkv::sim {

std::vector<model::AttentionSegment> rank_attention_plan(const model::BatchLayout& layout, const model::Batch& batch, std::int32_t rank,
                                                         const MutantPolicy& mutant, const model::VariantPlan* token_plan) {
  const model::RaggedIndexPlan plan =
      token_plan != nullptr ? model::token_split_index_plan(layout, batch, *token_plan) : model::ragged_index_plan(layout, batch, rank);
  return model::apply_attention_bug(model::attention_segments(plan), batch, mutant.attention_bug());
}

}  // namespace cpkv::sim

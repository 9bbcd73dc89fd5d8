// The attention plan a simulated rank hands its attention kernels (PROTOCOL.md section 11): the
// model's ragged index plan over the rank's own layout, with the planted bugs of invariant 9 applied.
// The step machine checks it once per batch (StateChecker::on_attention_plan); the property of
// invariant 9 checks the same function on production-shaped batches without running the ranks.
#pragma once

#include <cstdint>
#include <vector>

#include "cpkv/model/attention.hpp"
#include "cpkv/model/batch.hpp"
#include "cpkv/sim/mutant.hpp"

namespace cpkv::sim {

// token_plan: a token-split variant's plan (section 12), whose rank computes its own tokens; null:
// the page split's ragged index plan.
std::vector<model::AttentionSegment> rank_attention_plan(const model::BatchLayout& layout, const model::Batch& batch, std::int32_t rank,
                                                         const MutantPolicy& mutant, const model::VariantPlan* token_plan = nullptr);

}  // namespace cpkv::sim

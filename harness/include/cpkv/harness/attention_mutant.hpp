// Which of invariant 9's planted bugs (model/include/cpkv/model/attention_bug.hpp) a harness
// Mutant switches on: the one translation the simulator and the fused GPU plugin share, so both
// apply the bug through model::apply_attention_bug and neither spells it out again.
#pragma once

#include "cpkv/harness/mutants.hpp"
#include "cpkv/model/attention_bug.hpp"

namespace cpkv::harness {

constexpr model::AttentionBug attention_bug(Mutant mutant) {
  switch (mutant) {
    case Mutant::batch_as_one_sequence: return model::AttentionBug::batch_as_one_sequence;
    case Mutant::causal_off_by_one: return model::AttentionBug::causal_off_by_one;
    case Mutant::key_base_skips_prefix: return model::AttentionBug::key_base_skips_prefix;
    default: return model::AttentionBug::none;  // every other planted bug leaves the plan alone
  }
}

}  // namespace cpkv::harness

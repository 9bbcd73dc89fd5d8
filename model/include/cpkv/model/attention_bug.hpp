// The planted bugs of invariant 9 (PROTOCOL.md section 11), applied to an attention plan in one
// place: the simulator's ranks (sim/src/attention_plan.cpp) and the fused GPU plugin
// (gpu/fused/fused_exchange.cpp) both hand their kernels the plan this function returns, so a bug
// is wrong in the same way wherever it is planted. The harness's table names them
// (harness/include/cpkv/harness/attention_mutant.hpp maps its Mutant to this enum).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "cpkv/model/attention.hpp"
#include "cpkv/model/batch.hpp"

namespace cpkv::model {

enum class AttentionBug : std::uint8_t {
  none,
  batch_as_one_sequence,  // kv_len also counts every earlier request's keys (prefix and extend)
  causal_off_by_one,      // kv_len one short: a query does not see itself
  key_base_skips_prefix,  // k_base at the request's first current row: its prefix keys are skipped
};

// "none", "batch_as_one_sequence", ...: the harness's planted-bug names.
std::string_view to_string(AttentionBug bug);

// `plan` (segments of `batch`, in the neutral form) with `bug` switched on; `none` returns it as is.
std::vector<AttentionSegment> apply_attention_bug(std::vector<AttentionSegment> plan, const Batch& batch, AttentionBug bug);

}  // namespace cpkv::model

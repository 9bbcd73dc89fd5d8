#include "cpkv/model/attention_bug.hpp"

#include "cpkv/model/assert.hpp"

namespace cpkv::model {

std::string_view to_string(AttentionBug bug) {
  switch (bug) {
    case AttentionBug::none: return "none";
    case AttentionBug::batch_as_one_sequence: return "batch_as_one_sequence";
    case AttentionBug::causal_off_by_one: return "causal_off_by_one";
    case AttentionBug::key_base_skips_prefix: return "key_base_skips_prefix";
  }
  return "?";
}

std::vector<AttentionSegment> apply_attention_bug(std::vector<AttentionSegment> plan, const Batch& batch, AttentionBug bug) {
  if (bug == AttentionBug::none) return plan;
  // Keys of every request before r (prefix and extend): what a plan that runs the batch as one
  // causal sequence adds to r's window.
  std::vector<std::int64_t> keys_before(batch.requests.size() + 1, 0);
  for (std::size_t r = 0; r < batch.requests.size(); ++r) {
    keys_before[r + 1] = keys_before[r] + batch.requests[r].prefix_len + batch.requests[r].extend_len;
  }
  for (AttentionSegment& s : plan) {
    CPKV_ASSERT(s.request >= 0 && static_cast<std::size_t>(s.request) < batch.requests.size());
    const auto r = static_cast<std::size_t>(s.request);
    switch (bug) {
      case AttentionBug::batch_as_one_sequence: s.kv_len += keys_before[r]; break;
      case AttentionBug::causal_off_by_one: s.kv_len -= 1; break;
      // Section 3: a request's prefix span is prefix_len / P whole slots, so its current span
      // begins prefix_len rows after its first prefix row.
      case AttentionBug::key_base_skips_prefix: s.k_base += batch.requests[r].prefix_len; break;
      case AttentionBug::none: break;
    }
  }
  return plan;
}

}  // namespace cpkv::model

#include "cpkv/harness/attention_limit.hpp"

#include <fmt/format.h>

#include "cpkv/harness/request.hpp"
#include "cpkv/model/staging.hpp"
#include "cpkv/model/token_plan.hpp"

namespace cpkv::harness {

std::string SegmentExcess::describe(std::string_view trace_label) const {
  return fmt::format("{}: batch {}: rank {}'s attention plan under {} has {} segments, over the limit of {} per rank that the GPU "
                     "backend compares across ranks (invariant 9; a continuous token split needs about one segment per token)",
                     trace_label, batch, rank, model::to_string(variant), segments, limit);
}

std::optional<SegmentExcess> attention_segments_excess(const BatchSource& source, std::span<const model::Variant> variants, std::int64_t limit) {
  const std::int64_t staging_slots = model::staging_capacity(source.setting).staging_slots;
  BatchCursor cursor(source, /*held_to_last_measure=*/false);
  while (auto batch = cursor.next()) {
    std::int64_t tokens = 0;
    for (const model::Request& request : batch->requests) tokens += request.extend_len;
    if (tokens <= limit) continue;
    const model::BatchLayout layout = model::layout_batch(source.setting, *batch);
    const bool overflow = model::overflow_verdict(layout.current_pages_total, staging_slots).overflow;
    for (model::Variant variant : variants) {
      if (overflow && !model::splits_tokens(variant)) continue;  // rejected before any rank runs its attention
      for (std::int32_t rank = 0; rank < source.setting.cp; ++rank) {
        const auto segments = static_cast<std::int64_t>(model::variant_attention_plan(layout, *batch, variant, rank).segments.size());
        if (segments > limit) return SegmentExcess{cursor.index(), rank, variant, segments, limit};
      }
    }
  }
  return std::nullopt;
}

void refuse_attention_segments_over_limit(const BatchSource& source, std::string_view trace_label, std::span<const model::Variant> variants,
                                          std::int64_t limit) {
  if (const auto excess = attention_segments_excess(source, variants, limit)) throw RequestError("trace", excess->describe(trace_label));
}

void refuse_attention_over_limit(const CheckedRequest& checked, const BatchSource& source) {
  if (checked.exchange == nullptr || (checked.exchange->table->flags & CPKV_FLAG_ATTENTION_PLAN) == 0) return;
  refuse_attention_segments_over_limit(source, checked.request.trace_label, checked.variants);
}

}  // namespace cpkv::harness

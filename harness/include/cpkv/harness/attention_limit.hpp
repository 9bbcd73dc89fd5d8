// The attention-plan segments a source needs per rank, against a backend's fixed limit: found
// before any rank starts, so a batch over it is refused rather than failing mid-run (the GPU
// backend's bootstrap region holds model::limits::attention_segments_max segments per rank).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "cpkv/harness/source.hpp"
#include "cpkv/model/limits.hpp"
#include "cpkv/model/variants.hpp"

namespace cpkv::harness {

// The first batch, variant and rank whose attention plan (PROTOCOL.md section 11: the page split's
// ragged index plan or the token split's, model::variant_attention_plan) has more segments than
// the limit.
struct SegmentExcess {
  std::int64_t batch = 0;
  std::int32_t rank = 0;
  model::Variant variant = model::Variant::staging_direct;
  std::int64_t segments = 0;
  std::int64_t limit = 0;
  // "TRACE: batch B: rank R's attention plan under V has N segments, over the limit of L per rank ..."
  std::string describe(std::string_view trace_label) const;
};

// Every batch of `source` under every variant, in order; nullopt when every rank's plan fits. A
// batch a staging variant rejects (overflow) runs no attention under it and is not counted, and a
// batch of no more current tokens than the limit cannot exceed it (a segment holds at least one
// query), so only a batch that could is planned.
std::optional<SegmentExcess> attention_segments_excess(const BatchSource& source, std::span<const model::Variant> variants,
                                                       std::int64_t limit = model::limits::attention_segments_max);

// The same as a refusal: throws RequestError("trace", describe's line) on the first excess.
void refuse_attention_segments_over_limit(const BatchSource& source, std::string_view trace_label, std::span<const model::Variant> variants,
                                          std::int64_t limit = model::limits::attention_segments_max);

struct CheckedRequest;
// The GPU backend's refusal for a checked request (its replay and its bench alike): only an exchange
// that returns its attention plan (CPKV_FLAG_ATTENTION_PLAN, cpkv's own fused one among them) has
// every rank's plan compared across ranks through the bootstrap region's fixed array, so only its
// runs are held to the limit.
void refuse_attention_over_limit(const CheckedRequest& checked, const BatchSource& source);

}  // namespace cpkv::harness

// The setting of a context-parallel group: everything about the exchange that does not change from
// batch to batch (PROTOCOL.md section 1). Pure data plus validation; no I/O.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cpkv/model/limits.hpp"

namespace cpkv::model {

// How current pages are assigned to writers (PROTOCOL.md section 2), or (zigzag_tokens,
// continuous_tokens) how an engine with section 12's token split assigned its tokens. Under a token
// split a page can have two writers, which is legal there: invariant 1 holds per token row. The
// page-writer variants (staging, v2, ...) cannot host that (one writer per page, section 2), so on
// such a trace each current page goes to the owner of its first token: the page-aligned rounding of
// the token split (model::page_writer_of_token_split); the all-gather variants split tokens themselves.
enum class SplitPolicy : std::uint8_t { zigzag, contiguous, round_robin, zigzag_tokens, continuous_tokens };
// True for zigzag_tokens and continuous_tokens.
constexpr bool is_token_split(SplitPolicy policy) {
  return policy == SplitPolicy::zigzag_tokens || policy == SplitPolicy::continuous_tokens;
}

// A KV buffer kind. The registry below is closed: a trace naming any other kind is refused, because
// the row size is what every byte count and the staging size depend on.
struct BufferKind {
  std::string_view name;
  std::uint32_t row_bytes;
  // Indexer buffers exist only on layers that run the indexer (pattern 'F').
  bool full_layers_only;
};

// kv_fp8: 512 fp8 + 4 fp32 scales + 64 bf16 rope = 656 B (the DSA fp8 layout).
// kv_bf16: the same latent in bf16 = 1152 B. indexer_k: 128 fp8 + 1 fp32 scale = 132 B.
inline constexpr BufferKind kBufferKinds[] = {
    {"kv_fp8", 656, false},
    {"kv_bf16", 1152, false},
    {"indexer_k", 132, true},
};

std::optional<BufferKind> find_buffer_kind(std::string_view name);

// Scheduler admission caps and the staging size override. Absent caps are std::nullopt.
struct Caps {
  std::optional<std::int64_t> max_total_extend_tokens;
  std::optional<std::int64_t> max_batch_requests;
  std::optional<std::int64_t> staging_mib_override;
};

struct Setting {
  std::int32_t cp = 1;
  std::int32_t page_size = 64;                // P, tokens per page
  std::vector<BufferKind> kinds;              // in trace order; at least one
  std::string layer_pattern;                  // one of 'F' or 'S' per layer; its length is L
  std::int64_t pool_pages = 0;                // logical pages in the owner-sharded pool
  SplitPolicy split = SplitPolicy::zigzag;
  Caps caps;

  std::int32_t layer_count() const { return static_cast<std::int32_t>(layer_pattern.size()); }
  bool layer_is_full(std::int32_t layer) const { return layer_pattern[layer] == 'F'; }
  bool kind_active(std::size_t kind_index, std::int32_t layer) const {
    return !kinds[kind_index].full_layers_only || layer_is_full(layer);
  }
  // Sum of row bytes over all kinds: the staging and dense geometry is carved for every kind.
  std::uint64_t row_bytes_all_kinds() const;
  // Sum of row bytes over the kinds active on `layer`, and how many they are: what one layer moves.
  std::uint64_t row_bytes_on_layer(std::int32_t layer) const;
  std::int32_t kinds_on_layer(std::int32_t layer) const;
  // Pages each rank's pool slab holds: logical page g lives on rank g % cp at local page g / cp.
  std::int64_t pool_pages_per_rank() const { return (pool_pages + cp - 1) / cp; }
};

// A reason a setting or batch is not valid: the field it concerns and why, in one line.
struct Problem {
  std::string field;
  std::string reason;
};

std::optional<Problem> validate(const Setting& setting);

std::string_view to_string(SplitPolicy policy);
std::optional<SplitPolicy> parse_split_policy(std::string_view text);

}  // namespace cpkv::model

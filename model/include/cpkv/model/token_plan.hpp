// What a batch's plan is under a token-split all-gather variant (PROTOCOL.md section 12), in the
// numbers `cpkv plan` and Python's cpkv.plan print: each rank's tokens in its send order, the padded
// all-gather's rows and bytes, the prefix pages each rank pulls from the pool by owner, and each
// rank's attention plan (section 11: the token split's). No staging: nothing here is an overflow
// verdict, because section 12's exchange has none.
//
// Every number is read off the model's own plan (variant_plan, layer_bytes, token_split_index_plan),
// so it equals what the cost model and the simulator count.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cpkv/model/attention.hpp"
#include "cpkv/model/batch.hpp"
#include "cpkv/model/plan.hpp"
#include "cpkv/model/setting.hpp"
#include "cpkv/model/variants.hpp"

namespace cpkv::model {

// A run of one request's tokens among a rank's, in its send order: the extend offsets first,
// first + step, ..., first + (count - 1) * step. Zigzag gives step-1 runs (one per block, at most
// two per request); continuous one run of step cp per request.
struct TokenRun {
  std::int32_t request = 0;
  std::int64_t first = 0;
  std::int64_t count = 0;
  std::int64_t step = 1;
  friend bool operator==(const TokenRun&, const TokenRun&) = default;
};

// One rank under the token split. Bytes are summed over every layer and the kinds active on it.
struct TokenSplitRank {
  std::int32_t rank = 0;
  std::vector<TokenRun> tokens;        // the rows it computes and sends, in its send order
  std::int64_t token_count = 0;        // its send rows that hold a token
  std::int64_t padding_rows = 0;       // max_rank_tokens - token_count: its send rows that pad
  // The gathered buffer it ends with (cp * max_rank_tokens rows per all-gather, padding included),
  // and of it what a ring all-gather brings from peers ((cp - 1) of the cp blocks; the cost model
  // attributes it to the ring predecessor (rank - 1) mod cp).
  std::uint64_t allgather_bytes = 0;
  std::uint64_t allgather_peer_bytes = 0;
  std::vector<std::int64_t> prefix_pages_from;   // [owner]: the batch's prefix pages its gather reads from owner's pool
  std::vector<std::uint64_t> prefix_bytes_from;  // [owner]: their bytes over the batch (its own entry is local)
  std::vector<AttentionSegment> attention;       // its attention plan (section 11), the token split's
};

struct TokenSplitPlan {
  TokenSplit split = TokenSplit::none;
  std::int64_t tokens_total = 0;       // the batch's current tokens
  std::int64_t max_rank_tokens = 0;    // the largest rank's count: what every rank sends
  std::int64_t allgather_rows = 0;     // rows of one all-gather: cp * max_rank_tokens
  std::int64_t padding_rows = 0;       // allgather_rows - tokens_total
  std::int32_t allgathers = 0;         // all-gather calls over the batch: one per layer and active kind
  std::vector<TokenSplitRank> ranks;   // every rank of the group
  // What the batch has instead of an overflow verdict (no staging: invariant 3 does not apply).
  std::string no_staging_detail;
};

// The plan of a batch under a token-split variant (splits_tokens(variant) must hold).
TokenSplitPlan token_split_plan(const Setting& setting, const BatchLayout& layout, const Batch& batch, Variant variant);

// The rank's tokens (request, extend offset) in send order, as runs: each run is as long as it can
// be, and a step other than 1 is taken only by a run of three or more tokens (so a zigzag rank's
// second block does not borrow the last token of its first).
std::vector<TokenRun> token_runs(const std::vector<QueryToken>& tokens);

// The attention plan rank `rank` runs under `variant` (section 11): the page split's ragged index
// plan, or the token split's (variant_index_plan, without a variant plan for the page split).
RaggedIndexPlan variant_attention_plan(const BatchLayout& layout, const Batch& batch, Variant variant, std::int32_t rank);

}  // namespace cpkv::model

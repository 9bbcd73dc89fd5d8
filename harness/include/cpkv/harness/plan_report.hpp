// The batch-logical plan of one batch, as `cpkv plan` reports it: the numbers its text and its JSON
// print, and the JSON object `cpkv plan --json` writes one line of and Python's cpkv.plan returns
// (through the bindings). One builder, so the two front ends cannot drift.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "cpkv/model/attention.hpp"
#include "cpkv/model/batch.hpp"
#include "cpkv/model/setting.hpp"
#include "cpkv/model/staging.hpp"
#include "cpkv/model/token_plan.hpp"
#include "cpkv/model/variants.hpp"

namespace cpkv::harness {

struct PlannedBatch {
  std::int64_t index = 0;  // the batch's 0-based index in its trace
  std::size_t requests = 0;
  model::BatchLayout layout;
  model::StagingCapacity capacity;
  model::Variant variant = model::Variant::staging_direct;
  std::int32_t layers = 0;
  model::Verdict verdict;
  std::vector<std::vector<std::int32_t>> writers;  // [request]: the writer of each current page
  std::vector<std::vector<std::uint64_t>> matrix;  // [reader][holder]; empty for a rejected batch
  // [rank]: the attention plan cpkv's backends hand each rank's attention kernels (PROTOCOL.md
  // section 11: the page split's ragged index plan or the token split's); empty for a rejected batch.
  std::vector<std::vector<model::AttentionSegment>> attention;
  // A token-split variant's (PROTOCOL.md section 12): its split, all-gather and prefix pulls, and
  // the token split's attention plans; it has no staging, so verdict and writers are not printed.
  std::optional<model::TokenSplitPlan> tokens;
  std::int32_t rank_first = 0, rank_end = 0;  // the ranks printed
};

// The plan of batch `index` under `variant`, for every rank or only `rank` (a rank of the setting).
PlannedBatch plan_batch(const model::Setting& setting, const model::Batch& batch, std::int64_t index, model::Variant variant,
                        std::optional<std::int32_t> rank);

// The batch's object of `cpkv plan --json` (README: the plan's --json fields).
nlohmann::json plan_json(const PlannedBatch& p);

// A row's bytes held by other ranks than `rank` (its own entry is its own memory, copied locally).
std::uint64_t pulled_from_peers(const std::vector<std::uint64_t>& row, std::int32_t rank);

}  // namespace cpkv::harness

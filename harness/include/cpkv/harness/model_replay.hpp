// The model replay (`cpkv replay --backend model`, Python's replay(backend="model")): for every
// batch of a source, in one pass over its BatchCursor, the overflow verdict, the bytes every rank
// pulls under every variant and the modelled exchange time (model/costs.hpp), without moving a byte
// of content. The front ends only print `text`, write `json` and draw the per-batch times.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cpkv/harness/replay_report.hpp"
#include "cpkv/harness/source.hpp"
#include "cpkv/model/costs.hpp"

namespace cpkv::harness {

struct ModelReplayOptions {
  std::int64_t repeat = 1;       // evaluate every batch this many times (timing only)
  bool exact_model = false;      // also build every rank's plan with the model and check the bytes agree
  std::optional<std::int64_t> staging_mib;  // staging size for the verdict, MiB (overrides the trace's caps)
  bool per_batch = false;        // fill ModelReplayOutput::per_batch (one record per batch, with components)
  // With per_batch: each record handed here as soon as it is made, and ModelReplayOutput::per_batch
  // left empty, so that memory stays bounded on any trace (issue 34, item 8: 5.1 GB held for 500k
  // batches). A throw stops the replay and leaves model_replay.
  std::function<void(const nlohmann::json& record)> per_batch_sink;
  std::vector<std::int64_t> staging_sweep;  // staging sizes (MiB) to count overflows at; empty: no sweep
};

// Whether an overflow rejects the variant: it reads peers' current pages from staging
// (kVariantTable's peer_pages). The others run an overflowing batch and are counted.
bool uses_staging(model::Variant variant);

struct ModelReplayOutput {
  std::string text;                      // the summary the CLI prints
  nlohmann::json json;                   // what `--json` writes and Python returns
  std::vector<RejectedBatch> rejected;   // batches the overflow verdict rejects
  std::vector<std::int64_t> batch_index; // every batch, and its modelled ms per variant (NaN: rejected for it)
  std::vector<std::array<double, model::kVariantCount>> batch_ms;
  std::vector<nlohmann::json> per_batch; // with options.per_batch: one record per batch (docs/model_replay.md)
};

// `label` names the source in the summary (the trace as the user gave it). An --exact-model
// disagreement throws std::logic_error.
ModelReplayOutput model_replay(const BatchSource& source, const std::string& label, const model::CostParameters& parameters,
                               const ModelReplayOptions& options);

}  // namespace cpkv::harness

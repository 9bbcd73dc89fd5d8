// The bench's measurements in one place. The per-batch timings, one row each (as DeepEP keeps its
// launch configs in one header): what is timed, whether its spread is kept, the stem of its JSON
// keys, its unit, its markdown column and legend, and what it times (the table's layer or a part).
// Every rank's record (BenchRank), the folded result (BenchResult), the timing loop (gpu/plugin_bench.cpp:
// time_plugin_layers), the fold over ranks (fold_bench), the JSON rows and the markdown columns
// (gpu/bench_markdown.cpp) derive from this table, so adding a timing is one row here (and, for a part, its cpkv_part in
// include/cpkv/exchange_abi.h). The CLI names the figures derived from two timings (a barrier's
// share) itself.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>

#include "cpkv/exchange_abi.h"

namespace cpkv::cuda {

enum class Timing : int {
  with_fill,             // one layer: producer step + compose
  compose_only,          // one layer without the producer step (its fill done by the replays before it)
  isolated,              // the isolated current-page exchange
  isolated_gather_only,  // the same without the barrier (the barrier's share is the difference)
  fill_only,             // the producer launch alone (fill and zeroed tails)
  pre_only,              // the compose launch's pre-signal copies alone (publish, pack; 0: none)
  compose_no_barrier,    // the compose launch with its barrier taken out (timing only; 0: none)
  plugin_compose,        // an exchange plugin's compose_layer alone (its rows written before the span)
  plugin_with_fill,      // an exchange plugin's layer (cpkv's rows write, compose_layer) as a replayed CUDA graph
};
// How a timing is taken, all through the plugin host (gpu/plugin_bench.cpp): the exchange table's
// own layer (kTheLayer: compose_layer launched from the host, or the cycle's layers replayed as a
// CUDA graph), or one of the bench's parts a plugin offers (cpkv_exchange_parts, a cpkv_part),
// replayed as a graph. A part the plugin does not offer is null in the JSON and '-' in the table.
inline constexpr std::int32_t kTheLayer = -1;
// What is kept of one timing, per batch: the median, min and max over replays of the batch's
// captured layer loop (CUDA graph), per layer, and the launches (graph nodes) per layer.
enum TimingStat : int { kMedian = 0, kMin = 1, kMax = 2, kNodes = 3, kTimingStats = 4 };

struct TimingRow {
  Timing timing;
  const char* name;
  // Min and max reported (else only the median and the launches are).
  bool spread;
  // JSON key stem of `cpkv bench`'s rows: <stem>_median (and _min, _max where spread); nullptr where
  // the CLI derives the row's figures from this timing and others.
  const char* json_stem;
  // JSON key of the launches per layer, or nullptr.
  const char* json_nodes;
  // The unit of its figures (per layer: the cycle's replays divided by its layers).
  const char* unit;
  // Its column in `cpkv bench --markdown` ("compose": "compose us", "compose min-max", "launches/layer
  // (compose)"), and what it times, for the table's legend; nullptr: no column of its own (the CLI
  // shows it through a derived figure).
  const char* column;
  const char* legend;
  // A median of 0 means the variant has no such part: the JSON holds null, the table "-".
  bool zero_is_none;
  std::int32_t part = kTheLayer;
};

inline constexpr TimingRow kTimingTable[] = {
    {Timing::with_fill, "with_fill", true, "with_fill_us_per_layer", "launches_per_layer_with_fill", "us", "with fill",
     "the layer including the producer step (the table's layer replayed as a CUDA graph: the 'plugin with fill' figure)", true},
    {Timing::compose_only, "compose_only", true, "compose_us_per_layer", "launches_per_layer_compose", "us", "compose",
     "the exchange alone (the fill done before the timed region; the plugin's part CPKV_PART_COMPOSE)", false, CPKV_PART_COMPOSE},
    {Timing::isolated, "isolated", false, nullptr, nullptr, "us", nullptr, nullptr, false, CPKV_PART_ISOLATED},
    {Timing::isolated_gather_only, "isolated_gather_only", false, nullptr, nullptr, "us", nullptr, nullptr, false, CPKV_PART_ISOLATED_NO_BARRIER},
    {Timing::fill_only, "fill_only", false, "fill_alone_us_per_layer", nullptr, "us", "fill alone", "the producer launch by itself (CPKV_PART_FILL)", false,
     CPKV_PART_FILL},
    {Timing::pre_only, "pre_only", false, "pre_signal_alone_us_per_layer", nullptr, "us", "pre-signal copies alone",
     "the compose launch's publish (staging_publish) or pack (v2) launched by itself, no barrier (CPKV_PART_PRE_SIGNAL)", true, CPKV_PART_PRE_SIGNAL},
    {Timing::compose_no_barrier, "compose_no_barrier", false, nullptr, nullptr, "us", nullptr, nullptr, false, CPKV_PART_NO_BARRIER},
    {Timing::plugin_compose, "plugin_compose", true, "plugin_compose_us_per_layer", nullptr, "us", "plugin compose",
     "the exchange plugin's compose_layer, between CUDA events on the rank's stream, launched from the host (no graph; the bytes checked "
     "outside the span, and cpkv's rows write into ctx->rows too, but a produce_rows plugin's producer, its fill, is inside it, as in "
     "'with fill': its x ideal then counts the fill)",
     false},
    {Timing::plugin_with_fill, "plugin_with_fill", true, "plugin_with_fill_us_per_layer", "launches_per_layer_plugin_with_fill", "us", "plugin with fill",
     "the exchange plugin's layer (cpkv's rows write where it reads ctx->rows, then compose_layer, a produce_rows plugin's producer inside it) "
     "captured once into a CUDA graph and replayed; '-' where the plugin does not declare CPKV_FLAG_REPLAYABLE",
     true},
};
inline constexpr int kTimings = static_cast<int>(std::size(kTimingTable));

constexpr bool timing_table_in_order() {
  for (int i = 0; i < kTimings; ++i) {
    if (static_cast<int>(kTimingTable[i].timing) != i) return false;
  }
  return true;
}
static_assert(timing_table_in_order(), "kTimingTable's rows are in Timing's order (rows are indexed by it)");
static_assert(kTimings == static_cast<int>(Timing::plugin_with_fill) + 1, "a row for every Timing");

constexpr int timing_index(Timing t) { return static_cast<int>(t); }

// The scalar ceilings: each rank measures one into the BenchRank field of the name, the bench folds
// them over the ranks into the Ceilings (model::MeasuredCeilings) field of the same name, the name
// is its key in `cpkv bench`'s "ceilings" object, and the label, unit and decimals make its part of
// the markdown's ceilings line, so a new scalar is one X(...) here (and its field in both structs).
// X(name, fold, label, unit, decimals): fold kLeast for a rate (the slowest rank), kMost for a wait
// (the longest).
enum CeilingFold : int { kLeast, kMost };
#define CPKV_BENCH_CEILING_SCALARS(X)                                                                        \
  X(ce_peer_gbps, kLeast, "copy-engine peer pull", "GB/s", 0)                                               \
  X(ce_push_gbps, kLeast, "copy-engine push into the peer", "GB/s", 0)                                      \
  X(local_copy_gbps, kLeast, "local copy", "GB/s", 0)                                                       \
  X(barrier_us, kMost, "barrier (launch included)", "us", 2)                                                \
  X(barrier_us_launch_free, kMost, "barrier launch-free (looped in one kernel)", "us", 2)                   \
  X(barrier_us_graph, kMost, "barrier as CUDA graph nodes", "us", 2)                                        \
  X(allreduce_busbw_gbps, kLeast, "NCCL all-reduce bus bandwidth at 64 MiB", "GB/s", 0)

// The gather sweep's rates, per page size and page count: X(rank_field, field, json_key), the
// BenchRank array each rank fills, the Ceilings::Gather field the bench folds it into (the slowest
// rank), and its key in each row of `cpkv bench`'s "ceilings"."gather".
#define CPKV_BENCH_GATHER_RATES(X)                               \
  X(gather_gbps, gbps, "gbps")                                   \
  X(gather_block_gbps, block_gbps, "block_per_page_gbps")        \
  X(gather_ce_batch_gbps, ce_batch_gbps, "ce_batch_gbps")        \
  X(gather_bulk_gbps, bulk_gbps, "bulk_tma_gbps")                \
  X(gather_push_gbps, push_gbps, "push_block_per_page_gbps")

// Whether the exchange offers what the row times: the table's layer always, a part where its
// cpkv_exchange_parts (nullptr: none) offers it.
constexpr bool timed_by(const TimingRow& row, const cpkv_exchange_parts* parts) {
  return row.part == kTheLayer || (parts != nullptr && (parts->offered & CPKV_PART_BIT(static_cast<std::uint32_t>(row.part))) != 0);
}

}  // namespace cpkv::cuda

// The GPU backend's one rank loop is the plugin host (plugin_host.cpp): every exchange, cpkv's own
// fused compose (the built-in table, gpu/fused/) and a foreign plugin's, runs through the exchange
// table (include/cpkv/exchange_abi.h). What the host shares with the rank's life (backend.cpp: the
// batches, then the drain check) and the bench (bench.cpp, plugin_bench.cpp) is declared here.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "device_plan.hpp"
#include "rank.hpp"

namespace cpkv::cuda {

// plugin_host.cpp: every batch of the source through the exchange plugin of CudaOptions::exchange,
// then quiescence (every flag drained).
void run_plugin_batches(Rank& r);

// plugin_bench.cpp: times an exchange's layers of the batch just run (its bytes checked first):
// compose_layer alone per layer between CUDA events, `write_rows(l)` before each span
// (plugin_compose); for a table that says CPKV_FLAG_REPLAYABLE, `write_rows(l)` and `compose_layer(l)`
// of the cycle captured once into a CUDA graph and replayed (plugin_with_fill, and with_fill); and
// every bench part `parts` offers (nullptr: none), `enqueue_part(part, l)` of the cycle captured and
// replayed (kTimingTable's part rows). `check` ends the run on a status that is not CPKV_OK outside
// a capture.
using PluginLayerCall = std::function<void(std::int32_t layer)>;
using PluginComposeCall = std::function<cpkv_status(std::int32_t layer)>;
using PluginPartCall = std::function<cpkv_status(std::int32_t part, std::int32_t layer)>;
using PluginStatusCheck = std::function<void(cpkv_status status, std::int32_t layer)>;
struct PluginTimedCalls {
  PluginLayerCall write_rows;
  PluginComposeCall compose_layer;
  PluginPartCall enqueue_part;
  PluginStatusCheck check;
};
void time_plugin_layers(Rank& r, std::int64_t batch_index, bool replayable, const cpkv_exchange_parts* parts, const PluginTimedCalls& calls);

// bench.cpp: `cycle` layers of `body` captured into a CUDA graph on the rank's stream, with the
// harness's own barriers inside it (the host's phase count is left as before the capture: the
// replays advance it). A body that returns a reason (not empty), or a capture CUDA refuses, leaves
// no graph and the reason in `why`; the capture is ended and its error cleared either way.
struct CapturedLayers {
  cudaGraph_t graph = nullptr;
  std::uint64_t barriers_per_replay = 0;
  std::string why;
};
CapturedLayers capture_layers(Rank& r, std::int32_t cycle, const std::function<std::string(std::int32_t)>& body);

// bench.cpp: per-layer times of a captured graph of `cycle` layers replayed `reps` times (after two
// warm-ups), sorted; `nodes` gets its launches per layer. Destroys the graph.
std::vector<double> replay_graph_us(Rank& r, cudaGraph_t graph, std::int32_t cycle, std::int32_t reps, std::uint64_t barriers_per_replay, double& nodes);

}  // namespace cpkv::cuda

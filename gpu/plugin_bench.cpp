// The bench's timings of an exchange plugin (kTimingTable's plugin rows), after the batch's layers
// ran and their bytes were checked (gpu/plugin_host.cpp):
// - plugin_compose: its compose_layer alone, per layer, between CUDA events on the rank's stream,
//   launched from the host. Each layer's rows are written before its start event, so neither
//   cpkv's rows write nor the byte check is inside a span (a produce_rows plugin's producer is: it
//   runs inside compose_layer).
// - plugin_with_fill: for a plugin whose table says CPKV_FLAG_REPLAYABLE, the cycle's layers (cpkv's
//   rows write, where the plugin reads ctx->rows, and compose_layer) captured once into a CUDA graph
//   and replayed, as cpkv's own exchange is timed (bench.cpp). A plugin that makes a host
//   synchronization or fails inside the capture is reported not replayable on every rank (no rank
//   replays a graph a peer's barrier would never meet), and its row is null.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "batch_run.hpp"

namespace cpkv::cuda {

namespace {

void keep(Rank& r, Timing timing, std::int64_t batch_index, const std::vector<double>& sorted_us, double nodes) {
  double(&t)[kTimingStats][kBenchBatchesMax] = r.ctx.boot->bench_results[r.ctx.rank].timing[timing_index(timing)];
  t[kMedian][batch_index] = sorted_us[sorted_us.size() / 2];
  t[kMin][batch_index] = sorted_us.front();
  t[kMax][batch_index] = sorted_us.back();
  t[kNodes][batch_index] = nodes;
}

void time_host_launched(Rank& r, std::int64_t batch_index, std::int32_t cycle, const PluginLayerCall& write_rows, const PluginComposeCall& compose_layer,
                        const PluginStatusCheck& check) {
  const std::int32_t reps = r.ctx.cuda.timing_reps;
  std::vector<cudaEvent_t> events(static_cast<std::size_t>(2 * cycle * reps));
  for (cudaEvent_t& e : events) CPKV_CUDA_CHECK(cudaEventCreate(&e));
  for (std::int32_t l = 0; l < cycle; ++l) {  // a warm-up round, untimed
    write_rows(l);
    check(compose_layer(l), l);
  }
  wait_device(r.ctx.progress, r.stream);
  r.barrier();  // every rank starts its timed rounds at once
  for (std::int32_t i = 0; i < reps; ++i) {
    for (std::int32_t l = 0; l < cycle; ++l) {
      write_rows(l);
      CPKV_CUDA_CHECK(cudaEventRecord(events[2 * (i * cycle + l)], r.stream));
      check(compose_layer(l), l);
      CPKV_CUDA_CHECK(cudaEventRecord(events[2 * (i * cycle + l) + 1], r.stream));
    }
  }
  wait_device(r.ctx.progress, r.stream);
  std::vector<double> us;  // per round: the cycle's compose spans over its layers
  for (std::int32_t i = 0; i < reps; ++i) {
    double round_us = 0;
    for (std::int32_t l = 0; l < cycle; ++l) {
      float ms = 0;
      CPKV_CUDA_CHECK(cudaEventElapsedTime(&ms, events[2 * (i * cycle + l)], events[2 * (i * cycle + l) + 1]));
      round_us += 1000.0 * ms;
    }
    us.push_back(round_us / cycle);
  }
  for (cudaEvent_t& e : events) CPKV_CUDA_CHECK(cudaEventDestroy(e));
  std::sort(us.begin(), us.end());
  keep(r, Timing::plugin_compose, batch_index, us, 0);
}

}  // namespace

void time_plugin_layers(Rank& r, std::int64_t batch_index, bool replayable, const PluginLayerCall& write_rows, const PluginComposeCall& compose_layer,
                        const PluginStatusCheck& check) {
  if (batch_index >= kBenchBatchesMax) return;
  const std::int32_t layers = r.ctx.options.layers;
  // Consecutive layers alternate parity halves (PROTOCOL.md section 6): cycle over an even count.
  const std::int32_t cycle = layers % 2 == 0 ? layers : layers - 1;
  time_host_launched(r, batch_index, cycle, write_rows, compose_layer, check);
  if (!replayable) return;
  const CapturedLayers captured = capture_layers(r, cycle, [&](std::int32_t l) {
    write_rows(l);
    const cpkv_status status = compose_layer(l);
    return status == CPKV_OK ? std::string() : fmt::format("compose_layer of layer {} returned status {} while capturing", l, static_cast<int>(status));
  });
  if (captured.graph == nullptr) {
    fmt::print(stderr, "cpkv bench: rank {} batch {}: the exchange plugin declares CPKV_FLAG_REPLAYABLE but its layers could not be captured ({}); "
                       "its 'plugin with fill' is '-'\n", r.ctx.rank, batch_index, captured.why);
  }
  // Every rank replays, or none does: a replayed barrier waits for every peer's.
  const std::vector<std::int32_t> captured_on = r.share(r.ctx.boot->plugin_captured, captured.graph != nullptr ? 1 : 0);
  if (std::count(captured_on.begin(), captured_on.end(), 1) != r.cp()) {
    if (captured.graph != nullptr) CPKV_CUDA_CHECK(cudaGraphDestroy(captured.graph));
    return;  // the row stays 0: null in the report
  }
  double nodes = 0;
  const std::vector<double> us = replay_graph_us(r, captured.graph, cycle, r.ctx.cuda.timing_reps, captured.barriers_per_replay, nodes);  // before `nodes` is read
  keep(r, Timing::plugin_with_fill, batch_index, us, nodes);
}

}  // namespace cpkv::cuda

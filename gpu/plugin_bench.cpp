// The bench's timings, one path for every exchange (kTimingTable's rows), after the batch's layers
// ran through the plugin host and their bytes were checked (gpu/plugin_host.cpp):
// - plugin_compose: the table's compose_layer alone, per layer, between CUDA events on the rank's
//   stream, launched from the host. Each layer's rows are written before its start event, so neither
//   cpkv's rows write nor the byte check is inside a span (a produce_rows plugin's producer is: it
//   runs inside compose_layer).
// - plugin_with_fill (and with_fill, the same figure): for a table that says CPKV_FLAG_REPLAYABLE, the
//   cycle's layers (cpkv's rows write, where the plugin reads ctx->rows, and compose_layer) captured
//   once into a CUDA graph and replayed.
// - the bench's parts the table offers (cpkv_exchange_parts: fill alone, compose alone, pre-signal
//   copies, no barrier, the isolated current exchange with and without its barrier), each the cycle's
//   enqueue_part calls captured once into a CUDA graph and replayed, in kTimingTable's order (compose
//   alone after the layer's replays, whose fill it reads).
// A capture that fails (a host synchronization, a status that is not CPKV_OK) is reported on every
// rank (no rank replays a graph a peer's barrier would never meet), and its row is null.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "plugin_host.hpp"

namespace cpkv::cuda {

namespace {

void keep(Rank& r, Timing timing, std::int64_t batch_index, const std::vector<double>& sorted_us, double nodes) {
  double(&t)[kTimingStats][kBenchBatchesMax] = r.ctx.boot->bench_results[r.ctx.rank].timing[timing_index(timing)];
  t[kMedian][batch_index] = sorted_us[sorted_us.size() / 2];
  t[kMin][batch_index] = sorted_us.front();
  t[kMax][batch_index] = sorted_us.back();
  t[kNodes][batch_index] = nodes;
}

void time_host_launched(Rank& r, std::int64_t batch_index, std::int32_t cycle, const PluginTimedCalls& calls) {
  const std::int32_t reps = r.ctx.cuda.timing_reps;
  std::vector<cudaEvent_t> events(static_cast<std::size_t>(2 * cycle * reps));
  for (cudaEvent_t& e : events) CPKV_CUDA_CHECK(cudaEventCreate(&e));
  for (std::int32_t l = 0; l < cycle; ++l) {  // a warm-up round, untimed
    calls.write_rows(l);
    calls.check(calls.compose_layer(l), l);
  }
  wait_device(r.ctx.progress, r.stream);
  r.barrier();  // every rank starts its timed rounds at once
  for (std::int32_t i = 0; i < reps; ++i) {
    for (std::int32_t l = 0; l < cycle; ++l) {
      calls.write_rows(l);
      CPKV_CUDA_CHECK(cudaEventRecord(events[2 * (i * cycle + l)], r.stream));
      calls.check(calls.compose_layer(l), l);
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

// `body`'s cycle captured once and replayed, on every rank or on none: per-layer times, sorted, or
// empty where some rank's capture failed (`what` names it on stderr).
std::vector<double> replayed_us(Rank& r, std::int64_t batch_index, std::int32_t cycle, const std::string& what,
                                const std::function<std::string(std::int32_t)>& body, double& nodes) {
  const CapturedLayers captured = capture_layers(r, cycle, body);
  if (captured.graph == nullptr) {
    fmt::print(stderr, "cpkv bench: rank {} batch {}: {} could not be captured into a CUDA graph ({}); its figures are '-'\n", r.ctx.rank, batch_index, what,
               captured.why);
  }
  // Every rank replays, or none does: a replayed barrier waits for every peer's.
  const std::vector<std::int32_t> captured_on = r.share(r.ctx.boot->plugin_captured, captured.graph != nullptr ? 1 : 0);
  if (std::count(captured_on.begin(), captured_on.end(), 1) != r.cp()) {
    if (captured.graph != nullptr) CPKV_CUDA_CHECK(cudaGraphDestroy(captured.graph));
    return {};  // the row stays 0: null in the report
  }
  return replay_graph_us(r, captured.graph, cycle, r.ctx.cuda.timing_reps, captured.barriers_per_replay, nodes);
}

// A status of a captured call as a capture's failure reason (empty: CPKV_OK).
std::string failed(cpkv_status status, const char* call, std::int32_t layer) {
  return status == CPKV_OK ? std::string() : fmt::format("{} of layer {} returned status {} while capturing", call, layer, static_cast<int>(status));
}

// Every part the table offers, in kTimingTable's order.
void time_parts(Rank& r, std::int64_t batch_index, std::int32_t cycle, const cpkv_exchange_parts& parts, const PluginTimedCalls& calls) {
  for (const TimingRow& row : kTimingTable) {
    if (row.part == kTheLayer || !timed_by(row, &parts)) continue;
    double nodes = 0;
    const std::vector<double> us = replayed_us(r, batch_index, cycle, fmt::format("its bench part {} ({})", row.part, row.name), [&](std::int32_t l) {
      calls.write_rows(l);  // where the plugin reads ctx->rows (a part may take its fill from there)
      return failed(calls.enqueue_part(row.part, l), "enqueue_part", l);
    }, nodes);
    if (!us.empty()) keep(r, row.timing, batch_index, us, nodes);
  }
}

}  // namespace

void time_plugin_layers(Rank& r, std::int64_t batch_index, bool replayable, const cpkv_exchange_parts* parts, const PluginTimedCalls& calls) {
  if (batch_index >= kBenchBatchesMax) return;
  const std::int32_t layers = r.ctx.options.layers;
  // Consecutive layers alternate parity halves (PROTOCOL.md section 6): cycle over an even count.
  const std::int32_t cycle = layers % 2 == 0 ? layers : layers - 1;
  time_host_launched(r, batch_index, cycle, calls);
  if (!replayable) return;
  double nodes = 0;
  const std::vector<double> us = replayed_us(r, batch_index, cycle, "the exchange plugin's layers (it declares CPKV_FLAG_REPLAYABLE)", [&](std::int32_t l) {
    calls.write_rows(l);
    return failed(calls.compose_layer(l), "compose_layer", l);
  }, nodes);
  if (us.empty()) return;
  keep(r, Timing::plugin_with_fill, batch_index, us, nodes);
  keep(r, Timing::with_fill, batch_index, us, nodes);  // the layer with its fill: the same graph
  if (parts != nullptr) time_parts(r, batch_index, cycle, *parts, calls);
}

}  // namespace cpkv::cuda

// The bench's timing of an exchange plugin (kTimingTable's plugin_compose row): after the batch's
// layers ran and their bytes were checked (gpu/plugin_host.cpp), its compose_layer alone, per layer,
// between CUDA events on the rank's stream. Each layer's rows are written before its start event,
// so neither the producer step nor the byte check is inside a span. A plugin may enqueue anything
// on the stream (or call the harness's all-reduce), so it is launched from the host, not captured
// into a graph as cpkv's own bodies are: its figure includes its launches.
#include <algorithm>
#include <vector>

#include "batch_run.hpp"

namespace cpkv::cuda {

void time_plugin_layers(Rank& r, std::int64_t batch_index, const PluginLayerCall& write_rows, const PluginLayerCall& compose_layer) {
  if (batch_index >= kBenchBatchesMax) return;
  const std::int32_t layers = r.ctx.options.layers;
  // Consecutive layers alternate parity halves (PROTOCOL.md section 6): cycle over an even count.
  const std::int32_t cycle = layers % 2 == 0 ? layers : layers - 1;
  const std::int32_t reps = r.ctx.cuda.timing_reps;
  std::vector<cudaEvent_t> events(static_cast<std::size_t>(2 * cycle * reps));
  for (cudaEvent_t& e : events) CPKV_CUDA_CHECK(cudaEventCreate(&e));
  for (std::int32_t l = 0; l < cycle; ++l) {  // a warm-up round, untimed
    write_rows(l);
    compose_layer(l);
  }
  wait_device(r.ctx.progress, r.stream);
  r.barrier();  // every rank starts its timed rounds at once
  for (std::int32_t i = 0; i < reps; ++i) {
    for (std::int32_t l = 0; l < cycle; ++l) {
      write_rows(l);
      CPKV_CUDA_CHECK(cudaEventRecord(events[2 * (i * cycle + l)], r.stream));
      compose_layer(l);
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
  double(&t)[kTimingStats][kBenchBatchesMax] = r.ctx.boot->bench_results[r.ctx.rank].timing[timing_index(Timing::plugin_compose)];
  t[kMedian][batch_index] = us[us.size() / 2];
  t[kMin][batch_index] = us.front();
  t[kMax][batch_index] = us.back();
  t[kNodes][batch_index] = 0;
}

}  // namespace cpkv::cuda

// One batch in flight on one rank, and the parts of one layer: what the functional executor
// (executor.cpp) runs and checks, and what the benchmark's bodies (bench_bodies.cpp) replay.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "device_plan.hpp"
#include "mutant_policy.hpp"
#include "rank.hpp"

namespace cpkv::cuda {

// Its plan on host and device, the launch arguments of every layer (pointer tables, destinations:
// batch values, built once), and the planted bug's switches (GpuMutantPolicy, gpu/mutant_policy.hpp;
// off unless asked for).
struct BatchRun {
  Rank& r;
  const BatchPlan& b;
  const DevicePlan& d;
  kernels::VerifyResult* verify;
  std::vector<kernels::ProduceArgs> produce;  // [layer]
  std::vector<kernels::ComposeArgs> compose;  // [layer]
  std::vector<std::vector<kernels::PointerTable>> tables;  // [layer][kind]
  std::uint64_t peer_pages_per_kind = 0;                   // pages gathered from peers, per kind and layer
  std::uint64_t peer_bytes = 0;
  GpuMutantPolicy mutant;

  std::int32_t half_of(std::int32_t l) const { return mutant.half_of(l); }
};

// What one kind's collectives of a layer reduced: calls and bytes.
struct Reduced {
  std::int64_t calls = 0;
  std::uint64_t bytes = 0;
};

// The parts of one layer, with no host synchronization inside, as the plan says: the dense half
// cleared, the producer step, the fused compose launch (the host's barrier phase follows it), and,
// per active kind, the all-reduces and the unpack.
void clear_dense(BatchRun& run, std::int32_t l);
void produce(BatchRun& run, std::int32_t l);
void compose(BatchRun& run, std::int32_t l);
Reduced layer_collectives(BatchRun& run, std::int32_t l, std::size_t k);

// What every exchange's batch shares (executor.cpp), cpkv's own and a plugin's (plugin_host.cpp):
// the pool content of the pages this rank owns and garbage in the dense buffers; the verify kernel
// of one kind of a layer over dense half `half`; a violation; what the device found in the batch
// (the barrier status, wrong bytes), recorded.
// The pool content of the pages this rank owns, every layer and kind (no synchronization): what
// populate and the plugin host's guarded populate both write first.
void populate_pools(Rank& r, const BatchPlan& b, const DevicePlan& d);
void populate(Rank& r, const BatchPlan& b, const DevicePlan& d);
void verify_kind(Rank& r, const BatchPlan& b, const DevicePlan& d, kernels::VerifyResult* verify, std::int32_t l, std::size_t k, std::int32_t half);
harness::Violation violation(std::int32_t invariant, std::int32_t rank, std::int64_t batch, std::int32_t layer, const std::string& detail);
void collect_findings(Rank& r, std::int64_t batch_index, kernels::VerifyResult* verify);

// plugin_host.cpp: every batch of the source through the exchange plugin of CudaOptions::exchange.
void run_plugin_batches(Rank& r, kernels::VerifyResult* verify);

// plugin_bench.cpp: times an exchange plugin's layers of the batch just run (its bytes checked
// first): compose_layer alone per layer between CUDA events, `write_rows(l)` before each span
// (plugin_compose); and, for a plugin whose table says CPKV_FLAG_REPLAYABLE, `write_rows(l)` and
// `compose_layer(l)` of the cycle captured once into a CUDA graph and replayed (plugin_with_fill).
// `check` ends the run on a status that is not CPKV_OK outside a capture.
using PluginLayerCall = std::function<void(std::int32_t layer)>;
using PluginComposeCall = std::function<cpkv_status(std::int32_t layer)>;
using PluginStatusCheck = std::function<void(cpkv_status status, std::int32_t layer)>;
void time_plugin_layers(Rank& r, std::int64_t batch_index, bool replayable, const PluginLayerCall& write_rows, const PluginComposeCall& compose_layer,
                        const PluginStatusCheck& check);

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

// bench_bodies.cpp: times the batch just run (its bytes checked first) with every body of
// kTimingTable; the isolated exchange's current pages are uploaded through `uploads`.
void time_run(BatchRun& run, DeviceUploads& uploads, std::int64_t batch_index);

}  // namespace cpkv::cuda

// The bootstrap segment: what the rank processes of one GPU run exchange once (IPC handles, the
// NCCL id, the capability probe) and what they report back (totals, violations, benchmark figures),
// in one shared-memory region created before the ranks fork. Where each rank is lives in the
// harness's progress records. Also the host-side waits every GPU rank uses.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include <cuda_runtime.h>
#include <nccl.h>

#include "checks.cuh"
#include "cpkv/exchange_abi.h"
#include "config.cuh"
#include "cpkv/harness/launch.hpp"
#include "cpkv/harness/run.hpp"
#include "cpkv/model/limits.hpp"
#include "cuda_backend.hpp"

namespace cpkv::cuda {

using Clock = std::chrono::steady_clock;
inline constexpr int kRanksMax = kernels::kCpMax;   // the cuda backend's cap, one node's GPUs (its registry entry's ranks_max)
inline constexpr int kBenchBatchesMax = kBenchBatchesLimit;
inline constexpr std::int64_t kHostWaitMsMax = 120000;  // the declared silence of an NCCL init or destroy (a first init is slow)
static_assert(kRanksMax <= harness::kRanksMax, "the launcher carves a progress record for every rank");
static_assert(kernels::kTableEntriesMax == 2 * kRanksMax + 2, "the pointer table holds 2*cp_max gather entries and the two own bases");

// The ceilings' gather sweep: two page sizes (fp8 KV, indexer K at 64 rows) by four page counts.
inline constexpr int kCeilingPageSizes = 2;
inline constexpr int kCeilingCounts = 4;
inline constexpr std::uint64_t kCeilingPageBytes[kCeilingPageSizes] = {656ULL * 64, 132ULL * 64};
inline constexpr std::int64_t kCeilingPageCounts[kCeilingCounts] = {64, 256, 1024, 4096};
// NCCL all-reduce sizes of the bench's time-per-call curve (the model interpolates between them):
// from a latency-bound call to the 64 MiB of the bus-bandwidth ceiling, spanning the per-span,
// compact and whole-buffer all-reduces of the bundled traces (about 0.2 to 70 MB).
inline constexpr int kAllreduceSizes = 6;
inline constexpr std::uint64_t kAllreduceSizeBytes[kAllreduceSizes] = {4ULL << 10, 64ULL << 10, 512ULL << 10, 2ULL << 20, 8ULL << 20, 64ULL << 20};

// What one rank measured in benchmark mode.
struct BenchRank {
  // Per batch, per timing of kTimingTable (gpu/bench_timings.hpp): median, min, max (where the row
  // keeps its spread) and launches per layer.
  double timing[kTimings][kTimingStats][kBenchBatchesMax];
  double ce_peer_gbps;
  double local_copy_gbps;
  double barrier_us;
  double barrier_us_launch_free;
  double barrier_us_graph;       // back-to-back as nodes of one CUDA graph
  double allreduce_busbw_gbps;   // NCCL sum all-reduce of 64 MiB (0 where NCCL is not used)
  double allreduce_curve_us[kAllreduceSizes];  // per call at kAllreduceSizeBytes, as CUDA graph nodes
  double gather_gbps[kCeilingPageSizes][kCeilingCounts];        // the fused compose copy (a warp per page, or per 64-KiB chunk)
  double gather_block_gbps[kCeilingPageSizes][kCeilingCounts];  // the single-list gather (block per page)
  double gather_ce_batch_gbps[kCeilingPageSizes][kCeilingCounts];  // copy engines, one cudaMemcpyBatchAsync
  double gather_bulk_gbps[kCeilingPageSizes][kCeilingCounts];      // the bulk-copy (TMA) gather (cpkv bench --bulk; else 0)
  double gather_push_gbps[kCeilingPageSizes][kCeilingCounts];      // the same pages pushed: block per page, stores into the peer
  double ce_push_gbps;                                             // cudaMemcpyAsync into the peer's buffer
  std::int64_t host_syncs_in_layer_loop;
};

struct Bootstrap {
  std::atomic<std::uint64_t> arrivals[kRanksMax];
  cudaIpcMemHandle_t pool[kRanksMax];
  cudaIpcMemHandle_t staging[kRanksMax];
  cudaIpcMemHandle_t dense[kRanksMax];
  cudaIpcMemHandle_t pad[kRanksMax];
  cudaIpcMemHandle_t compact[kRanksMax];
  std::atomic<std::int32_t> probe[kRanksMax];
  std::atomic<std::int32_t> path[kRanksMax];
  ncclUniqueId nccl_id;
  std::int64_t wait_ms_max = 120000;                 // every host wait (CudaOptions::wait_ms_max; the barrier stress tool keeps this default)
  std::atomic<std::int64_t> batches_done[kRanksMax];  // for the progress callback
  std::atomic<std::int64_t> layers_done[kRanksMax];   // likewise, per layer (a rejected batch counts its layers once past it)
  harness::Totals totals[kRanksMax];
  std::atomic<std::int64_t> violation_count;
  std::atomic<std::int64_t> violations_by_invariant[harness::kInvariants + 1];  // every violation, kept or not
  harness::Violation violations[harness::kViolationsMax];
  cudaIpcMemHandle_t bench[kRanksMax];
  // An exchange plugin's symmetric allocations (alloc_symmetric, in call order) and each rank's
  // verdict on the batch in flight (1: it refused it as an overflow), compared for invariant 3.
  cudaIpcMemHandle_t symmetric[kRanksMax][CPKV_SYMMETRIC_MAX];
  std::atomic<std::int32_t> plugin_refused[kRanksMax];
  // Whether each rank captured the plugin's timed layers into a graph (plugin_bench.cpp): all, or none replays.
  std::atomic<std::int32_t> plugin_captured[kRanksMax];
  // The plugin call each rank is inside (call: 1 + its index in kPluginCalls, 0 between calls), and
  // 1 once its plugin host returned from teardown: a rank whose process ended inside a call, or
  // without finishing (exit status 0 included), is a failure naming the call (plugin_host.cpp).
  struct PluginCall {
    std::atomic<std::int32_t> call;
    std::atomic<std::int32_t> layer;
    std::atomic<std::int64_t> batch;
  };
  PluginCall plugin_call[kRanksMax];
  std::atomic<std::int32_t> plugin_finished[kRanksMax];
  // Each rank's attention plan of the batch in flight (the queries of its segments), for the check
  // of coverage across ranks (invariant 9, plugin_host.cpp: check_attention); count -1: its own
  // plan was already found wrong on the rank.
  struct AttentionQueries {
    std::int32_t request, q_base, q_len;
  };
  // Per rank and batch: the one limit (its reason in model/limits.hpp), which the backend's entry
  // checks against every batch's model plan before any rank starts (harness/attention_limit.hpp).
  static constexpr std::int64_t kAttentionSegmentsMax = model::limits::attention_segments_max;
  std::atomic<std::int64_t> attention_count[kRanksMax];
  AttentionQueries attention[kRanksMax][kAttentionSegmentsMax];
  BenchRank bench_results[kRanksMax];
  // barrier_stress results
  std::atomic<std::uint64_t> phase_errors[kRanksMax];
  std::atomic<std::uint64_t> timeouts[kRanksMax];
  std::atomic<std::int32_t> drained[kRanksMax];
  double us_per_barrier[kRanksMax];
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);

// plugin_host.cpp: the run's failure with what the plugin calls left (Bootstrap::plugin_call,
// plugin_finished): a rank that ended inside a plugin call is named with the call; a rank that ended
// without finishing, while the launcher saw every rank exit 0, makes the run fail.
inline constexpr const char* kPluginCalls[] = {"setup", "begin_batch", "compose_layer", "end_batch", "teardown", "enqueue_part"};
std::string with_plugin_calls(const Bootstrap& boot, std::int32_t cp, const std::string& plugin, const std::string& failure);

// Keeps the first kViolationsMax violations and counts every one, by invariant.
void record(Bootstrap* boot, const harness::Violation& v);

// Waits for the rank's queued GPU work, marked as a wait so that the launcher's watchdog blames a
// silent peer and not this rank.
void wait_device(harness::RankProgress& progress, cudaStream_t stream);

// Host-side barrier among the rank processes (setup and batch boundaries only, never per layer).
void host_barrier(Bootstrap* boot, harness::RankProgress& progress, std::int32_t rank, std::int32_t cp, std::uint64_t& phase);

// Device faults named (issue 35, item 4). A kernel that faults leaves a sticky error that the next
// CUDA call or synchronization of the rank returns, wherever the host is by then; once a rank
// process calls name_device_faults, such a failed call (CPKV_CUDA_CHECK, checks.cuh) ends the rank
// with one located line instead of an abort: the rank, the batch and layer, what the device was
// running when it faulted (`device_place`, where the rank knows it: the plugin host's milestones,
// gpu/plugin_guards.hpp) or else where the host was, CUDA's text, and the call that saw it.
struct FaultSite {
  std::int32_t rank = -1;
  harness::Progress* progress = nullptr;       // the host's batch, layer and step
  std::function<std::string()> device_place;   // empty result: not known (the host's place is said)
};
FaultSite& fault_site();
void name_device_faults(std::int32_t rank, harness::Progress& progress);
// The sticky error the context holds once a kernel faulted (every later call returns it), else
// cudaSuccess; context_lost: there is one.
cudaError_t sticky_error();
bool context_lost();
// The located line of a CUDA failure seen at `seen_at` ("file:line: call").
std::string device_fault_line(const std::string& seen_at, cudaError_t error);

}  // namespace cpkv::cuda

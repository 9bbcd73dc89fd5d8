// The GPU backend: one process per rank (forked before any CUDA call), rank r on GPU r % gpu_count,
// pool / staging / dense / flags in device memory shared through CUDA IPC, handles and the NCCL id
// exchanged through a Boost.Interprocess bootstrap segment, the IPC capability probed per rank and
// agreed (MIN) over the group. Fills the same Backend interface as the simulator.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cpkv/harness/exchange_plugin.hpp"
#include "cpkv/harness/request.hpp"
#include "cpkv/harness/run.hpp"
#include "cpkv/model/costs.hpp"
#include "cpkv/model/setting.hpp"
#include "bench_timings.hpp"
#include "pool_backing.hpp"

namespace cpkv::cuda {

inline constexpr int kBenchBatchesLimit = 16;        // batches a benchmark run reports
inline constexpr std::uint64_t kBenchBufferBytes = 512ULL << 20;  // ceilings: 256 MiB source + 256 MiB landing

struct CudaOptions {
  bool verify = true;                 // recompute and compare every dense byte after every layer
  std::int64_t run_ms_max = 600000;   // the whole run, from the launcher
  // No rank made progress this long (a stopped or hung rank the others wait for, in a device
  // barrier, a collective or a host barrier): the launcher ends the run and names the rank. Longer
  // than any healthy silence (NCCL init, a batch's device work: seconds), far shorter than the
  // host barrier's 120 s.
  std::int64_t stuck_ms_max = 30000;
  // Benchmark mode: time `timing_reps` layers of every batch (after a warm-up); 0 = functional only.
  std::int32_t timing_reps = 0;
  bool measure_ceilings = false;      // copy-engine peer pull, local copy, barrier, gather sweeps
  // Any single host-side wait of a rank (setup and batch-boundary barriers). Longer than the
  // simulator's default: a first NCCL init on a peer can take tens of seconds. `replay` passes
  // --wait-ms-max when it is given.
  std::int64_t wait_ms_max = 120000;
  // Called on the launching thread with the layers every rank has finished (a rejected batch counts
  // its layers once a rank is past it; about every 100 ms); for a progress bar. May be empty.
  std::function<void(std::int64_t layers_done)> on_progress;
  // A test's fault, no planted bug: this rank's compose launch spins kMutantWindowCycles after its
  // first flag wait (the slow_reader knob, kernels/compose_kernels.cu), so a peer that passes a
  // layer without that rank's arrival overwrites what it still reads. -1: none.
  std::int32_t slow_reader_rank = -1;
  // The exchange: a loaded plugin (include/cpkv/exchange_abi.h; cpkv's own fused compose is the
  // plugin "builtin"), run by the plugin host, the backend's one rank loop. Null in make_cuda_backend
  // means the built-in one.
  std::shared_ptr<const harness::ExchangePlugin> exchange;
  // The memory line (each GPU's need beside its free memory) last printed by the runs that share
  // this, so a request's variants print it once per size; null: print it for every run. The
  // backend a registry entry makes shares one over its runs, as the bench does over its variants.
  std::shared_ptr<std::string> need_line_printed;
  // A rotating slow rank: on layer l of batch b, rank (b + l) % cp spins this many cycles on its
  // stream before its exchange starts (0: none; replay --swarm draws it from the seed).
  std::int64_t slow_rank_cycles = 0;
  // --timeline: the timeline's temporary file (its head written by the front end); each rank
  // appends to its part file beside it and the run merges them (gpu/timeline.hpp). Empty: none.
  std::string timeline;
  // The request's knobs (harness/request.hpp: kKnobTable), resolved by check_request: nothing
  // below the request reads the environment.
  PoolMemory pool_memory = PoolMemory::sparse;
  std::int32_t compose_blocks_per_sm = 0;  // the compose grid's cap per SM; 0: the kernels' kComposeBlocksPerSm
  bool bench_bulk = false;                 // the bench also times the bulk-copy (TMA) gather
};
// The request's knobs into a backend's options (the cuda entry's make and the bench).
void apply_knobs(const harness::ReplayRequest& request, CudaOptions& options);

// Ceilings measured in the same run (all ranks at once), worst rank: the cost model's own input type.
using Ceilings = model::MeasuredCeilings;

struct BenchResult {
  harness::RunReport report;
  // Per batch, per timing of kTimingTable (gpu/bench_timings.hpp), folded over the ranks: the worst
  // rank (the longest time, the most launches), the least for a minimum.
  std::vector<double> timing[kTimings][kTimingStats];
  const std::vector<double>& per_batch(Timing t, TimingStat stat = kMedian) const { return timing[timing_index(t)][stat]; }
  Ceilings ceilings;
  std::int64_t host_syncs_in_layer_loop = 0;
};

// A functional run that also times every batch (and measures the ceilings if asked).
BenchResult run_bench(const harness::BatchSource& source, const harness::RunOptions& options, const CudaOptions& cuda);

// `cpkv bench` (the "cuda" entry's bench, gpu/bench_report.cpp): every variant of the request timed
// through the request's exchange table (the built-in plugin by default) and the bench parts it
// offers, beside the ceilings of the same run and the cost model's prediction; the JSON rows and
// the markdown.
harness::BenchReport bench_report(const harness::CheckedBench& c, const harness::BatchSource& source, const harness::BenchPrint& print);

// GPUs visible, probed in a forked child so this process never touches CUDA (fork-safety).
// 0 where there is no driver or no device.
int gpu_count();
// gpu_count, refused where it is 0: the request's one line naming --backend (every GPU front end's:
// the replay, the bench, the GPU planted bugs).
int gpus_or_refuse();

std::unique_ptr<harness::Backend> make_cuda_backend(CudaOptions options);

// `--backend cuda` runs cpkv's own fused compose through the plugin ABI ("builtin", gpu/fused/)
// when neither --exchange nor CPKV_EXCHANGE (read by the request check) names another; so does
// every make_cuda_backend whose CudaOptions::exchange is null (the gpu tests). "inprocess" is gone
// and refused (harness::kInProcessGone).
// Registers "cuda": one process per rank, rank r on GPU r % gpu_count; the planted bugs marked
// kGpuHolds; wait_ms_max and stuck_ms_max (defaults: CudaOptions'). Refuses a machine with no GPU.
void register_backend(harness::Registry& registry);

// The counting barrier on its own, one process per rank: `iterations` barriers with a slow
// producer rotating over the ranks (rank i % cp spins `slow_delay_us` before stamping), each rank
// stamping the phase into a parity word before arriving and checking every peer's stamp after
// passing (phase safety), then `timed_barriers` back-to-back barriers timed with CUDA events.
struct BarrierStressOptions {
  std::int32_t cp = 2;
  std::int32_t iterations = 200;
  std::int32_t slow_delay_us = 10000;
  std::int32_t timed_barriers = 0;
  std::int64_t run_ms_max = 300000;
  std::int64_t stuck_ms_max = 30000;
};
struct BarrierStressReport {
  std::string failure;                  // empty when every rank finished
  std::uint64_t phase_errors = 0;       // stamps seen != phase after passing (must be 0)
  std::uint64_t timeouts = 0;           // barrier polls that gave up (must be 0)
  bool drained = false;                 // every pad word == phases at quiescence
  std::vector<double> us_per_barrier;   // per rank, back-to-back, launch included
};
BarrierStressReport barrier_stress(const BarrierStressOptions& options);

// Planted bugs the GPU backend can switch on: the rows of harness::kMutantTable marked kGpuHolds
// (harness::kGpuMutants); any other is refused, the simulator holds the rest.
// The small setting of the GPU planted-bug runs and the GPU tests: cp ranks, page 16, kv_fp8 +
// indexer_k, layers FSFS, 64 pool pages, batches of up to 8 requests and 1024 new tokens.
model::Setting gpu_small_setting(std::int32_t cp);
// The workload the GPU planted bugs run on: gpu_small_setting(cp) and one batch with a cached
// prefix, partial last pages (zero tails) and a page for every rank to write.
harness::BatchSource gpu_mutant_source(std::int32_t cp);
inline constexpr std::int32_t kGpuMutantLayers = 4;
// The workload of a plugin's planted bugs: gpu_mutant_source(cp)'s batch, then a second of another
// shape (the harness's stale plan and page inverse only show in a batch after the first).
harness::BatchSource gpu_plugin_mutant_source(std::int32_t cp);
// The report's first finding in one line (the first wrong byte, located, or the first violation, or
// the failure); empty when the run was clean.
std::string first_finding(const harness::RunReport& report);

// The verify kernel checked against itself, in a forked child (this process never touches CUDA):
// content written to a few pages verifies clean; then one byte is flipped and the kernel must find
// exactly that byte, with its slot, row, byte index and both values.
struct VerifySelfTest {
  std::string failure;                    // why it could not run (empty: it ran)
  std::uint64_t wrong_bytes_clean = 0;    // before the corruption (must be 0)
  std::uint64_t wrong_bytes_corrupted = 0;  // after it (must be 1)
  std::int64_t slot = -1, planted_slot = -1;
  std::int32_t row = -1, planted_row = -1;
  std::int32_t byte = -1, planted_byte = -1;
  std::int32_t expected = -1, actual = -1, planted_expected = -1, planted_actual = -1;
};
VerifySelfTest verify_self_test();

}  // namespace cpkv::cuda

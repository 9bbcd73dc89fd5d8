// The benchmark's bodies of one batch, one per row of kTimingTable (gpu/bench_timings.hpp): the
// parts of the functional layer (batch_run.hpp) replayed uncounted and unchecked, and the parts the
// bench times on their own. The functional executor (executor.cpp) carries none of them.
#include <cstdint>
#include <vector>

#include "batch_run.hpp"

namespace cpkv::cuda {

namespace {

// The layer as the functional executor runs it, uncounted and unchecked; without `fill` the
// producer step is left out (the compose-only timing, whose fill the replays before it did).
void timed_layer(BatchRun& run, std::int32_t l, bool fill) {
  const model::Setting& setting = run.r.ctx.source.setting;
  clear_dense(run, l);
  if (fill) produce(run, l);
  compose(run, l);
  for (std::size_t k = 0; k < setting.kinds.size(); ++k) {
    if (setting.kind_active(k, l)) layer_collectives(run, l, k);
  }
}

// The isolated current-page exchange, for the benchmark (what it is comes from the plan, as the
// variant table's `isolated` column says): the fused launch with only the current pages where the
// plan has a barrier, the compact all-reduce of the same pages where it has one. Without
// `with_barrier` the same gather runs with no flag (timing only: the barrier's share is the
// difference).
void run_isolated(BatchRun& run, std::int32_t l, const kernels::GatherEntry* current_only, std::int64_t current_count, bool with_barrier) {
  Rank& r = run.r;
  const model::Setting& setting = r.ctx.source.setting;
  if (run.b.plan.barrier) {
    kernels::ComposeArgs a = run.compose[l];
    a.entries = current_only;
    a.pre_count = 0;
    a.count = current_count;
    a.barrier = with_barrier ? kernels::kSignalAtStart : kernels::kNoBarrier;
    a.order_pre = 0;
    if (with_barrier) ++r.barrier_phase;
    CPKV_CUDA_CHECK(kernels::launch_compose(a, r.stream));
  }
  for (std::size_t k = 0; k < setting.kinds.size(); ++k) {
    if (setting.kind_active(k, l) && run.b.plan.compact_allreduce) {
      r.all_reduce(r.mem.compact + r.mem.layout.compact_offset[k], r.mem.peer_compact, r.mem.layout.compact_offset[k], run.b.plan.compact_pages * r.page_bytes(k));
    }
  }
}

// The compose launch's pre-signal copies alone (staging_publish's publish, v2's pack), no barrier:
// what the bench sets beside the whole launch to see how much of the pre phase the rest overlaps.
// Nothing is launched where the launch has no pre-signal copies.
void run_pre_only(BatchRun& run, std::int32_t l) {
  kernels::ComposeArgs a = run.compose[l];
  if (a.pre_count == 0) return;
  a.count = a.pre_count;
  a.barrier = kernels::kNoBarrier;
  a.order_pre = 0;
  CPKV_CUDA_CHECK(kernels::launch_compose(a, run.r.stream));
}

// The compose launch of the layer with its barrier taken out, for the benchmark: what the barrier
// costs inside the layer as run is the difference (timing only: without the flags the bytes read
// from peers' staging may be stale). Nothing is launched where the launch has no barrier.
void run_compose_no_barrier(BatchRun& run, std::int32_t l) {
  kernels::ComposeArgs a = run.compose[l];
  if (a.barrier == kernels::kNoBarrier) return;
  a.barrier = kernels::kNoBarrier;
  CPKV_CUDA_CHECK(kernels::launch_compose(a, run.r.stream));
}

}  // namespace

void time_run(BatchRun& run, DeviceUploads& uploads, std::int64_t batch_index) {
  Rank& r = run.r;
  std::vector<kernels::GatherEntry> current_only;
  for (const kernels::GatherEntry& e : run.b.gather2) {
    if (e.table_index >= r.cp() && e.table_index < 2 * r.cp()) current_only.push_back(e);
  }
  const kernels::GatherEntry* d_current_only = uploads.upload(current_only);
  const std::int64_t current_count = static_cast<std::int64_t>(current_only.size());
  LayerBodies bodies;
  bodies[timing_index(Timing::with_fill)] = [&](std::int32_t l) { timed_layer(run, l, true); };
  bodies[timing_index(Timing::compose_only)] = [&](std::int32_t l) { timed_layer(run, l, false); };
  bodies[timing_index(Timing::isolated)] = [&](std::int32_t l) { run_isolated(run, l, d_current_only, current_count, true); };
  bodies[timing_index(Timing::isolated_gather_only)] = [&](std::int32_t l) { run_isolated(run, l, d_current_only, current_count, false); };
  bodies[timing_index(Timing::fill_only)] = [&](std::int32_t l) { CPKV_CUDA_CHECK(kernels::launch_produce(run.produce[l], r.stream)); };
  bodies[timing_index(Timing::pre_only)] = [&](std::int32_t l) { run_pre_only(run, l); };
  bodies[timing_index(Timing::compose_no_barrier)] = [&](std::int32_t l) { run_compose_no_barrier(run, l); };
  time_batch(r, batch_index, bodies, r.ctx.boot->bench_results[r.ctx.rank]);
}

}  // namespace cpkv::cuda

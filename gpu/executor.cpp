// The layer executor: one GPU rank's life (set-up, the batches, quiescence) and, per batch, the
// plan's uploads, pool population, the layers (no host synchronization inside), one synchronization
// after them, and the checks of what the device found (barrier timeouts, wrong bytes).
#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "cpkv/model/expected.hpp"
#include "batch_run.hpp"
#include "timeline.hpp"

namespace cpkv::cuda {

namespace {

kernels::PointerTable pointer_table(const BatchRun& run, std::int32_t l, std::size_t k) {
  const RankMemory& mem = run.r.mem;
  const std::int32_t cp = run.r.cp();
  const std::int32_t h = run.half_of(l);
  const bool symm = model::info(run.r.variant).peer_pages == model::PeerPages::dense;
  kernels::PointerTable t{};
  for (std::int32_t p = 0; p < cp; ++p) {
    t.base[p] = mem.peer_pool[p] ? mem.peer_pool[p] + mem.layout.pool_offset[l][k] : nullptr;
    t.base[cp + p] = symm ? (mem.peer_dense[p] ? mem.peer_dense[p] + mem.layout.dense_offset[h][k] : nullptr)
                          : (mem.peer_staging[p] ? mem.peer_staging[p] + mem.carve.slot_offset(h, k, 0) : nullptr);
  }
  t.base[kernels::kTableOwnDense] = mem.dense_half(h, k);
  t.base[kernels::kTableOwnCompact] = mem.compact + mem.layout.compact_offset[k];
  return t;
}

kernels::ComposeArgs compose_args(const BatchRun& run, std::int32_t l) {
  const Rank& r = run.r;
  const model::Setting& setting = r.ctx.source.setting;
  const std::int32_t h = run.half_of(l);
  kernels::ComposeArgs a{};
  for (std::size_t k = 0; k < setting.kinds.size(); ++k) {
    if (!setting.kind_active(k, l)) continue;
    kernels::ComposeKind& ck = a.kind[a.kinds++];
    ck.dst[kernels::kToDense] = r.mem.dense_half(h, k);
    ck.dst[kernels::kToStaging] = r.mem.staging_half(h, k);
    ck.dst[kernels::kToCompact] = r.mem.compact + r.mem.layout.compact_offset[k];
    kernels::set_page_geometry(ck, r.page_bytes(k));
    ck.table = run.tables[l][k];
  }
  a.entries = run.d.compose;
  a.pre_count = run.b.compose_pre;
  a.count = static_cast<std::int64_t>(run.b.compose.size());
  a.peer_pads = r.mem.pad_table;
  a.rank = r.ctx.rank;
  a.cp = r.cp();
  a.state = r.mem.barrier_state;
  a.status = r.mem.barrier_status;
  a.barrier = compose_barrier(run.b, run.mutant);
  a.phase_lag = run.mutant.barrier_phase_lag();
  const bool slow = run.mutant.slow_reader() || r.ctx.cuda.slow_reader_rank == r.ctx.rank;
  a.reader_spin_cycles = slow ? kernels::kMutantWindowCycles : 0;
  a.order_pre = run.b.pack.empty() ? 0 : 1;
  return a;
}

kernels::ProduceArgs produce_args(const BatchRun& run, std::int32_t l) {
  const Rank& r = run.r;
  const model::Setting& setting = r.ctx.source.setting;
  const std::int32_t h = run.half_of(l);
  kernels::ProduceArgs a{};
  for (std::size_t k = 0; k < setting.kinds.size(); ++k) {
    if (!setting.kind_active(k, l)) continue;
    std::uint8_t* dest = run.b.plan.fill_to_staging ? r.mem.staging_half(h, k) : r.mem.dense_half(h, k);
    a.kind[a.kinds++] = {dest, setting.kinds[k].row_bytes, static_cast<std::uint32_t>(k)};
  }
  a.page_size = setting.page_size;
  a.pages = run.d.produce_pages;
  a.row_token = run.d.row_token;
  a.page_count = static_cast<std::int64_t>(run.b.produce_pages.size());
  a.request = run.d.inv_request;
  a.token = run.d.inv_token;
  a.seed = r.ctx.options.seed;
  a.layer = static_cast<std::uint32_t>(l);
  a.zero_tails = run.b.plan.zero_own_current && !run.mutant.skips_zero() ? 1 : 0;
  return a;
}

// The launch arguments of every layer and the pages gathered from peers: batch values, built once,
// not on every layer.
void build_launches(BatchRun& run) {
  const std::int32_t layers = run.r.ctx.options.layers;
  const std::size_t kinds = run.r.ctx.source.setting.kinds.size();
  CPKV_ASSERT(kinds <= static_cast<std::size_t>(kernels::kKindsMax));
  run.tables.assign(layers, std::vector<kernels::PointerTable>(kinds));
  for (std::int32_t l = 0; l < layers; ++l) {
    for (std::size_t k = 0; k < kinds; ++k) run.tables[l][k] = pointer_table(run, l, k);
    run.compose.push_back(compose_args(run, l));
    run.produce.push_back(produce_args(run, l));
  }
  run.peer_pages_per_kind = peer_pages_per_kind(run.b, run.r.cp(), run.r.ctx.rank);
}

}  // namespace

void verify_kind(Rank& r, const BatchPlan& b, const DevicePlan& d, kernels::VerifyResult* verify, std::int32_t l, std::size_t k, std::int32_t half) {
  const model::Setting& setting = r.ctx.source.setting;
  const std::size_t kinds = setting.kinds.size();
  const TimelineSpan span(r, "verify", l);
  CPKV_CUDA_CHECK(kernels::launch_verify(r.mem.dense_half(half, k), setting.kinds[k].row_bytes, setting.page_size, d.slots,
                                         static_cast<std::int64_t>(b.slots.size()), r.ctx.options.seed, static_cast<std::uint32_t>(l),
                                         static_cast<std::uint32_t>(k), verify + l * kinds + k, r.stream));
}

// After the compose launch, one kind: the all-reduces and the unpack.
Reduced layer_collectives(BatchRun& run, std::int32_t l, std::size_t k) {
  Rank& r = run.r;
  const std::int32_t h = run.half_of(l);
  const std::uint64_t pb = r.page_bytes(k);
  Reduced reduced;
  for (const model::SlotRange& range : run.b.plan.allreduce_ranges) {
    const TimelineSpan span(r, "allreduce", l);
    const std::uint64_t offset = r.mem.layout.dense_offset[h][k] + range.slot_begin * pb;
    r.all_reduce(r.mem.dense + offset, r.mem.peer_dense, offset, (range.slot_end - range.slot_begin) * pb);
    ++reduced.calls;
    reduced.bytes += (range.slot_end - range.slot_begin) * pb;
  }
  if (run.b.plan.compact_allreduce) {
    std::optional<TimelineSpan> span(std::in_place, r, "allreduce", l);
    r.all_reduce(r.mem.compact + r.mem.layout.compact_offset[k], r.mem.peer_compact, r.mem.layout.compact_offset[k], run.b.plan.compact_pages * pb);
    ++reduced.calls;
    reduced.bytes += run.b.plan.compact_pages * pb;
    span.emplace(r, "unpack", l);  // the all-reduce's span ends, the unpack's begins
    CPKV_CUDA_CHECK(kernels::launch_gather(r.mem.dense_half(h, k), pb, run.tables[l][k], run.d.unpack, static_cast<std::int64_t>(run.b.unpack.size()), r.stream));
  }
  return reduced;
}

void clear_dense(BatchRun& run, std::int32_t l) {
  if (!run.b.plan.zero_dense || run.mutant.skips_zero()) return;
  Rank& r = run.r;
  const std::size_t kinds = r.ctx.source.setting.kinds.size();
  const std::int32_t h = run.half_of(l);
  const TimelineSpan span(r, "zero", l);
  const std::uint64_t half_bytes = r.mem.layout.dense_offset[h][kinds - 1] - r.mem.layout.dense_offset[h][0] + r.ctx.shape.slot_count_max * r.page_bytes(kinds - 1);
  CPKV_CUDA_CHECK(cudaMemsetAsync(r.mem.dense + r.mem.layout.dense_offset[h][0], 0, half_bytes, r.stream));
}

void slow_rank_delay(Rank& r, std::int32_t l) {
  if (r.ctx.cuda.slow_rank_cycles <= 0 || (r.batch_index + l) % r.cp() != r.ctx.rank) return;
  CPKV_CUDA_CHECK(kernels::launch_spin(r.ctx.cuda.slow_rank_cycles, r.stream));
}

void produce(BatchRun& run, std::int32_t l) {
  const TimelineSpan span(run.r, "fill", l);
  if (run.mutant.slow_producer()) CPKV_CUDA_CHECK(kernels::launch_spin(kernels::kMutantWindowCycles, run.r.stream));
  CPKV_CUDA_CHECK(kernels::launch_produce(run.produce[l], run.r.stream));
}

void compose(BatchRun& run, std::int32_t l) {
  const kernels::ComposeArgs& args = run.compose[l];
  if (args.barrier != kernels::kNoBarrier) ++run.r.barrier_phase;
  const TimelineSpan span(run.r, "compose", l, compose_note(args.barrier != kernels::kNoBarrier));
  CPKV_CUDA_CHECK(kernels::launch_compose(args, run.r.stream));
}

namespace {

// The verify kernel of one kind of the layer (after its collectives).
void verify_layer(BatchRun& run, std::int32_t l, std::size_t k) { verify_kind(run.r, run.b, run.d, run.verify, l, k, run.half_of(l)); }

// One layer of the exchange, as the plan says, counted and checked: the parts of batch_run.hpp
// (staging_direct is two launches: produce and compose), the totals, the verify kernel per kind.
void run_layer(BatchRun& run, std::int32_t l) {
  Rank& r = run.r;
  const model::Setting& setting = r.ctx.source.setting;
  harness::Totals& totals = r.ctx.boot->totals[r.ctx.rank];
  clear_dense(run, l);
  slow_rank_delay(r, l);
  produce(run, l);
  if (run.compose[l].barrier != kernels::kNoBarrier) ++totals.barriers;
  compose(run, l);
  for (std::size_t k = 0; k < setting.kinds.size(); ++k) {
    if (!setting.kind_active(k, l)) continue;
    const Reduced reduced = layer_collectives(run, l, k);
    totals.collectives += reduced.calls;
    totals.bytes_reduced += reduced.bytes;
    run.peer_bytes += run.peer_pages_per_kind * r.page_bytes(k);
    if (r.ctx.cuda.verify) verify_layer(run, l, k);
  }
}

}  // namespace

// Pool content for the pages this rank owns (written once: it never changes), and garbage in the
// dense buffers, as a fresh allocation would hold; then every pool is populated before anyone gathers.
void populate_pools(Rank& r, const BatchPlan& b, const DevicePlan& d) {
  const model::Setting& setting = r.ctx.source.setting;
  for (std::int32_t l = 0; l < r.ctx.options.layers; ++l) {
    for (std::size_t k = 0; k < setting.kinds.size(); ++k) {
      CPKV_CUDA_CHECK(kernels::launch_populate_pool(r.mem.pool + r.mem.layout.pool_offset[l][k], setting.kinds[k].row_bytes, setting.page_size, d.populate_logical,
                                                    d.populate_local, static_cast<std::int64_t>(b.populate_logical.size()), r.ctx.options.seed,
                                                    static_cast<std::uint32_t>(l), static_cast<std::uint32_t>(k), r.stream));
    }
  }
}

void populate(Rank& r, const BatchPlan& b, const DevicePlan& d) {
  populate_pools(r, b, d);
  CPKV_CUDA_CHECK(cudaMemsetAsync(r.mem.dense, 0x5A, r.mem.layout.dense_bytes, r.stream));
  r.sync_stream();
  r.barrier();
}

harness::Violation violation(std::int32_t invariant, std::int32_t rank, std::int64_t batch, std::int32_t layer, const std::string& detail) {
  harness::Violation v;
  v.invariant = invariant;
  v.rank = rank;
  v.batch = batch;
  v.layer = layer;
  std::snprintf(v.detail, sizeof(v.detail), "%s", detail.c_str());
  return v;
}

// What the device found in the batch: a barrier timeout (invariant 8), wrong bytes (invariant 6).
void collect_findings(Rank& r, std::int64_t batch_index, kernels::VerifyResult* verify) {
  const model::Setting& setting = r.ctx.source.setting;
  const std::size_t kinds = setting.kinds.size();
  const std::int32_t rank = r.ctx.rank;
  harness::Totals& totals = r.ctx.boot->totals[rank];
  kernels::BarrierStatus status{};
  CPKV_CUDA_CHECK(cudaMemcpy(&status, r.mem.barrier_status, sizeof(status), cudaMemcpyDeviceToHost));
  if (status.timed_out_phase != 0) {
    record(r.ctx.boot, violation(8, rank, batch_index, -1, fmt::format("barrier phase {} timed out on rank {} waiting for rank {}",
                                                                       status.timed_out_phase, status.rank, status.missing_peer)));
  }
  std::vector<kernels::VerifyResult> results(static_cast<std::size_t>(r.ctx.options.layers) * kinds);
  CPKV_CUDA_CHECK(cudaMemcpy(results.data(), verify, results.size() * sizeof(kernels::VerifyResult), cudaMemcpyDeviceToHost));
  for (std::int32_t l = 0; l < r.ctx.options.layers && r.ctx.cuda.verify; ++l) {
    for (std::size_t k = 0; k < kinds; ++k) {
      const kernels::VerifyResult& found = results[l * kinds + k];
      if (found.wrong_bytes == 0) continue;
      const std::uint64_t first = found.first_wrong >> 16;  // (byte index << 16) | (expected << 8) | actual
      const std::uint64_t row_global = first / setting.kinds[k].row_bytes;
      model::Mismatch mismatch;
      mismatch.wrong_bytes = static_cast<std::int64_t>(found.wrong_bytes);
      mismatch.slot = static_cast<std::int64_t>(row_global / setting.page_size);
      mismatch.row = static_cast<std::int32_t>(row_global % setting.page_size);
      mismatch.byte = static_cast<std::uint32_t>(first % setting.kinds[k].row_bytes);
      mismatch.expected = static_cast<std::uint8_t>((found.first_wrong >> 8) & 0xff);
      mismatch.actual = static_cast<std::uint8_t>(found.first_wrong & 0xff);
      const std::string text = mismatch.describe(rank, batch_index, l, setting.kinds[k].name);
      totals.add_mismatches(1, text);
      record(r.ctx.boot, violation(6, rank, batch_index, l, text));
    }
  }
}

namespace {

// One batch: plan, upload, populate, the layers, the benchmark's timing, one synchronization, findings.
void run_batch(Rank& r, const model::Batch& batch, std::int64_t batch_index, std::vector<bool>& populated, kernels::VerifyResult* verify) {
  r.batch_index = batch_index;
  const model::Setting& setting = r.ctx.source.setting;
  const std::int32_t layers = r.ctx.options.layers;
  harness::Totals& totals = r.ctx.boot->totals[r.ctx.rank];
  const BatchPlan b = build_batch_plan(setting, batch, r.variant, r.ctx.rank, r.staging_slots, populated);
  ++totals.batches;
  if (b.overflow) {
    ++totals.overflows;
    timeline_overflow(r, batch_index);
    r.ctx.boot->layers_done[r.ctx.rank].fetch_add(layers);
    r.barrier();
    r.barrier();
    return;
  }
  const TableBounds bounds{r.cp(), setting.pool_pages_per_rank(), model::info(r.variant).peer_pages == model::PeerPages::dense ? r.ctx.shape.slot_count_max : r.staging_slots, &r.mem.pool_referenced};
  DeviceUploads uploads(r.stream);
  const DevicePlan d = upload_plan(b, bounds, uploads);
  const std::vector<kernels::VerifyResult> verify_init(static_cast<std::size_t>(layers) * setting.kinds.size(), kernels::VerifyResult{0, ~0ULL});
  CPKV_CUDA_CHECK(cudaMemcpyAsync(verify, verify_init.data(), verify_init.size() * sizeof(kernels::VerifyResult), cudaMemcpyHostToDevice, r.stream));
  CPKV_CUDA_CHECK(cudaMemsetAsync(r.mem.barrier_status, 0, sizeof(kernels::BarrierStatus), r.stream));  // a timeout is reported once
  populate(r, b, d);
  BatchRun run{r, b, d, verify, {}, {}, {}, 0, 0, GpuMutantPolicy(r.ctx.options.mutant, r.ctx.rank, r.cp())};
  build_launches(run);
  const std::int64_t syncs_before = r.host_syncs;
  timeline_batch_begin(r, batch_index);
  for (std::int32_t l = 0; l < layers; ++l) {
    r.ctx.progress.at(batch_index, l);
    run_layer(run, l);
    ++totals.layers;
    r.ctx.boot->layers_done[r.ctx.rank].fetch_add(1);
  }
  timeline_layers_end(r);
  BenchRank& bench = r.ctx.boot->bench_results[r.ctx.rank];
  bench.host_syncs_in_layer_loop = std::max<std::int64_t>(bench.host_syncs_in_layer_loop, (r.host_syncs - syncs_before) / layers);
  if (r.ctx.cuda.timing_reps > 0) time_run(run, uploads, batch_index);
  r.sync_stream();  // the one synchronization per batch, after the layer loop: results, barrier status
  timeline_batch_read(r);
  totals.bytes_gathered_from_peers += run.peer_bytes;
  collect_findings(r, batch_index, verify);
  r.barrier();  // nobody rewrites pools or dense buffers a peer still reads (uploads are freed after it)
}

// Quiescence: every word of this rank's pad equals the number of barriers (drained).
void check_drained(Rank& r) {
  std::vector<std::uint64_t> pad(r.cp());
  CPKV_CUDA_CHECK(cudaMemcpy(pad.data(), r.mem.pad, r.cp() * sizeof(std::uint64_t), cudaMemcpyDeviceToHost));
  for (std::int32_t p = 0; p < r.cp(); ++p) {
    if (pad[p] == r.barrier_phase) continue;
    record(r.ctx.boot, violation(4, r.ctx.rank, -1, -1, fmt::format("flags not drained: rank {}'s pad word for rank {} is {}, expected {}",
                                                                    r.ctx.rank, p, pad[p], r.barrier_phase)));
    return;
  }
}

}  // namespace

int cuda_rank(const RankContext& ctx) {
  Rank r{ctx};
  ctx.progress.step("setup");
  CPKV_CUDA_CHECK(cudaSetDevice(ctx.rank % ctx.gpus));
  CPKV_CUDA_CHECK(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
  const RankTimelineHandle timeline = open_timeline(r);
  allocate_memory(r);
  map_peers_and_agree(r);
  join_nccl(r);
  if (ctx.cuda.measure_ceilings) measure_ceilings(r, ctx.boot->bench_results[ctx.rank]);
  const std::size_t verify_slots = static_cast<std::size_t>(ctx.options.layers) * ctx.source.setting.kinds.size();
  kernels::VerifyResult* verify = nullptr;
  CPKV_CUDA_CHECK(cudaMalloc(&verify, verify_slots * sizeof(kernels::VerifyResult)));
  if (ctx.cuda.exchange) {
    run_plugin_batches(r, verify);
  } else {
    std::vector<bool> populated(ctx.source.setting.pool_pages_per_rank(), false);
    harness::BatchCursor cursor(ctx.source);
    while (std::optional<model::Batch> batch = cursor.next()) {
      ctx.progress.at(cursor.index(), -1);
      ctx.progress.step("batch");
      run_batch(r, *batch, cursor.index(), populated, verify);
      ctx.boot->batches_done[ctx.rank].fetch_add(1);
    }
  }
  check_drained(r);
  leave_group(r);
  return harness::kRankExitOk;
}

}  // namespace cpkv::cuda

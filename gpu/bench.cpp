// The benchmark: ceilings measured in the same run (every rank at once) and the timing of every
// batch's layer loop, captured once into a CUDA graph and replayed (CUDA events around each
// replay), folded over the ranks (worst rank).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "plugin_host.hpp"
#include "device_plan.hpp"
#include "rank.hpp"

namespace cpkv::cuda {

namespace {

// Runs `body` once (warm-up), then `reps` times between CUDA events after a host barrier, so every
// rank measures at once. Returns ms per body.
template <typename Body>
double timed_ms(Rank& r, cudaEvent_t start, cudaEvent_t stop, const Body& body, int reps) {
  body();
  wait_device(r.ctx.progress, r.stream);
  r.barrier();
  CPKV_CUDA_CHECK(cudaEventRecord(start, r.stream));
  for (int i = 0; i < reps; ++i) body();
  CPKV_CUDA_CHECK(cudaEventRecord(stop, r.stream));
  {
    const harness::Waiting waiting(r.ctx.progress, harness::kWaitingOnDevice);
    CPKV_CUDA_CHECK(cudaEventSynchronize(stop));
  }
  float ms = 0;
  CPKV_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  return static_cast<double>(ms) / reps;
}

// The same scattered pages pulled by the copy engines, one batched call (cudaMemcpyBatchAsync,
// CUDA 12.8+; 0 where the toolkit lacks it). GB/s.
double ce_batch_gbps(Rank& r, cudaEvent_t start, cudaEvent_t stop, std::uint8_t* dst, const std::uint8_t* src,
                     const std::vector<kernels::GatherEntry>& entries, std::uint64_t page_bytes) {
#if CUDART_VERSION >= 13000
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<std::size_t> sizes(entries.size(), page_bytes);
  for (const kernels::GatherEntry& e : entries) {
    dsts.push_back(dst + e.dst_page * page_bytes);
    srcs.push_back(src + e.src_page * page_bytes);
  }
  cudaMemcpyAttributes attrs{};
  attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  std::size_t attrs_index = 0;
  const double ms = timed_ms(r, start, stop, [&] {
    CPKV_CUDA_CHECK(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), entries.size(), &attrs, &attrs_index, 1, r.stream));
  }, 10);
  return static_cast<double>(entries.size() * page_bytes) / (ms * 1e6);
#else
  (void)r, (void)start, (void)stop, (void)dst, (void)src, (void)entries, (void)page_bytes;
  return 0.0;
#endif
}

// Whether the first and the last of `entries` landed: page dst_page of `dst` equals page src_page
// of `src`, byte for byte (either may be a peer's mapping).
bool ends_copied(const std::uint8_t* dst, const std::uint8_t* src, const std::vector<kernels::GatherEntry>& entries, std::uint64_t page_bytes) {
  for (const kernels::GatherEntry& e : {entries.front(), entries.back()}) {
    std::vector<std::uint8_t> got(page_bytes), want(page_bytes);
    CPKV_CUDA_CHECK(cudaMemcpy(got.data(), dst + e.dst_page * page_bytes, page_bytes, cudaMemcpyDeviceToHost));
    CPKV_CUDA_CHECK(cudaMemcpy(want.data(), src + e.src_page * page_bytes, page_bytes, cudaMemcpyDeviceToHost));
    if (got != want) return false;
  }
  return true;
}

// The same pages through the bulk-copy (TMA) gather; its bytes checked (first and last page) after
// the timing. GB/s, or -1 when a load timed out or a byte is wrong.
double bulk_gbps(Rank& r, cudaEvent_t start, cudaEvent_t stop, std::uint8_t* dst, const kernels::PointerTable& table,
                 const std::vector<kernels::GatherEntry>& entries, const kernels::GatherEntry* d_entries, std::uint64_t page_bytes) {
  kernels::BulkStatus* status = nullptr;
  CPKV_CUDA_CHECK(cudaMalloc(&status, sizeof(kernels::BulkStatus)));
  CPKV_CUDA_CHECK(cudaMemsetAsync(status, 0, sizeof(kernels::BulkStatus), r.stream));
  CPKV_CUDA_CHECK(cudaMemsetAsync(dst, 0, entries.size() * page_bytes, r.stream));
  const std::int64_t count = static_cast<std::int64_t>(entries.size());
  const double ms = timed_ms(r, start, stop, [&] {
    CPKV_CUDA_CHECK(kernels::launch_bulk_gather(dst, page_bytes, table, d_entries, count, status, r.stream));
  }, 10);
  kernels::BulkStatus found{};
  CPKV_CUDA_CHECK(cudaMemcpy(&found, status, sizeof(found), cudaMemcpyDeviceToHost));
  CPKV_CUDA_CHECK(cudaFree(status));
  const bool exact = found.timeouts == 0 && ends_copied(dst, table.base[0], entries, page_bytes);
  return exact ? static_cast<double>(count * page_bytes) / (ms * 1e6) : -1.0;
}

// The same pages pushed: the block-per-page gather loads this rank's pages and stores them into
// the next rank's buffer (remote stores), every rank at once; its bytes checked (first and last
// page, read back through the peer's mapping) after the timing. GB/s, or -1 when a byte is wrong.
// Host barriers around it: no rank's earlier copies into its own buffer overlap a peer's pushes.
constexpr int kPushSentinel = 0xEE;
double push_gbps(Rank& r, cudaEvent_t start, cudaEvent_t stop, std::uint8_t* peer_dst, std::uint8_t* own,
                 const std::vector<kernels::GatherEntry>& entries, const kernels::GatherEntry* d_entries, std::uint64_t page_bytes) {
  kernels::PointerTable table{};
  table.base[0] = own;
  const std::int64_t count = static_cast<std::int64_t>(entries.size());
  // What the previous rank pushes into lands on a sentinel no source byte has (gather_sweep),
  // so a push that did not land fails the check.
  CPKV_CUDA_CHECK(cudaMemsetAsync(own + kBenchBufferBytes / 2, kPushSentinel, count * page_bytes, r.stream));
  wait_device(r.ctx.progress, r.stream);
  r.barrier();
  const double ms = timed_ms(r, start, stop, [&] {
    CPKV_CUDA_CHECK(kernels::launch_gather(peer_dst, page_bytes, table, d_entries, count, r.stream));
  }, 10);
  const bool exact = ends_copied(peer_dst, own, entries, page_bytes);
  r.barrier();
  return exact ? static_cast<double>(count * page_bytes) / (ms * 1e6) : -1.0;
}

// Both copy kernels pulling scattered pages from the next rank, every page size and count: the
// fused compose copy (one warp per page chunk, the one the layers use) and the single-list gather (one
// block per page, kept for the unpack).
void gather_sweep(Rank& r, cudaEvent_t start, cudaEvent_t stop, std::uint8_t* own, std::uint8_t* peer, BenchRank& out) {
  const std::uint64_t half = kBenchBufferBytes / 2;
  // Source bytes that differ by rank and from every destination's prior content (the all-reduces
  // before left the same bytes everywhere; bulk copies land on zeros, pushes on kPushSentinel), so
  // the byte checks fail when a copy did not land. Every rank's sources are set before any reads.
  CPKV_CUDA_CHECK(cudaMemsetAsync(own, 0x10 + r.ctx.rank, half, r.stream));
  wait_device(r.ctx.progress, r.stream);
  r.barrier();
  DeviceUploads uploads(r.stream);
  for (int ps = 0; ps < kCeilingPageSizes; ++ps) {
    for (int c = 0; c < kCeilingCounts; ++c) {
      std::vector<kernels::GatherEntry> entries;
      // Scattered sources, as a pool leaves them: a stride walk over the source half.
      const std::int64_t source_pages = static_cast<std::int64_t>(half / kCeilingPageBytes[ps]);
      for (std::int64_t i = 0; i < kCeilingPageCounts[c]; ++i) entries.push_back({i, (i * 7919) % source_pages, 0, kernels::kToDense});
      const kernels::GatherEntry* d_entries = uploads.upload(entries);
      kernels::ComposeArgs a{};
      a.kinds = 1;
      a.kind[0].dst[kernels::kToDense] = own + half;
      kernels::set_page_geometry(a.kind[0], kCeilingPageBytes[ps]);
      a.kind[0].table.base[0] = peer;
      a.entries = d_entries;
      a.pre_count = a.count = kCeilingPageCounts[c];
      a.cp = r.cp();
      a.state = r.mem.barrier_state;
      a.barrier = kernels::kNoBarrier;
      const double bytes = static_cast<double>(kCeilingPageCounts[c] * kCeilingPageBytes[ps]);
      const double ms = timed_ms(r, start, stop, [&] { CPKV_CUDA_CHECK(kernels::launch_compose(a, r.stream)); }, 10);
      out.gather_gbps[ps][c] = bytes / (ms * 1e6);
      const double block_ms = timed_ms(r, start, stop, [&] {
        CPKV_CUDA_CHECK(kernels::launch_gather(own + half, kCeilingPageBytes[ps], a.kind[0].table, d_entries, kCeilingPageCounts[c], r.stream));
      }, 10);
      out.gather_block_gbps[ps][c] = bytes / (block_ms * 1e6);
      out.gather_ce_batch_gbps[ps][c] = ce_batch_gbps(r, start, stop, own + half, peer, entries, kCeilingPageBytes[ps]);
      if (r.ctx.cuda.bench_bulk) {
        out.gather_bulk_gbps[ps][c] = bulk_gbps(r, start, stop, own + half, a.kind[0].table, entries, d_entries, kCeilingPageBytes[ps]);
      }
      out.gather_push_gbps[ps][c] = r.cp() > 1 ? push_gbps(r, start, stop, peer + half, own, entries, d_entries, kCeilingPageBytes[ps]) : 0.0;
    }
  }
  wait_device(r.ctx.progress, r.stream);
}

}  // namespace

// Per-layer times of a captured graph of `cycle` layers replayed `reps` times (after two warm-up
// replays), sorted; `nodes` gets the graph's nodes (launches) per layer; the graph is destroyed.
// The device counts barrier phases itself, so every replay is a fresh set of phases; the host's
// count follows (`barriers_per_replay`).
std::vector<double> replay_graph_us(Rank& r, cudaGraph_t graph, std::int32_t cycle, std::int32_t reps, std::uint64_t barriers_per_replay, double& nodes) {
  std::size_t count = 0;
  CPKV_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &count));
  nodes = static_cast<double>(count) / cycle;
  if (count == 0) {  // nothing to time (no isolated exchange for this variant, no own page to fill on this rank)
    CPKV_CUDA_CHECK(cudaGraphDestroy(graph));
    // The host barrier a non-empty graph meets below, met here too: a rank with no current page of
    // its own has an empty fill graph while its peers' are not, and a barrier skipped on one rank
    // leaves a peer waiting for it at the end of the run (found on one H200 at cp 2, tiny.jsonl).
    r.barrier();
    return {0.0};
  }
  cudaGraphExec_t exec = nullptr;
  CPKV_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  std::vector<cudaEvent_t> events(2 * reps);
  for (cudaEvent_t& e : events) CPKV_CUDA_CHECK(cudaEventCreate(&e));
  for (int warm = 0; warm < 2; ++warm) CPKV_CUDA_CHECK(cudaGraphLaunch(exec, r.stream));
  r.barrier_phase += 2 * barriers_per_replay;
  wait_device(r.ctx.progress, r.stream);
  r.barrier();
  for (std::int32_t i = 0; i < reps; ++i) {
    CPKV_CUDA_CHECK(cudaEventRecord(events[2 * i], r.stream));
    CPKV_CUDA_CHECK(cudaGraphLaunch(exec, r.stream));
    CPKV_CUDA_CHECK(cudaEventRecord(events[2 * i + 1], r.stream));
  }
  r.barrier_phase += reps * barriers_per_replay;
  wait_device(r.ctx.progress, r.stream);
  std::vector<double> us;
  for (std::int32_t i = 0; i < reps; ++i) {
    float ms = 0;
    CPKV_CUDA_CHECK(cudaEventElapsedTime(&ms, events[2 * i], events[2 * i + 1]));
    us.push_back(1000.0 * ms / cycle);
  }
  for (cudaEvent_t& e : events) CPKV_CUDA_CHECK(cudaEventDestroy(e));
  CPKV_CUDA_CHECK(cudaGraphExecDestroy(exec));
  CPKV_CUDA_CHECK(cudaGraphDestroy(graph));
  std::sort(us.begin(), us.end());
  return us;
}

CapturedLayers capture_layers(Rank& r, std::int32_t cycle, const std::function<std::string(std::int32_t)>& body) {
  CapturedLayers out;
  if (const cudaError_t begun = cudaStreamBeginCapture(r.stream, cudaStreamCaptureModeThreadLocal); begun != cudaSuccess) {
    (void)cudaGetLastError();
    out.why = fmt::format("cudaStreamBeginCapture: {}", cudaGetErrorString(begun));
    return out;
  }
  const std::uint64_t phase_before = r.barrier_phase;
  for (std::int32_t l = 0; l < cycle && out.why.empty(); ++l) out.why = body(l);
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(r.stream, &graph);  // ends the capture also after a body failed
  (void)cudaGetLastError();
  out.barriers_per_replay = r.barrier_phase - phase_before;
  r.barrier_phase = phase_before;  // what was captured has not run: the replays advance it
  if (out.why.empty() && ended == cudaSuccess && graph != nullptr) {
    out.graph = graph;
    return out;
  }
  if (graph != nullptr) (void)cudaGraphDestroy(graph);
  if (out.why.empty()) out.why = fmt::format("cudaStreamEndCapture: {}", cudaGetErrorString(ended));
  return out;
}

namespace {

// Per-layer times of `cycle` layers of `body` (cpkv's own launches) captured once into a CUDA
// graph and replayed; a capture that fails ends the rank (as a failed launch does).
std::vector<double> graph_layer_us(Rank& r, std::int32_t cycle, std::int32_t reps, const std::function<void(std::int32_t)>& body, double& nodes) {
  const CapturedLayers captured = capture_layers(r, cycle, [&](std::int32_t l) {
    body(l);
    return std::string();
  });
  if (captured.graph == nullptr) {
    std::fprintf(stderr, "cpkv: rank %d: capturing the bench's layer loop failed: %s\n", r.ctx.rank, captured.why.c_str());
    std::abort();
  }
  return replay_graph_us(r, captured.graph, cycle, reps, captured.barriers_per_replay, nodes);
}

// NCCL's sum all-reduce over the benchmark buffer: bus bandwidth at 64 MiB, latency at 4 KiB. The
// latency is per call as nodes of one CUDA graph, as the layer loops run it (replayed graphs),
// median over replays: launched one by one, a 4-KiB call timed 10-21 us from run to run on
// 2xH200 (2026-11-30), which the graphed layers never pay.
void allreduce_ceilings(Rank& r, cudaEvent_t start, cudaEvent_t stop, BenchRank& out) {
  if (!r.use_nccl) return;
  const std::vector<std::uint8_t*> none;
  const std::uint64_t big = 64ULL << 20;
  const double big_ms = timed_ms(r, start, stop, [&] { r.all_reduce(r.mem.bench_buffer, none, 0, big); }, 10);
  out.allreduce_busbw_gbps = big * 2.0 * (r.cp() - 1) / r.cp() / (big_ms * 1e6);
  for (int s = 0; s < kAllreduceSizes; ++s) {
    const std::uint64_t bytes = kAllreduceSizeBytes[s];
    const std::int32_t calls = bytes <= (2ULL << 20) ? 20 : 5;
    double nodes = 0;
    const std::vector<double> us = graph_layer_us(r, calls, 7, [&](std::int32_t) { r.all_reduce(r.mem.bench_buffer, none, 0, bytes); }, nodes);
    out.allreduce_curve_us[s] = us[us.size() / 2];
  }
}

}  // namespace

// Ceilings, every rank at once: copy-engine pull from the next rank, local copy, back-to-back
// barriers, NCCL's all-reduce, and the copy kernels pulling pages from the next rank.
void measure_ceilings(Rank& r, BenchRank& out) {
  const std::int32_t cp = r.cp();
  const std::int32_t rank = r.ctx.rank;
  const std::uint64_t half = kBenchBufferBytes / 2;
  std::uint8_t* own = r.mem.bench_buffer;
  std::uint8_t* peer = own;
  if (cp > 1) {
    void* ptr = nullptr;
    CPKV_CUDA_CHECK(cudaIpcOpenMemHandle(&ptr, r.ctx.boot->bench[(rank + 1) % cp], cudaIpcMemLazyEnablePeerAccess));
    peer = static_cast<std::uint8_t*>(ptr);
  }
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  CPKV_CUDA_CHECK(cudaEventCreate(&start));
  CPKV_CUDA_CHECK(cudaEventCreate(&stop));
  const double pull_ms = timed_ms(r, start, stop, [&] { CPKV_CUDA_CHECK(cudaMemcpyAsync(own + half, peer, half, cudaMemcpyDeviceToDevice, r.stream)); }, 5);
  out.ce_peer_gbps = half / (pull_ms * 1e6);
  if (cp > 1) {  // the copy engines writing into the peer; host barriers keep it clear of the peer's own copies
    wait_device(r.ctx.progress, r.stream);
    r.barrier();
    const double push_ms = timed_ms(r, start, stop, [&] { CPKV_CUDA_CHECK(cudaMemcpyAsync(peer + half, own, half, cudaMemcpyDeviceToDevice, r.stream)); }, 5);
    out.ce_push_gbps = half / (push_ms * 1e6);
    r.barrier();
  }
  const double local_ms = timed_ms(r, start, stop, [&] { CPKV_CUDA_CHECK(cudaMemcpyAsync(own + half, own, half, cudaMemcpyDeviceToDevice, r.stream)); }, 5);
  out.local_copy_gbps = half / (local_ms * 1e6);
  out.barrier_us = 1000.0 * timed_ms(r, start, stop, [&] { r.device_barrier(); }, 1000);
  {  // the same barrier as nodes of a CUDA graph, as the layer loops run it
    const std::int32_t in_graph = 200;
    double nodes = 0;
    const std::vector<double> us = graph_layer_us(r, in_graph, 5, [&](std::int32_t) { r.device_barrier(); }, nodes);
    out.barrier_us_graph = us[us.size() / 2];
  }
  const std::int32_t looped = 1000;
  const double loop_ms = timed_ms(r, start, stop, [&] {
    CPKV_CUDA_CHECK(kernels::launch_barrier_loop(r.mem.pad_table, rank, cp, r.barrier_phase + 1, looped, r.mem.barrier_status, r.stream));
    r.barrier_phase += looped;
    // The looped kernel takes explicit phases: the device's count follows the host's.
    CPKV_CUDA_CHECK(cudaMemcpyAsync(&r.mem.barrier_state->phase, &r.barrier_phase, sizeof(r.barrier_phase), cudaMemcpyHostToDevice, r.stream));
  }, 3);
  out.barrier_us_launch_free = 1000.0 * loop_ms / looped;
  allreduce_ceilings(r, start, stop, out);
  gather_sweep(r, start, stop, own, peer, out);
  r.barrier();
}

namespace {

// One scalar ceiling over the ranks (CPKV_BENCH_CEILING_SCALARS): the least from rank 0 on, or the
// most, no less than `to` holds already.
void fold_scalar(const Bootstrap& boot, std::int32_t cp, double BenchRank::*field, CeilingFold fold, double& to) {
  if (fold == kLeast) to = boot.bench_results[0].*field;
  for (std::int32_t r = 0; r < cp; ++r) to = fold == kLeast ? std::min(to, boot.bench_results[r].*field) : std::max(to, boot.bench_results[r].*field);
}

// The ceilings, folded over the ranks: the slowest rank's rate and the longest wait.
void fold_ceilings(const Bootstrap& boot, std::int32_t cp, Ceilings& c) {
#define CPKV_FOLD_SCALAR(name, fold, ...) fold_scalar(boot, cp, &BenchRank::name, fold, c.name);
  CPKV_BENCH_CEILING_SCALARS(CPKV_FOLD_SCALAR)
#undef CPKV_FOLD_SCALAR
  for (int ps = 0; ps < kCeilingPageSizes; ++ps) {
    for (int k = 0; k < kCeilingCounts; ++k) {
      Ceilings::Gather g{kCeilingPageBytes[ps], kCeilingPageCounts[k]};
#define CPKV_GATHER_START(rank_field, field, key) g.field = 1e30;
      CPKV_BENCH_GATHER_RATES(CPKV_GATHER_START)
#undef CPKV_GATHER_START
      c.gather.push_back(g);
    }
  }
  if (boot.bench_results[0].allreduce_busbw_gbps > 0) {
    for (int s = 0; s < kAllreduceSizes; ++s) {
      double us = 0;
      for (std::int32_t r = 0; r < cp; ++r) us = std::max(us, boot.bench_results[r].allreduce_curve_us[s]);
      c.allreduce_curve.emplace_back(static_cast<double>(kAllreduceSizeBytes[s]), us);
    }
    c.allreduce_latency_us = c.allreduce_curve.front().second;
  }
  for (std::int32_t r = 0; r < cp; ++r) {
    const BenchRank& br = boot.bench_results[r];
    for (int ps = 0; ps < kCeilingPageSizes; ++ps) {
      for (int k = 0; k < kCeilingCounts; ++k) {
        Ceilings::Gather& g = c.gather[ps * kCeilingCounts + k];
#define CPKV_GATHER_FOLD(rank_field, field, key) g.field = std::min(g.field, br.rank_field[ps][k]);
        CPKV_BENCH_GATHER_RATES(CPKV_GATHER_FOLD)
#undef CPKV_GATHER_FOLD
      }
    }
  }
}

}  // namespace

void fold_bench(const Bootstrap& boot, std::int32_t cp, std::int64_t batches_run, BenchResult& out) {
  // One figure of batch b over the ranks: the worst (longest time, most nodes), or the least for a minimum.
  const auto fold = [&](int t, int stat, std::int64_t b) {
    double v = boot.bench_results[0].timing[t][stat][b];
    for (std::int32_t r = 1; r < cp; ++r) {
      const double next = boot.bench_results[r].timing[t][stat][b];
      v = stat == kMin ? std::min(v, next) : std::max(v, next);
    }
    return v;
  };
  const std::int64_t batches = std::min<std::int64_t>(batches_run, kBenchBatchesMax);
  for (int t = 0; t < kTimings; ++t) {
    for (int stat = 0; stat < kTimingStats; ++stat) {
      for (std::int64_t b = 0; b < batches; ++b) out.timing[t][stat].push_back(fold(t, stat, b));
    }
  }
  fold_ceilings(boot, cp, out.ceilings);
  for (std::int32_t r = 0; r < cp; ++r) {
    const BenchRank& br = boot.bench_results[r];
    out.host_syncs_in_layer_loop = std::max(out.host_syncs_in_layer_loop, br.host_syncs_in_layer_loop);
  }
}

}  // namespace cpkv::cuda

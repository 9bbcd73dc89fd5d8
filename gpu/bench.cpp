// The benchmark: ceilings measured in the same run (every rank at once) and the timing of every
// batch's layers (CUDA events around each), folded over the ranks (worst rank).
#include <algorithm>

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

// The gather kernel pulling scattered pages from the next rank, every page size and count.
void gather_sweep(Rank& r, cudaEvent_t start, cudaEvent_t stop, std::uint8_t* own, std::uint8_t* peer, BenchRank& out) {
  const std::uint64_t half = kBenchBufferBytes / 2;
  DeviceUploads uploads(r.stream);
  for (int ps = 0; ps < kCeilingPageSizes; ++ps) {
    for (int c = 0; c < kCeilingCounts; ++c) {
      std::vector<kernels::GatherEntry> entries;
      // Scattered sources, as a pool leaves them: a stride walk over the source half.
      const std::int64_t source_pages = static_cast<std::int64_t>(half / kCeilingPageBytes[ps]);
      for (std::int64_t i = 0; i < kCeilingPageCounts[c]; ++i) entries.push_back({i, (i * 7919) % source_pages, 0, 0});
      const kernels::GatherEntry* d_entries = uploads.upload(entries);
      kernels::PointerTable table{};
      table.base[0] = peer;
      const double ms = timed_ms(r, start, stop, [&] {
        CPKV_CUDA_CHECK(kernels::launch_gather(own + half, kCeilingPageBytes[ps], table, d_entries, kCeilingPageCounts[c], r.stream));
      }, 10);
      out.gather_gbps[ps][c] = kCeilingPageCounts[c] * kCeilingPageBytes[ps] / (ms * 1e6);
    }
  }
  wait_device(r.ctx.progress, r.stream);
}

std::vector<double> sorted_layer_us(Rank& r, std::int32_t total, std::int32_t warmup, const std::function<void(std::int32_t)>& body) {
  const std::int32_t layers = r.ctx.options.layers;
  std::vector<cudaEvent_t> events(2 * total);
  for (cudaEvent_t& e : events) CPKV_CUDA_CHECK(cudaEventCreate(&e));
  wait_device(r.ctx.progress, r.stream);
  r.barrier();
  // Consecutive timed layers must alternate parity halves (PROTOCOL.md section 6): cycle over an
  // even number of layers (the CLI refuses --layers 1 for timing).
  const std::int32_t cycle = layers % 2 == 0 ? layers : layers - 1;
  for (std::int32_t i = 0; i < total; ++i) {
    CPKV_CUDA_CHECK(cudaEventRecord(events[2 * i], r.stream));
    body(i % cycle);
    CPKV_CUDA_CHECK(cudaEventRecord(events[2 * i + 1], r.stream));
  }
  wait_device(r.ctx.progress, r.stream);
  std::vector<double> us;
  for (std::int32_t i = warmup; i < total; ++i) {
    float ms = 0;
    CPKV_CUDA_CHECK(cudaEventElapsedTime(&ms, events[2 * i], events[2 * i + 1]));
    us.push_back(1000.0 * ms);
  }
  for (cudaEvent_t& e : events) CPKV_CUDA_CHECK(cudaEventDestroy(e));
  std::sort(us.begin(), us.end());
  return us;
}

}  // namespace

// Ceilings, every rank at once: copy-engine pull from the next rank, local copy, back-to-back
// barriers, and the gather kernel pulling pages from the next rank.
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
  const double local_ms = timed_ms(r, start, stop, [&] { CPKV_CUDA_CHECK(cudaMemcpyAsync(own + half, own, half, cudaMemcpyDeviceToDevice, r.stream)); }, 5);
  out.local_copy_gbps = half / (local_ms * 1e6);
  const double barrier_ms = timed_ms(r, start, stop, [&] {
    CPKV_CUDA_CHECK(kernels::launch_barrier(r.mem.pad_table, rank, cp, ++r.barrier_phase, r.mem.barrier_status, r.stream));
  }, 1000);
  out.barrier_us = 1000.0 * barrier_ms;
  const std::int32_t looped = 1000;
  const double loop_ms = timed_ms(r, start, stop, [&] {
    CPKV_CUDA_CHECK(kernels::launch_barrier_loop(r.mem.pad_table, rank, cp, r.barrier_phase + 1, looped, r.mem.barrier_status, r.stream));
    r.barrier_phase += looped;
  }, 3);
  out.barrier_us_launch_free = 1000.0 * loop_ms / looped;
  gather_sweep(r, start, stop, own, peer, out);
  r.barrier();
}

// Times `timing_reps` layers (after a warm-up) of the batch just run, and the isolated exchange.
void time_batch(Rank& r, std::int64_t batch_index, const std::function<void(std::int32_t)>& run_layer,
                const std::function<void(std::int32_t)>& run_isolated, BenchRank& out) {
  if (batch_index >= kBenchBatchesMax) return;
  const std::int32_t warmup = 3;
  const std::int32_t total = warmup + r.ctx.cuda.timing_reps;
  const std::vector<double> layer = sorted_layer_us(r, total, warmup, run_layer);
  out.layer_us_median[batch_index] = layer[layer.size() / 2];
  out.layer_us_min[batch_index] = layer.front();
  out.layer_us_max[batch_index] = layer.back();
  const std::vector<double> isolated = sorted_layer_us(r, total, warmup, run_isolated);
  out.isolated_us_median[batch_index] = isolated[isolated.size() / 2];
}

void fold_bench(const Bootstrap& boot, std::int32_t cp, std::int64_t batches_run, BenchResult& out) {
  const std::int64_t batches = std::min<std::int64_t>(batches_run, kBenchBatchesMax);
  for (std::int64_t b = 0; b < batches; ++b) {
    double median = 0, low = 1e30, high = 0, isolated = 0;
    for (std::int32_t r = 0; r < cp; ++r) {
      const BenchRank& br = boot.bench_results[r];
      median = std::max(median, br.layer_us_median[b]);
      low = std::min(low, br.layer_us_min[b]);
      high = std::max(high, br.layer_us_max[b]);
      isolated = std::max(isolated, br.isolated_us_median[b]);
    }
    out.layer_us_median.push_back(median);
    out.layer_us_min.push_back(low);
    out.layer_us_max.push_back(high);
    out.isolated_us_median.push_back(isolated);
  }
  Ceilings& c = out.ceilings;
  c.ce_peer_gbps = 1e30;
  c.local_copy_gbps = 1e30;
  for (int ps = 0; ps < kCeilingPageSizes; ++ps) {
    for (int k = 0; k < kCeilingCounts; ++k) c.gather.push_back({kCeilingPageBytes[ps], kCeilingPageCounts[k], 1e30});
  }
  for (std::int32_t r = 0; r < cp; ++r) {
    const BenchRank& br = boot.bench_results[r];
    c.ce_peer_gbps = std::min(c.ce_peer_gbps, br.ce_peer_gbps);
    c.local_copy_gbps = std::min(c.local_copy_gbps, br.local_copy_gbps);
    c.barrier_us = std::max(c.barrier_us, br.barrier_us);
    c.barrier_us_launch_free = std::max(c.barrier_us_launch_free, br.barrier_us_launch_free);
    for (int ps = 0; ps < kCeilingPageSizes; ++ps) {
      for (int k = 0; k < kCeilingCounts; ++k) c.gather[ps * kCeilingCounts + k].gbps = std::min(c.gather[ps * kCeilingCounts + k].gbps, br.gather_gbps[ps][k]);
    }
    out.host_syncs_in_layer_loop = std::max(out.host_syncs_in_layer_loop, br.host_syncs_in_layer_loop);
  }
}

}  // namespace cpkv::cuda

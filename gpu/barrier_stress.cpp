// The barrier stress tool: the counting barrier on its own, one process per rank, a slow producer
// rotating over the ranks, phase stamps checked after every pass, then back-to-back timing.
#include <algorithm>
#include <new>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "bootstrap.hpp"
#include "cpkv/harness/shared_region.hpp"
#include "launchers.cuh"

namespace cpkv::cuda {

namespace {

// One rank's barrier pad and its two parity stamp words, and device tables of every rank's.
struct StressMemory {
  std::uint64_t* pad = nullptr;
  std::uint64_t* stamps = nullptr;  // two parity words
  std::uint64_t** d_pads = nullptr;
  std::uint64_t** d_stamp[2] = {nullptr, nullptr};
  kernels::BarrierStatus* status = nullptr;
  unsigned long long* errors = nullptr;
};

template <typename T>
T** device_table(const std::vector<T*>& host) {
  T** table = nullptr;
  CPKV_CUDA_CHECK(cudaMalloc(&table, host.size() * sizeof(void*)));
  CPKV_CUDA_CHECK(cudaMemcpy(table, host.data(), host.size() * sizeof(void*), cudaMemcpyHostToDevice));
  return table;
}

StressMemory map_stress_memory(Bootstrap* boot, harness::RankProgress& progress, std::int32_t rank, std::int32_t cp, std::uint64_t& host_phase) {
  StressMemory m;
  CPKV_CUDA_CHECK(cudaMalloc(&m.pad, 256));
  CPKV_CUDA_CHECK(cudaMalloc(&m.stamps, 256));
  CPKV_CUDA_CHECK(cudaMemset(m.pad, 0, 256));
  CPKV_CUDA_CHECK(cudaMemset(m.stamps, 0, 256));
  CPKV_CUDA_CHECK(cudaIpcGetMemHandle(&boot->pad[rank], m.pad));
  CPKV_CUDA_CHECK(cudaIpcGetMemHandle(&boot->staging[rank], m.stamps));
  {
    const harness::Waiting waiting(progress, harness::kWaitingOnDevice);
    CPKV_CUDA_CHECK(cudaDeviceSynchronize());
  }
  host_barrier(boot, progress, rank, cp, host_phase);
  std::vector<std::uint64_t*> pads(cp), stamp0(cp), stamp1(cp);
  for (std::int32_t p = 0; p < cp; ++p) {
    void* a = m.pad;
    void* b = m.stamps;
    if (p != rank) {
      CPKV_CUDA_CHECK(cudaIpcOpenMemHandle(&a, boot->pad[p], cudaIpcMemLazyEnablePeerAccess));
      CPKV_CUDA_CHECK(cudaIpcOpenMemHandle(&b, boot->staging[p], cudaIpcMemLazyEnablePeerAccess));
    }
    pads[p] = static_cast<std::uint64_t*>(a);
    stamp0[p] = static_cast<std::uint64_t*>(b);
    stamp1[p] = static_cast<std::uint64_t*>(b) + 1;
  }
  m.d_pads = device_table(pads);
  m.d_stamp[0] = device_table(stamp0);
  m.d_stamp[1] = device_table(stamp1);
  CPKV_CUDA_CHECK(cudaMalloc(&m.status, sizeof(kernels::BarrierStatus)));
  CPKV_CUDA_CHECK(cudaMalloc(&m.errors, sizeof(unsigned long long)));
  CPKV_CUDA_CHECK(cudaMemset(m.status, 0, sizeof(kernels::BarrierStatus)));
  CPKV_CUDA_CHECK(cudaMemset(m.errors, 0, sizeof(unsigned long long)));
  return m;
}

// `timed_barriers` back-to-back barriers between CUDA events, everyone starting together.
double time_barriers(Bootstrap* boot, harness::RankProgress& progress, const BarrierStressOptions& o, std::int32_t rank, const StressMemory& m,
                     cudaStream_t stream, std::uint64_t& phase, std::uint64_t& host_phase) {
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  CPKV_CUDA_CHECK(cudaEventCreate(&start));
  CPKV_CUDA_CHECK(cudaEventCreate(&stop));
  for (int warm = 0; warm < 20; ++warm) CPKV_CUDA_CHECK(kernels::launch_barrier(m.d_pads, rank, o.cp, ++phase, m.status, stream));
  wait_device(progress, stream);
  host_barrier(boot, progress, rank, o.cp, host_phase);  // everyone starts the timed run together
  CPKV_CUDA_CHECK(cudaEventRecord(start, stream));
  for (std::int32_t i = 0; i < o.timed_barriers; ++i) CPKV_CUDA_CHECK(kernels::launch_barrier(m.d_pads, rank, o.cp, ++phase, m.status, stream));
  CPKV_CUDA_CHECK(cudaEventRecord(stop, stream));
  {
    const harness::Waiting waiting(progress, harness::kWaitingOnDevice);
    CPKV_CUDA_CHECK(cudaEventSynchronize(stop));
  }
  float ms = 0;
  CPKV_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  return 1000.0 * ms / o.timed_barriers;
}

int barrier_stress_rank(Bootstrap* boot, harness::RankProgress& progress, const BarrierStressOptions& o, std::int32_t rank, int gpus) {
  const std::int32_t cp = o.cp;
  std::uint64_t host_phase = 0;
  progress.step("setup");
  CPKV_CUDA_CHECK(cudaSetDevice(rank % gpus));
  cudaStream_t stream = nullptr;
  CPKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const StressMemory m = map_stress_memory(boot, progress, rank, cp, host_phase);
  int clock_khz = 0;
  CPKV_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, rank % gpus));
  const long long delay_cycles = static_cast<long long>(o.slow_delay_us) * clock_khz / 1000;
  host_barrier(boot, progress, rank, cp, host_phase);
  progress.step("stress");
  std::uint64_t phase = 0;
  for (std::int32_t i = 1; i <= o.iterations; ++i) {
    ++phase;
    if (i % cp == rank && delay_cycles > 0) CPKV_CUDA_CHECK(kernels::launch_spin(delay_cycles, stream));
    CPKV_CUDA_CHECK(kernels::launch_stamp(m.stamps + (i % 2), phase, stream));
    CPKV_CUDA_CHECK(kernels::launch_barrier(m.d_pads, rank, cp, phase, m.status, stream));
    CPKV_CUDA_CHECK(kernels::launch_check_stamps(m.d_stamp[i % 2], cp, phase, m.errors, stream));
  }
  wait_device(progress, stream);
  progress.step("timed");
  if (o.timed_barriers > 0) boot->us_per_barrier[rank] = time_barriers(boot, progress, o, rank, m, stream, phase, host_phase);
  kernels::BarrierStatus host_status{};
  unsigned long long host_errors = 0;
  CPKV_CUDA_CHECK(cudaMemcpy(&host_status, m.status, sizeof(host_status), cudaMemcpyDeviceToHost));
  CPKV_CUDA_CHECK(cudaMemcpy(&host_errors, m.errors, sizeof(host_errors), cudaMemcpyDeviceToHost));
  boot->phase_errors[rank] = host_errors;
  boot->timeouts[rank] = host_status.timed_out_phase != 0 ? 1 : 0;
  host_barrier(boot, progress, rank, cp, host_phase);  // quiescence: every rank has finished every barrier
  std::vector<std::uint64_t> words(cp);
  CPKV_CUDA_CHECK(cudaMemcpy(words.data(), m.pad, cp * sizeof(std::uint64_t), cudaMemcpyDeviceToHost));
  boot->drained[rank] = std::all_of(words.begin(), words.end(), [&](std::uint64_t w) { return w == phase; }) ? 1 : 0;
  progress.step("done");
  host_barrier(boot, progress, rank, cp, host_phase);
  return harness::kRankExitOk;
}

}  // namespace

BarrierStressReport barrier_stress(const BarrierStressOptions& o) {
  BarrierStressReport report;
  if (o.cp < 1 || o.cp > kRanksMax) throw std::invalid_argument(fmt::format("cp {} is outside 1..{}", o.cp, kRanksMax));
  const int gpus = gpu_count();
  if (gpus == 0) {
    report.failure = "no CUDA device";
    return report;
  }
  harness::SharedRegion region = harness::SharedRegion::create(sizeof(Bootstrap));
  auto* boot = new (region.base()) Bootstrap();
  harness::LaunchOptions launch;
  launch.ranks = o.cp;
  launch.run_ms_max = o.run_ms_max;
  launch.stuck_ms_max = o.stuck_ms_max;
  launch.label = "barrier rank";
  const harness::LaunchResult launched = harness::launch_ranks(launch, [&](std::int32_t r, harness::RankProgress& progress) {
    return barrier_stress_rank(boot, progress, o, r, gpus);
  });
  report.failure = launched.failure;
  report.drained = true;
  for (std::int32_t r = 0; r < o.cp; ++r) {
    report.phase_errors += boot->phase_errors[r].load();
    report.timeouts += boot->timeouts[r].load();
    report.drained = report.drained && boot->drained[r].load() == 1;
    report.us_per_barrier.push_back(boot->us_per_barrier[r]);
  }
  return report;
}


}  // namespace cpkv::cuda

#include "bootstrap.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "cpkv/harness/probe.hpp"
#include "cpkv/harness/request.hpp"

namespace cpkv::cuda {

void record(Bootstrap* boot, const harness::Violation& v) {
  boot->violations_by_invariant[std::clamp(v.invariant, 0, harness::kInvariants)].fetch_add(1);
  const std::int64_t index = boot->violation_count.fetch_add(1);
  if (index < harness::kViolationsMax) boot->violations[index] = v;
}

void wait_device(harness::RankProgress& progress, cudaStream_t stream) {
  const harness::Waiting waiting(progress, harness::kWaitingOnDevice);
  CPKV_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void host_barrier(Bootstrap* boot, harness::RankProgress& progress, std::int32_t rank, std::int32_t cp, std::uint64_t& phase) {
  ++phase;
  boot->arrivals[rank].store(phase, std::memory_order_release);
  const Clock::time_point start = Clock::now();
  for (std::int32_t p = 0; p < cp; ++p) {
    if (boot->arrivals[p].load(std::memory_order_acquire) >= phase) continue;
    const harness::Waiting waiting(progress, p);
    while (boot->arrivals[p].load(std::memory_order_acquire) < phase) {
      if (Clock::now() - start > std::chrono::milliseconds(boot->wait_ms_max)) {
        throw std::runtime_error(fmt::format("rank {} waited {} ms at host barrier {} for rank {}", rank, boot->wait_ms_max, phase, p));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

FaultSite& fault_site() {
  static FaultSite site;
  return site;
}

cudaError_t sticky_error() {
  std::size_t free_bytes = 0, total_bytes = 0;
  return cudaMemGetInfo(&free_bytes, &total_bytes);
}

bool context_lost() { return sticky_error() != cudaSuccess; }

std::string device_fault_line(const std::string& seen_at, cudaError_t error) {
  const FaultSite& site = fault_site();
  std::string place = site.device_place ? site.device_place() : std::string();
  if (place.empty()) {
    place = fmt::format("rank {}", site.rank);
    if (site.progress != nullptr) {
      const std::int64_t batch = site.progress->batch.load();
      const std::int32_t layer = site.progress->layer.load();
      if (batch >= 0) place += fmt::format(" batch {}", batch);
      if (layer >= 0) place += fmt::format(" layer {}", layer);
      std::string step;
      for (const auto& c : site.progress->step) {
        if (c.load() == '\0') break;
        step += c.load();
      }
      if (!step.empty()) place += fmt::format(" (step {})", step);
    }
    // No milestone says which work faulted (the plugin host between its calls): the host's place,
    // where it saw the fault, and the work is cpkv's own kernels enqueued up to there.
    place += context_lost() ? ": a device fault in the kernels the rank enqueued up to here (cpkv's own, where no plugin call is named)" : ": a CUDA call failed";
  }
  return fmt::format("{}: CUDA: {} (seen at {})", place, cudaGetErrorString(error), seen_at);
}

namespace {

[[noreturn]] void throw_named(const char* file, int line, const char* call, cudaError_t error) {
  kernels::cuda_fault_named = true;
  throw std::runtime_error(device_fault_line(fmt::format("{}:{}: {}", file, line, call), error));
}

}  // namespace

void name_device_faults(std::int32_t rank, harness::Progress& progress) {
  fault_site().rank = rank;
  fault_site().progress = &progress;
  kernels::cuda_failure_hook = throw_named;
}

int gpu_count() {
  // In a child (this process never touches CUDA before its ranks fork); a hung driver must not hang
  // the caller: 60 s, then no GPU.
  int count = 0;
  const harness::ProbeOutcome probe = harness::run_probe<int>([](int& out) {
    if (cudaGetDeviceCount(&out) != cudaSuccess) out = 0;
  }, count, std::chrono::seconds(60));
  return probe.answered ? std::clamp(count, 0, 100) : 0;
}

int gpus_or_refuse() {
  const int gpus = gpu_count();
  if (gpus == 0) throw harness::RequestError("backend", "cuda: no CUDA device is visible on this machine");
  return gpus;
}

}  // namespace cpkv::cuda

// One batch in flight on one rank, and the parts of one layer: what the functional executor
// (executor.cpp) runs and checks, and what the benchmark's bodies (bench_bodies.cpp) replay.
#pragma once

#include <cstdint>
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

  std::int32_t half_of(std::int32_t l) const { return mutant.single_half() ? 0 : model::parity_half(l); }
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

// bench_bodies.cpp: times the batch just run (its bytes checked first) with every body of
// kTimingTable; the isolated exchange's current pages are uploaded through `uploads`.
void time_run(BatchRun& run, DeviceUploads& uploads, std::int64_t batch_index);

}  // namespace cpkv::cuda

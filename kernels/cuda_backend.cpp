#include "cuda_backend.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <new>
#include <stdexcept>
#include <thread>
#include <vector>

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

#include "cpkv/harness/launch.hpp"
#include "cpkv/model/batch.hpp"
#include "cpkv/model/expected.hpp"
#include "cpkv/model/oracle.hpp"
#include "cpkv/model/plan.hpp"
#include "cpkv/model/staging.hpp"
#include "cpkv/sim/shared_region.hpp"
#include "launchers.cuh"

#define CPKV_NCCL_CHECK(call)                                                                                          \
  do {                                                                                                                 \
    const ncclResult_t cpkv_nccl_ = (call);                                                                            \
    if (cpkv_nccl_ != ncclSuccess) {                                                                                   \
      std::fprintf(stderr, "cpkv: %s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, ncclGetErrorString(cpkv_nccl_)); \
      std::abort();                                                                                                    \
    }                                                                                                                  \
  } while (0)

namespace cpkv::cuda {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kRanksMax = 8;
constexpr int kBenchBatchesMax = kBenchBatchesLimit;
constexpr std::int64_t kHostWaitMsMax = 120000;  // setup and batch-boundary waits (first NCCL init is slow)

// What one rank measured in benchmark mode.
struct BenchRank {
  double layer_us_median[kBenchBatchesMax];
  double layer_us_min[kBenchBatchesMax];
  double layer_us_max[kBenchBatchesMax];
  double isolated_us_median[kBenchBatchesMax];
  double ce_peer_gbps;
  double local_copy_gbps;
  double barrier_us;
  double barrier_us_launch_free;
  double gather_gbps[2][4];
  std::int64_t host_syncs_in_layer_loop;
};

// The bootstrap segment: what the ranks exchange once (IPC handles, the NCCL id, the capability
// probe) and what they report back (totals, violations). Where each rank is lives in the harness's
// progress records.
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
  sim::SharedTotals totals[kRanksMax];
  std::atomic<std::int64_t> violation_count;
  sim::Violation violations[sim::World::kViolationsMax];
  cudaIpcMemHandle_t bench[kRanksMax];
  BenchRank bench_results[kRanksMax];
  // barrier_stress results
  std::atomic<std::uint64_t> phase_errors[kRanksMax];
  std::atomic<std::uint64_t> timeouts[kRanksMax];
  std::atomic<std::int32_t> drained[kRanksMax];
  double us_per_barrier[kRanksMax];
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);

void record(Bootstrap* boot, const sim::Violation& v) {
  const std::int64_t index = boot->violation_count.fetch_add(1);
  if (index < sim::World::kViolationsMax) boot->violations[index] = v;
}

// Waits for the rank's queued GPU work, marked as a wait so that the launcher's watchdog blames a
// silent peer and not this rank.
void wait_device(harness::RankProgress& progress, cudaStream_t stream) {
  const harness::Waiting waiting(progress, harness::kWaitingOnDevice);
  CPKV_CUDA_CHECK(cudaStreamSynchronize(stream));
}

// Host-side barrier among the rank processes (setup and batch boundaries only, never per layer).
void host_barrier(Bootstrap* boot, harness::RankProgress& progress, std::int32_t rank, std::int32_t cp, std::uint64_t& phase) {
  ++phase;
  boot->arrivals[rank].store(phase, std::memory_order_release);
  const Clock::time_point start = Clock::now();
  for (std::int32_t p = 0; p < cp; ++p) {
    if (boot->arrivals[p].load(std::memory_order_acquire) >= phase) continue;
    const harness::Waiting waiting(progress, p);
    while (boot->arrivals[p].load(std::memory_order_acquire) < phase) {
      if (Clock::now() - start > std::chrono::milliseconds(kHostWaitMsMax)) {
        throw std::runtime_error(fmt::format("rank {} waited {} ms at host barrier {} for rank {}", rank, kHostWaitMsMax, phase, p));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

std::uint64_t align_up(std::uint64_t v) { return (v + 255) / 256 * 256; }

bool needs_ipc(model::Variant v) {
  return v == model::Variant::v2 || v == model::Variant::symm_dense || v == model::Variant::staging_publish ||
         v == model::Variant::staging_direct;
}

// Device memory of one rank and the peers' mappings of theirs.
struct RankMemory {
  std::uint8_t* pool = nullptr;
  std::uint8_t* staging = nullptr;
  std::uint8_t* dense = nullptr;
  std::uint8_t* compact = nullptr;
  std::uint64_t* pad = nullptr;
  std::vector<std::uint8_t*> peer_pool, peer_staging, peer_dense, peer_compact;
  std::uint8_t* scratch = nullptr;  // the IPC all-reduce's receive buffer
  std::vector<std::uint64_t*> peer_pad;
  std::uint64_t** pad_table = nullptr;  // device array of every rank's pad
  kernels::BarrierStatus* barrier_status = nullptr;
  std::vector<std::vector<std::uint64_t>> pool_offset;   // [layer][kind]
  std::vector<std::vector<std::uint64_t>> dense_offset;  // [half][kind]
  std::vector<std::uint64_t> compact_offset;             // [kind]
  model::ArenaCarve carve;
};

// Everything a batch needs on the device, uploaded once per batch.
struct BatchPlan {
  model::BatchLayout layout;
  model::VariantPlan plan;
  bool overflow = false;
  std::vector<kernels::GatherEntry> local_prefix, zero_own, pack, gather1, publish, gather2, unpack;
  std::vector<std::int32_t> inv_request;
  std::vector<std::int64_t> inv_token, inv_dest;
  std::vector<kernels::SlotSource> slots;
  std::vector<std::int64_t> populate_logical, populate_local;
};

// A device copy of a host vector, freed with the batch.
template <typename T>
T* upload(const std::vector<T>& host, std::vector<void*>& owned, cudaStream_t stream) {
  if (host.empty()) return nullptr;
  void* device = nullptr;
  CPKV_CUDA_CHECK(cudaMalloc(&device, host.size() * sizeof(T)));
  CPKV_CUDA_CHECK(cudaMemcpyAsync(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
  owned.push_back(device);
  return static_cast<T*>(device);
}

BatchPlan build_batch_plan(const model::Setting& setting, const model::Batch& batch, model::Variant variant, std::int32_t rank,
                           std::int64_t staging_slots, std::vector<bool>& populated) {
  BatchPlan b;
  b.layout = model::layout_batch(setting, batch);
  b.overflow = model::overflow_verdict(b.layout.current_pages_total, staging_slots).overflow;
  // A rejected batch moves nothing, so it must not claim pool pages as populated either (a later
  // batch reading them would find them never written: found by the GPU property test).
  if (b.overflow) return b;
  b.plan = model::variant_plan(b.layout, variant, rank);
  const model::VariantPlan& p = b.plan;
  const std::int32_t cp = setting.cp;
  const auto slot_of = [&](std::int64_t i) { return b.layout.current[i].slot; };
  for (std::int64_t slot : p.local_prefix_slots) b.local_prefix.push_back({slot, b.layout.slots[slot].page_or_index / cp, rank, 0});
  if (p.zero_own_current) {
    for (std::int64_t i : p.own_current) b.zero_own.push_back({p.fill_to_staging ? i : slot_of(i), 0, -1, 0});
  }
  for (std::int64_t i = 0; i < p.compact_pages; ++i) {
    const bool own = b.layout.current[i].writer == rank;
    b.pack.push_back({i, slot_of(i), own ? kernels::kTableOwnDense : -1, 0});
    b.unpack.push_back({slot_of(i), i, kernels::kTableOwnCompact, 0});
  }
  for (std::size_t s = 0; s < p.gather1.size(); ++s) {
    if (p.gather1[s].table_index != model::SlotDescriptor::kSkip) b.gather1.push_back({static_cast<std::int64_t>(s), p.gather1[s].source_page, p.gather1[s].table_index, 0});
  }
  for (std::size_t s = 0; s < p.gather2.size(); ++s) {
    if (p.gather2[s].table_index != model::SlotDescriptor::kSkip) b.gather2.push_back({static_cast<std::int64_t>(s), p.gather2[s].source_page, p.gather2[s].table_index, 0});
  }
  if (p.publish) {
    for (std::int64_t i : p.own_current) b.publish.push_back({i, slot_of(i), kernels::kTableOwnDense, 0});
  }
  const model::PageInverse inverse = model::page_inverse(b.layout, batch, rank, p.fill_to_staging ? model::InverseTarget::staging : model::InverseTarget::dense);
  for (std::size_t t = 0; t < inverse.tokens.size(); ++t) {
    b.inv_request.push_back(inverse.tokens[t].request);
    b.inv_token.push_back(inverse.tokens[t].token);
    b.inv_dest.push_back(inverse.dest_row[t]);
  }
  for (const model::Slot& slot : b.layout.slots) {
    if (slot.kind != model::SlotKind::prefix || slot.page_or_index % cp != rank || populated[slot.page_or_index / cp]) continue;
    populated[slot.page_or_index / cp] = true;
    b.populate_logical.push_back(slot.page_or_index);
    b.populate_local.push_back(slot.page_or_index / cp);
  }
  // What the verify kernel expects comes from the plain oracle (model/oracle.hpp), which walks the
  // requests itself, not from the layout the gathers were planned on.
  const model::spec::ByteOracle oracle(setting.page_size, batch);
  for (std::int64_t s = 0; s < oracle.slot_count(); ++s) {
    const model::spec::DenseSlot& slot = oracle.slot(s);
    b.slots.push_back({slot.prefix ? slot.logical_page : -1, slot.first_token, slot.request, slot.rows_valid});
  }
  return b;
}

struct RankContext {
  Bootstrap* boot;
  const sim::BatchSource& source;
  const sim::SimOptions& options;
  const CudaOptions& cuda;
  sim::SourceShape shape;
  std::int32_t rank;
  std::int32_t gpus;
  harness::RankProgress& progress;
};

// Ceilings, every rank at once: copy-engine pull from the next rank, local copy, back-to-back
// barriers, and the gather kernel pulling pages from the next rank.
void measure_ceilings(const RankContext& ctx, RankMemory& mem, cudaStream_t stream, std::uint8_t* own, std::uint64_t& host_phase,
                      std::uint64_t& barrier_phase, BenchRank& out) {
  Bootstrap* boot = ctx.boot;
  harness::RankProgress& progress = ctx.progress;
  const std::int32_t cp = ctx.source.setting.cp;
  const std::int32_t rank = ctx.rank;
  const std::uint64_t half = kBenchBufferBytes / 2;
  std::uint8_t* peer = own;
  if (cp > 1) {
    void* ptr = nullptr;
    CPKV_CUDA_CHECK(cudaIpcOpenMemHandle(&ptr, boot->bench[(rank + 1) % cp], cudaIpcMemLazyEnablePeerAccess));
    peer = static_cast<std::uint8_t*>(ptr);
  }
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  CPKV_CUDA_CHECK(cudaEventCreate(&start));
  CPKV_CUDA_CHECK(cudaEventCreate(&stop));
  const auto timed = [&](const auto& body, int reps) {
    body();  // warm-up
    wait_device(progress, stream);
    host_barrier(boot, progress, rank, cp, host_phase);
    CPKV_CUDA_CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < reps; ++i) body();
    CPKV_CUDA_CHECK(cudaEventRecord(stop, stream));
    {
      const harness::Waiting waiting(progress, harness::kWaitingOnDevice);
      CPKV_CUDA_CHECK(cudaEventSynchronize(stop));
    }
    float ms = 0;
    CPKV_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return static_cast<double>(ms) / reps;  // ms per body
  };
  const double pull_ms = timed([&] { CPKV_CUDA_CHECK(cudaMemcpyAsync(own + half, peer, half, cudaMemcpyDeviceToDevice, stream)); }, 5);
  out.ce_peer_gbps = half / (pull_ms * 1e6);
  const double local_ms = timed([&] { CPKV_CUDA_CHECK(cudaMemcpyAsync(own + half, own, half, cudaMemcpyDeviceToDevice, stream)); }, 5);
  out.local_copy_gbps = half / (local_ms * 1e6);
  const double barrier_ms = timed([&] { CPKV_CUDA_CHECK(kernels::launch_barrier(mem.pad_table, rank, cp, ++barrier_phase, mem.barrier_status, stream)); }, 1000);
  out.barrier_us = 1000.0 * barrier_ms;
  const std::int32_t looped = 1000;
  const double loop_ms = timed([&] {
    CPKV_CUDA_CHECK(kernels::launch_barrier_loop(mem.pad_table, rank, cp, barrier_phase + 1, looped, mem.barrier_status, stream));
    barrier_phase += looped;
  }, 3);
  out.barrier_us_launch_free = 1000.0 * loop_ms / looped;
  const std::uint64_t page_sizes[2] = {656ULL * 64, 132ULL * 64};
  const std::int64_t counts[4] = {64, 256, 1024, 4096};
  std::vector<void*> owned;
  for (int ps = 0; ps < 2; ++ps) {
    for (int c = 0; c < 4; ++c) {
      std::vector<kernels::GatherEntry> entries;
      // Scattered sources, as a pool leaves them: a stride walk over the source half.
      const std::int64_t source_pages = static_cast<std::int64_t>(half / page_sizes[ps]);
      for (std::int64_t i = 0; i < counts[c]; ++i) entries.push_back({i, (i * 7919) % source_pages, 0, 0});
      const kernels::GatherEntry* d_entries = upload(entries, owned, stream);
      kernels::PointerTable table{};
      table.base[0] = peer;
      const double ms = timed([&] { CPKV_CUDA_CHECK(kernels::launch_gather(own + half, page_sizes[ps], table, d_entries, counts[c], stream)); }, 10);
      out.gather_gbps[ps][c] = counts[c] * page_sizes[ps] / (ms * 1e6);
    }
  }
  wait_device(progress, stream);
  for (void* p : owned) CPKV_CUDA_CHECK(cudaFree(p));
  host_barrier(boot, progress, rank, cp, host_phase);
}

int cuda_rank(const RankContext& ctx) {
  const model::Setting& setting = ctx.source.setting;
  const std::int32_t cp = setting.cp;
  const std::int32_t rank = ctx.rank;
  const std::int32_t layers = ctx.options.layers;
  const std::size_t kinds = setting.kinds.size();
  Bootstrap* boot = ctx.boot;
  harness::RankProgress& progress = ctx.progress;
  std::uint64_t host_phase = 0;
  progress.step("setup");
  CPKV_CUDA_CHECK(cudaSetDevice(rank % ctx.gpus));
  cudaStream_t stream = nullptr;
  CPKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // Allocation: sizes from the largest batch, fixed before the first batch (registration).
  RankMemory mem;
  const std::int64_t staging_slots = model::staging_capacity(setting).staging_slots;
  mem.carve = model::carve_arena(setting, staging_slots, 0);
  const auto page_bytes = [&](std::size_t k) { return std::uint64_t{setting.kinds[k].row_bytes} * setting.page_size; };
  std::uint64_t pool_bytes = 0;
  mem.pool_offset.assign(layers, std::vector<std::uint64_t>(kinds));
  for (std::int32_t l = 0; l < layers; ++l) {
    for (std::size_t k = 0; k < kinds; ++k) {
      mem.pool_offset[l][k] = pool_bytes;
      pool_bytes = align_up(pool_bytes + setting.pool_pages_per_rank() * page_bytes(k));
    }
  }
  std::uint64_t dense_bytes = 0;
  mem.dense_offset.assign(2, std::vector<std::uint64_t>(kinds));
  for (int h = 0; h < 2; ++h) {
    for (std::size_t k = 0; k < kinds; ++k) {
      mem.dense_offset[h][k] = dense_bytes;
      dense_bytes = align_up(dense_bytes + ctx.shape.slot_count_max * page_bytes(k));
    }
  }
  std::uint64_t compact_bytes = 0;
  for (std::size_t k = 0; k < kinds; ++k) {
    mem.compact_offset.push_back(compact_bytes);
    compact_bytes = align_up(compact_bytes + ctx.shape.current_pages_max * page_bytes(k));
  }
  CPKV_CUDA_CHECK(cudaMalloc(&mem.pool, std::max<std::uint64_t>(pool_bytes, 256)));
  CPKV_CUDA_CHECK(cudaMalloc(&mem.staging, std::max<std::uint64_t>(mem.carve.staging_bytes, 256)));
  CPKV_CUDA_CHECK(cudaMalloc(&mem.dense, std::max<std::uint64_t>(dense_bytes, 256)));
  CPKV_CUDA_CHECK(cudaMalloc(&mem.compact, std::max<std::uint64_t>(compact_bytes, 256)));
  CPKV_CUDA_CHECK(cudaMalloc(&mem.pad, 256));
  CPKV_CUDA_CHECK(cudaMemset(mem.pad, 0, 256));
  CPKV_CUDA_CHECK(cudaMemset(mem.staging, 0xA5, std::max<std::uint64_t>(mem.carve.staging_bytes, 256)));  // garbage, as fresh memory
  CPKV_CUDA_CHECK(cudaMalloc(&mem.barrier_status, sizeof(kernels::BarrierStatus)));
  CPKV_CUDA_CHECK(cudaMemset(mem.barrier_status, 0, sizeof(kernels::BarrierStatus)));
  CPKV_CUDA_CHECK(cudaIpcGetMemHandle(&boot->pool[rank], mem.pool));
  CPKV_CUDA_CHECK(cudaIpcGetMemHandle(&boot->staging[rank], mem.staging));
  CPKV_CUDA_CHECK(cudaIpcGetMemHandle(&boot->dense[rank], mem.dense));
  CPKV_CUDA_CHECK(cudaIpcGetMemHandle(&boot->pad[rank], mem.pad));
  CPKV_CUDA_CHECK(cudaIpcGetMemHandle(&boot->compact[rank], mem.compact));
  std::uint64_t page_bytes_max = 0;
  for (std::size_t k = 0; k < kinds; ++k) page_bytes_max = std::max(page_bytes_max, page_bytes(k));
  CPKV_CUDA_CHECK(cudaMalloc(&mem.scratch, std::max<std::uint64_t>(256, std::max(ctx.shape.slot_count_max, ctx.shape.current_pages_max) * page_bytes_max)));
  std::uint8_t* bench_buffer = nullptr;  // ceilings: 256 MiB others pull from, 256 MiB to land in
  if (ctx.cuda.measure_ceilings) {
    CPKV_CUDA_CHECK(cudaMalloc(&bench_buffer, kBenchBufferBytes));
    CPKV_CUDA_CHECK(cudaMemset(bench_buffer, 1, kBenchBufferBytes));
    CPKV_CUDA_CHECK(cudaIpcGetMemHandle(&boot->bench[rank], bench_buffer));
  }
  {
    const harness::Waiting waiting(progress, harness::kWaitingOnDevice);
    CPKV_CUDA_CHECK(cudaDeviceSynchronize());
  }
  host_barrier(boot, progress, rank, cp, host_phase);

  // Map every peer once (never the own handles), then agree on the capability (MIN).
  progress.step("ipc");
  mem.peer_pool.assign(cp, nullptr);
  mem.peer_staging.assign(cp, nullptr);
  mem.peer_dense.assign(cp, nullptr);
  mem.peer_pad.assign(cp, nullptr);
  mem.peer_compact.assign(cp, nullptr);
  std::int32_t capable = 1;
  for (std::int32_t p = 0; p < cp; ++p) {
    if (p == rank) {
      mem.peer_pool[p] = mem.pool;
      mem.peer_staging[p] = mem.staging;
      mem.peer_dense[p] = mem.dense;
      mem.peer_pad[p] = mem.pad;
      mem.peer_compact[p] = mem.compact;
      continue;
    }
    const int peer_device = p % ctx.gpus;
    if (peer_device != rank % ctx.gpus) {
      int can = 0;
      CPKV_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, rank % ctx.gpus, peer_device));
      if (!can) capable = 0;
    }
    void* ptr = nullptr;
    const auto open = [&](const cudaIpcMemHandle_t& handle) -> std::uint8_t* {
      if (cudaIpcOpenMemHandle(&ptr, handle, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) {
        (void)cudaGetLastError();
        capable = 0;
        return nullptr;
      }
      return static_cast<std::uint8_t*>(ptr);
    };
    mem.peer_pool[p] = open(boot->pool[p]);
    mem.peer_staging[p] = open(boot->staging[p]);
    mem.peer_dense[p] = open(boot->dense[p]);
    mem.peer_pad[p] = reinterpret_cast<std::uint64_t*>(open(boot->pad[p]));
    mem.peer_compact[p] = open(boot->compact[p]);
  }
  if (ctx.options.ipc_missing_rank == rank) capable = 0;  // fault injection: this rank's probe fails
  boot->probe[rank].store(capable);
  host_barrier(boot, progress, rank, cp, host_phase);
  std::int32_t agreed = capable;
  for (std::int32_t p = 0; p < cp; ++p) agreed = std::min(agreed, boot->probe[p].load());
  const model::Variant variant = needs_ipc(ctx.options.variant) && agreed == 0 ? model::Variant::v2_fallback : ctx.options.variant;
  boot->path[rank].store(static_cast<std::int32_t>(variant));
  CPKV_CUDA_CHECK(cudaMalloc(&mem.pad_table, cp * sizeof(std::uint64_t*)));
  CPKV_CUDA_CHECK(cudaMemcpy(mem.pad_table, mem.peer_pad.data(), cp * sizeof(std::uint64_t*), cudaMemcpyHostToDevice));

  // NCCL: rank 0 makes the id, everyone joins. Multicast stays off (DEVICE.md). NCCL refuses two
  // ranks on one GPU, so an oversubscribed group (functional runs of cp 4 or 8 on 2 GPUs) sums
  // through IPC instead: barrier, every rank sums every peer's bytes, barrier, copy back.
  const bool use_nccl = ctx.gpus >= cp;
  ncclComm_t comm = nullptr;
  if (use_nccl) {
    progress.step("nccl");
    if (rank == 0) CPKV_NCCL_CHECK(ncclGetUniqueId(&boot->nccl_id));
    host_barrier(boot, progress, rank, cp, host_phase);
    {
      const harness::Waiting waiting(progress, harness::kWaitingOnPeers);  // init returns when every rank has joined
      const harness::Quiet quiet(progress.record(), kHostWaitMsMax);      // a first init can take tens of seconds
      CPKV_NCCL_CHECK(ncclCommInitRank(&comm, cp, boot->nccl_id, rank));
    }
    host_barrier(boot, progress, rank, cp, host_phase);
  }

  sim::SharedTotals& totals = boot->totals[rank];
  std::vector<bool> populated(setting.pool_pages_per_rank(), false);
  std::uint64_t barrier_phase = 0;
  // A sum all-reduce of `bytes` at byte offset `offset` of every rank's dense (or compact) buffer.
  const auto all_reduce = [&](std::uint8_t* own, const std::vector<std::uint8_t*>& peers, std::uint64_t offset, std::uint64_t bytes) {
    if (use_nccl) {
      CPKV_NCCL_CHECK(ncclAllReduce(own, own, bytes, ncclUint8, ncclSum, comm, stream));
      return;
    }
    kernels::PointerTable sources{};
    for (std::int32_t p = 0; p < cp; ++p) sources.base[p] = peers[p] + offset;
    CPKV_CUDA_CHECK(kernels::launch_barrier(mem.pad_table, rank, cp, ++barrier_phase, mem.barrier_status, stream));
    CPKV_CUDA_CHECK(kernels::launch_sum_bytes(mem.scratch, sources, cp, bytes, stream));
    CPKV_CUDA_CHECK(kernels::launch_barrier(mem.pad_table, rank, cp, ++barrier_phase, mem.barrier_status, stream));
    if (bytes > 0) CPKV_CUDA_CHECK(cudaMemcpyAsync(own, mem.scratch, bytes, cudaMemcpyDeviceToDevice, stream));
  };
  BenchRank& bench = boot->bench_results[rank];
  // Every host-device synchronization of the batch path goes through here and is counted, so the
  // benchmark reports how many fall inside the layer loop (the seeds found 642 per forward).
  std::int64_t host_syncs = 0;
  const auto sync_stream = [&] {
    ++host_syncs;
    wait_device(progress, stream);
  };
  if (ctx.cuda.measure_ceilings) measure_ceilings(ctx, mem, stream, bench_buffer, host_phase, barrier_phase, bench);
  // Times `reps` layers (after `warmup`) of the batch just run, CUDA events around each layer.
  const auto time_batch = [&](std::int64_t batch_index, const auto& run_layer, const auto& run_isolated) {
    if (batch_index >= kBenchBatchesMax) return;
    const std::int32_t warmup = 3;
    const std::int32_t total = warmup + ctx.cuda.timing_reps;
    const auto time_loop = [&](const auto& body) {
      std::vector<cudaEvent_t> events(2 * total);
      for (cudaEvent_t& e : events) CPKV_CUDA_CHECK(cudaEventCreate(&e));
      wait_device(progress, stream);
      host_barrier(boot, progress, rank, cp, host_phase);
      // Consecutive timed layers must alternate parity halves (PROTOCOL.md section 6): cycle over an
      // even number of layers (the CLI refuses --layers 1 for timing).
      const std::int32_t cycle = layers % 2 == 0 ? layers : layers - 1;
      for (std::int32_t i = 0; i < total; ++i) {
        CPKV_CUDA_CHECK(cudaEventRecord(events[2 * i], stream));
        body(i % cycle);
        CPKV_CUDA_CHECK(cudaEventRecord(events[2 * i + 1], stream));
      }
      wait_device(progress, stream);
      std::vector<double> us;
      for (std::int32_t i = warmup; i < total; ++i) {
        float ms = 0;
        CPKV_CUDA_CHECK(cudaEventElapsedTime(&ms, events[2 * i], events[2 * i + 1]));
        us.push_back(1000.0 * ms);
      }
      for (cudaEvent_t& e : events) CPKV_CUDA_CHECK(cudaEventDestroy(e));
      std::sort(us.begin(), us.end());
      return us;
    };
    const std::vector<double> layer = time_loop([&](std::int32_t l) { run_layer(l, false); });
    bench.layer_us_median[batch_index] = layer[layer.size() / 2];
    bench.layer_us_min[batch_index] = layer.front();
    bench.layer_us_max[batch_index] = layer.back();
    const std::vector<double> isolated = time_loop([&](std::int32_t l) { run_isolated(l); });
    bench.isolated_us_median[batch_index] = isolated[isolated.size() / 2];
  };
  sim::BatchCursor cursor(ctx.source);
  kernels::VerifyResult* verify = nullptr;
  const std::size_t verify_slots = static_cast<std::size_t>(layers) * kinds;
  CPKV_CUDA_CHECK(cudaMalloc(&verify, verify_slots * sizeof(kernels::VerifyResult)));
  std::vector<kernels::VerifyResult> verify_init(verify_slots, kernels::VerifyResult{0, ~0ULL});
  while (std::optional<model::Batch> batch = cursor.next()) {
    const std::int64_t batch_index = cursor.index();
    progress.at(batch_index, -1);
    progress.step("batch");
    BatchPlan b = build_batch_plan(setting, *batch, variant, rank, staging_slots, populated);
    std::vector<void*> owned;
    ++totals.batches;
    if (b.overflow) {
      ++totals.overflows;
      host_barrier(boot, progress, rank, cp, host_phase);
      host_barrier(boot, progress, rank, cp, host_phase);
      continue;
    }
    const auto* d_local_prefix = upload(b.local_prefix, owned, stream);
    const auto* d_zero_own = upload(b.zero_own, owned, stream);
    const auto* d_pack = upload(b.pack, owned, stream);
    const auto* d_gather1 = upload(b.gather1, owned, stream);
    const auto* d_publish = upload(b.publish, owned, stream);
    const auto* d_gather2 = upload(b.gather2, owned, stream);
    const auto* d_unpack = upload(b.unpack, owned, stream);
    const auto* d_inv_request = upload(b.inv_request, owned, stream);
    const auto* d_inv_token = upload(b.inv_token, owned, stream);
    const auto* d_inv_dest = upload(b.inv_dest, owned, stream);
    const auto* d_slots = upload(b.slots, owned, stream);
    const auto* d_pop_logical = upload(b.populate_logical, owned, stream);
    const auto* d_pop_local = upload(b.populate_local, owned, stream);
    CPKV_CUDA_CHECK(cudaMemcpyAsync(verify, verify_init.data(), verify_slots * sizeof(kernels::VerifyResult), cudaMemcpyHostToDevice, stream));
    CPKV_CUDA_CHECK(cudaMemsetAsync(mem.barrier_status, 0, sizeof(kernels::BarrierStatus), stream));  // a timeout is reported once
    // Pool content for the pages this rank owns (written once: it never changes), and garbage in
    // the dense buffers, as a fresh allocation would hold.
    for (std::int32_t l = 0; l < layers; ++l) {
      for (std::size_t k = 0; k < kinds; ++k) {
        CPKV_CUDA_CHECK(kernels::launch_populate_pool(mem.pool + mem.pool_offset[l][k], setting.kinds[k].row_bytes, setting.page_size, d_pop_logical,
                                                      d_pop_local, static_cast<std::int64_t>(b.populate_logical.size()), ctx.options.seed,
                                                      static_cast<std::uint32_t>(l), static_cast<std::uint32_t>(k), stream));
      }
    }
    CPKV_CUDA_CHECK(cudaMemsetAsync(mem.dense, 0x5A, dense_bytes, stream));
    sync_stream();
    host_barrier(boot, progress, rank, cp, host_phase);  // every pool is populated before anyone gathers

    const bool symm = variant == model::Variant::symm_dense;
    std::uint64_t peer_bytes = 0;
    // One layer of the exchange, as the plan says; no host synchronization inside.
    // The 2*cp pointer tables of every (layer, kind) and the pages gathered from peers: batch
    // values, built here once, not on every layer.
    // Planted bugs (sim::Mutant; off unless asked for): each switch changes one step, and a spin on
    // one rank opens the race window so the bug shows on every run, not once in a while.
    const sim::Mutant mutant = ctx.options.mutant;
    const auto half_of = [&](std::int32_t l) { return mutant == sim::Mutant::single_half ? 0 : model::parity_half(l); };
    const bool skip_zero = mutant == sim::Mutant::skip_zero;
    const bool slow_producer = (mutant == sim::Mutant::no_barrier || mutant == sim::Mutant::barrier_passes_early) && rank == cp - 1;
    const bool slow_reader = mutant == sim::Mutant::single_half && rank == 0;
    std::vector<std::vector<kernels::PointerTable>> tables(layers, std::vector<kernels::PointerTable>(kinds));
    for (std::int32_t l = 0; l < layers; ++l) {
      const std::int32_t h = half_of(l);
      for (std::size_t k = 0; k < kinds; ++k) {
        kernels::PointerTable& t = tables[l][k];
        for (std::int32_t p = 0; p < cp; ++p) {
          t.base[p] = mem.peer_pool[p] ? mem.peer_pool[p] + mem.pool_offset[l][k] : nullptr;
          t.base[cp + p] = symm ? (mem.peer_dense[p] ? mem.peer_dense[p] + mem.dense_offset[h][k] : nullptr)
                                : (mem.peer_staging[p] ? mem.peer_staging[p] + mem.carve.slot_offset(h, k, 0) : nullptr);
        }
        t.base[kernels::kTableOwnDense] = mem.dense + mem.dense_offset[h][k];
        t.base[kernels::kTableOwnCompact] = mem.compact + mem.compact_offset[k];
      }
    }
    std::uint64_t peer_pages_per_kind = 0;
    for (const std::vector<kernels::GatherEntry>* list : {&b.gather1, &b.gather2}) {
      for (const kernels::GatherEntry& e : *list) peer_pages_per_kind += e.table_index >= 0 && e.table_index % cp != rank ? 1 : 0;
    }
    const auto run_layer = [&](std::int32_t l, bool check) {
      const std::int32_t h = half_of(l);
      if (b.plan.zero_dense && !skip_zero) {
        const std::uint64_t half_bytes = mem.dense_offset[h][kinds - 1] - mem.dense_offset[h][0] + ctx.shape.slot_count_max * page_bytes(kinds - 1);
        CPKV_CUDA_CHECK(cudaMemsetAsync(mem.dense + mem.dense_offset[h][0], 0, half_bytes, stream));
      }
      for (std::size_t k = 0; k < kinds; ++k) {
        if (!setting.kind_active(k, l)) continue;
        const kernels::PointerTable& t = tables[l][k];
        std::uint8_t* dense_k = mem.dense + mem.dense_offset[h][k];
        std::uint8_t* staging_k = mem.staging + mem.carve.slot_offset(h, k, 0);
        std::uint8_t* fill_dest = b.plan.fill_to_staging ? staging_k : dense_k;
        const std::uint64_t pb = page_bytes(k);
        CPKV_CUDA_CHECK(kernels::launch_gather(dense_k, pb, t, d_local_prefix, static_cast<std::int64_t>(b.local_prefix.size()), stream));
        if (!skip_zero) CPKV_CUDA_CHECK(kernels::launch_gather(fill_dest, pb, t, d_zero_own, static_cast<std::int64_t>(b.zero_own.size()), stream));
        if (slow_producer) CPKV_CUDA_CHECK(kernels::launch_spin(kernels::kMutantWindowCycles, stream));
        CPKV_CUDA_CHECK(kernels::launch_fill_current(fill_dest, setting.kinds[k].row_bytes, d_inv_request, d_inv_token, d_inv_dest,
                                                     static_cast<std::int64_t>(b.inv_dest.size()), ctx.options.seed, static_cast<std::uint32_t>(l),
                                                     static_cast<std::uint32_t>(k), stream));
        CPKV_CUDA_CHECK(kernels::launch_gather(mem.compact + mem.compact_offset[k], pb, t, d_pack, static_cast<std::int64_t>(b.pack.size()), stream));
        CPKV_CUDA_CHECK(kernels::launch_gather(dense_k, pb, t, d_gather1, static_cast<std::int64_t>(b.gather1.size()), stream));
        CPKV_CUDA_CHECK(kernels::launch_gather(staging_k, pb, t, d_publish, static_cast<std::int64_t>(b.publish.size()), stream));
      }
      if (b.plan.barrier && mutant != sim::Mutant::no_barrier) {
        ++barrier_phase;
        if (check) ++totals.barriers;
        // barrier_passes_early signals and waits for the previous phase: a rank passes phase k once
        // every peer reached k - 1 (and the pads end one short of drained).
        const std::uint64_t phase = mutant == sim::Mutant::barrier_passes_early ? barrier_phase - 1 : barrier_phase;
        CPKV_CUDA_CHECK(kernels::launch_barrier(mem.pad_table, rank, cp, phase, mem.barrier_status, stream));
      }
      if (slow_reader) CPKV_CUDA_CHECK(kernels::launch_spin(kernels::kMutantWindowCycles, stream));
      for (std::size_t k = 0; k < kinds; ++k) {
        if (!setting.kind_active(k, l)) continue;
        const std::uint64_t pb = page_bytes(k);
        std::uint8_t* dense_k = mem.dense + mem.dense_offset[h][k];
        CPKV_CUDA_CHECK(kernels::launch_gather(dense_k, pb, tables[l][k], d_gather2, static_cast<std::int64_t>(b.gather2.size()), stream));
        for (const model::SlotRange& range : b.plan.allreduce_ranges) {
          const std::uint64_t offset = mem.dense_offset[h][k] + range.slot_begin * pb;
          all_reduce(mem.dense + offset, mem.peer_dense, offset, (range.slot_end - range.slot_begin) * pb);
          if (check) ++totals.collectives;
          if (check) totals.bytes_reduced += (range.slot_end - range.slot_begin) * pb;
        }
        if (b.plan.compact_allreduce) {
          all_reduce(mem.compact + mem.compact_offset[k], mem.peer_compact, mem.compact_offset[k], b.plan.compact_pages * pb);
          if (check) ++totals.collectives;
          if (check) totals.bytes_reduced += b.plan.compact_pages * pb;
          CPKV_CUDA_CHECK(kernels::launch_gather(dense_k, pb, tables[l][k], d_unpack, static_cast<std::int64_t>(b.unpack.size()), stream));
        }
        if (check) peer_bytes += peer_pages_per_kind * pb;
        if (check && ctx.cuda.verify) {
          CPKV_CUDA_CHECK(kernels::launch_verify(dense_k, setting.kinds[k].row_bytes, setting.page_size, d_slots, static_cast<std::int64_t>(b.slots.size()), ctx.options.seed,
                                                 static_cast<std::uint32_t>(l), static_cast<std::uint32_t>(k), verify + l * kinds + k, stream));
        }
      }
    };
    const std::int64_t syncs_before = host_syncs;
    for (std::int32_t l = 0; l < layers; ++l) {
      progress.at(batch_index, l);
      run_layer(l, true);
      ++totals.layers;
    }
    bench.host_syncs_in_layer_loop = std::max<std::int64_t>(bench.host_syncs_in_layer_loop, (host_syncs - syncs_before) / layers);
    // The isolated current-page exchange: barrier + gather of the current pages (staging_direct,
    // staging_publish, symm_dense), or the compact all-reduce of the same pages (v2); nothing else.
    std::vector<kernels::GatherEntry> current_only;
    for (const kernels::GatherEntry& e : b.gather2) {
      if (e.table_index >= cp) current_only.push_back(e);
    }
    const kernels::GatherEntry* d_current_only = upload(current_only, owned, stream);
    const auto run_isolated = [&](std::int32_t l) {
      const std::int32_t h = model::parity_half(l);
      if (b.plan.barrier) CPKV_CUDA_CHECK(kernels::launch_barrier(mem.pad_table, rank, cp, ++barrier_phase, mem.barrier_status, stream));
      for (std::size_t k = 0; k < kinds; ++k) {
        if (!setting.kind_active(k, l)) continue;
        const std::uint64_t pb = page_bytes(k);
        const kernels::PointerTable& t = tables[l][k];
        if (b.plan.barrier) {
          CPKV_CUDA_CHECK(kernels::launch_gather(mem.dense + mem.dense_offset[h][k], pb, t, d_current_only, static_cast<std::int64_t>(current_only.size()), stream));
        }
        if (b.plan.compact_allreduce) all_reduce(mem.compact + mem.compact_offset[k], mem.peer_compact, mem.compact_offset[k], b.plan.compact_pages * pb);
      }
    };
    if (ctx.cuda.timing_reps > 0) time_batch(batch_index, run_layer, run_isolated);
    // One synchronization per batch, after the layer loop: results, barrier status.
    sync_stream();
    totals.bytes_gathered_from_peers += peer_bytes;
    kernels::BarrierStatus status{};
    CPKV_CUDA_CHECK(cudaMemcpy(&status, mem.barrier_status, sizeof(status), cudaMemcpyDeviceToHost));
    if (status.timed_out_phase != 0) {
      sim::Violation v;
      v.invariant = 8;
      v.rank = rank;
      v.batch = batch_index;
      std::snprintf(v.detail, sizeof(v.detail), "barrier phase %llu timed out on rank %d waiting for rank %d",
                    static_cast<unsigned long long>(status.timed_out_phase), status.rank, status.missing_peer);
      record(boot, v);
    }
    std::vector<kernels::VerifyResult> results(verify_slots);
    CPKV_CUDA_CHECK(cudaMemcpy(results.data(), verify, verify_slots * sizeof(kernels::VerifyResult), cudaMemcpyDeviceToHost));
    for (std::int32_t l = 0; l < layers && ctx.cuda.verify; ++l) {
      for (std::size_t k = 0; k < kinds; ++k) {
        const kernels::VerifyResult& r = results[l * kinds + k];
        if (r.wrong_bytes == 0) continue;
        ++totals.mismatches;
        const std::uint64_t first = r.first_wrong >> 16;
        const std::uint64_t row_global = first / setting.kinds[k].row_bytes;
        model::Mismatch mismatch;
        mismatch.wrong_bytes = static_cast<std::int64_t>(r.wrong_bytes);
        mismatch.slot = static_cast<std::int64_t>(row_global / setting.page_size);
        mismatch.row = static_cast<std::int32_t>(row_global % setting.page_size);
        mismatch.byte = static_cast<std::uint32_t>(first % setting.kinds[k].row_bytes);
        mismatch.expected = static_cast<std::uint8_t>((r.first_wrong >> 8) & 0xff);
        mismatch.actual = static_cast<std::uint8_t>(r.first_wrong & 0xff);
        const std::string text = mismatch.describe(rank, batch_index, l, setting.kinds[k].name);
        if (totals.first_mismatch[0] == '\0') std::snprintf(totals.first_mismatch, sizeof(totals.first_mismatch), "%s", text.c_str());
        sim::Violation v;
        v.invariant = 6;
        v.rank = rank;
        v.batch = batch_index;
        v.layer = l;
        std::snprintf(v.detail, sizeof(v.detail), "%s", text.c_str());
        record(boot, v);
      }
    }
    for (void* p : owned) CPKV_CUDA_CHECK(cudaFree(p));
    host_barrier(boot, progress, rank, cp, host_phase);  // nobody rewrites pools or dense buffers a peer still reads
  }
  // Quiescence: every word of this rank's pad equals the number of barriers (drained).
  std::vector<std::uint64_t> pad(cp);
  CPKV_CUDA_CHECK(cudaMemcpy(pad.data(), mem.pad, cp * sizeof(std::uint64_t), cudaMemcpyDeviceToHost));
  for (std::int32_t p = 0; p < cp; ++p) {
    if (pad[p] == barrier_phase) continue;
    sim::Violation v;
    v.invariant = 4;
    v.rank = rank;
    std::snprintf(v.detail, sizeof(v.detail), "flags not drained: rank %d's pad word for rank %d is %llu, expected %llu", rank, p,
                  static_cast<unsigned long long>(pad[p]), static_cast<unsigned long long>(barrier_phase));
    record(boot, v);
    break;
  }
  progress.step("done");
  host_barrier(boot, progress, rank, cp, host_phase);  // peers may still read this rank's memory until here
  if (comm != nullptr) {
    const harness::Quiet quiet(progress.record(), kHostWaitMsMax);
    CPKV_NCCL_CHECK(ncclCommDestroy(comm));
  }
  return harness::kRankExitOk;
}

sim::RunReport run_group(const sim::BatchSource& source, const sim::SimOptions& options, const CudaOptions& cuda, BenchResult* bench) {
  sim::RunReport report;
  report.variant = options.variant;
  report.mode = "cuda";
  const std::int32_t cp = source.setting.cp;
  if (cp > kRanksMax) throw std::invalid_argument(fmt::format("cp {} exceeds the {} ranks of one node", cp, kRanksMax));
  const int gpus = gpu_count();
  if (gpus == 0) {
    report.failure = "no CUDA device";
    return report;
  }
  const sim::SourceShape shape = sim::measure(source);
  report.batches = shape.batches;
  sim::SharedRegion region = sim::SharedRegion::create(sizeof(Bootstrap));
  auto* boot = new (region.base()) Bootstrap();
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);
  harness::LaunchOptions launch;
  launch.ranks = cp;
  launch.run_ms_max = cuda.run_ms_max;
  launch.stuck_ms_max = cuda.stuck_ms_max;
  launch.label = "cuda rank";
  const harness::LaunchResult launched = harness::launch_ranks(launch, [&](std::int32_t r, harness::RankProgress& progress) {
    return cuda_rank(RankContext{boot, source, options, cuda, shape, r, gpus, progress});
  });
  report.failure = launched.failure;
  report.deadlock = launched.deadlock;
  for (std::int32_t r = 0; r < cp; ++r) {
    report.ranks.push_back(boot->totals[r]);
    report.steps += boot->totals[r].layers;
  }
  report.violation_count = boot->violation_count.load();
  for (std::int64_t i = 0; i < std::min<std::int64_t>(report.violation_count, sim::World::kViolationsMax); ++i) report.violations.push_back(boot->violations[i]);
  for (std::int32_t r = 1; r < cp && report.failure.empty(); ++r) {
    if (boot->path[r].load() != boot->path[0].load()) {
      sim::Violation v;
      v.invariant = 7;
      v.rank = r;
      std::snprintf(v.detail, sizeof(v.detail), "rank %d took path %d, rank 0 path %d", r, boot->path[r].load(), boot->path[0].load());
      report.violations.push_back(v);
      ++report.violation_count;
    }
  }
  if (bench != nullptr) {
    const std::int64_t batches = std::min<std::int64_t>(shape.batches, kBenchBatchesMax);
    for (std::int64_t b = 0; b < batches; ++b) {
      double median = 0, low = 1e30, high = 0, isolated = 0;
      for (std::int32_t r = 0; r < cp; ++r) {
        const BenchRank& br = boot->bench_results[r];
        median = std::max(median, br.layer_us_median[b]);
        low = std::min(low, br.layer_us_min[b]);
        high = std::max(high, br.layer_us_max[b]);
        isolated = std::max(isolated, br.isolated_us_median[b]);
      }
      bench->layer_us_median.push_back(median);
      bench->layer_us_min.push_back(low);
      bench->layer_us_max.push_back(high);
      bench->isolated_us_median.push_back(isolated);
    }
    Ceilings& c = bench->ceilings;
    c.ce_peer_gbps = 1e30;
    c.local_copy_gbps = 1e30;
    const std::uint64_t page_sizes[2] = {656ULL * 64, 132ULL * 64};
    const std::int64_t counts[4] = {64, 256, 1024, 4096};
    for (int ps = 0; ps < 2; ++ps) {
      for (int k = 0; k < 4; ++k) c.gather.push_back({page_sizes[ps], counts[k], 1e30});
    }
    for (std::int32_t r = 0; r < cp; ++r) {
      const BenchRank& br = boot->bench_results[r];
      c.ce_peer_gbps = std::min(c.ce_peer_gbps, br.ce_peer_gbps);
      c.local_copy_gbps = std::min(c.local_copy_gbps, br.local_copy_gbps);
      c.barrier_us = std::max(c.barrier_us, br.barrier_us);
      c.barrier_us_launch_free = std::max(c.barrier_us_launch_free, br.barrier_us_launch_free);
      for (int ps = 0; ps < 2; ++ps) {
        for (int k = 0; k < 4; ++k) c.gather[ps * 4 + k].gbps = std::min(c.gather[ps * 4 + k].gbps, br.gather_gbps[ps][k]);
      }
      bench->host_syncs_in_layer_loop = std::max(bench->host_syncs_in_layer_loop, br.host_syncs_in_layer_loop);
    }
  }
  return report;
}

class CudaBackend final : public sim::Backend {
 public:
  explicit CudaBackend(CudaOptions options) : options_(options) {}
  std::string name() const override { return "cuda"; }
  sim::RunReport run(const sim::BatchSource& source, const sim::SimOptions& options) override { return run_group(source, options, options_, nullptr); }

 private:
  CudaOptions options_;
};

}  // namespace

int gpu_count() {
  std::fflush(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return 0;
  if (pid == 0) {
    if (!harness::prepare_child(parent)) ::_exit(0);  // dies with the caller, even one killed before prctl
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    ::_exit(std::min(count, 100));
  }
  // A hung driver must not hang the caller: poll for 60 s, then give up on the probe.
  int raw = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (true) {
    const pid_t done = ::waitpid(pid, &raw, WNOHANG);
    if (done == pid) break;
    if (done < 0 || Clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &raw, 0);
      return 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (!WIFEXITED(raw)) return 0;
  return WEXITSTATUS(raw);
}

std::unique_ptr<sim::Backend> make_cuda_backend(CudaOptions options) { return std::make_unique<CudaBackend>(options); }

BenchResult run_bench(const sim::BatchSource& source, const sim::SimOptions& options, const CudaOptions& cuda) {
  BenchResult result;
  result.report = run_group(source, options, cuda, &result);
  return result;
}

namespace {

int barrier_stress_rank(Bootstrap* boot, harness::RankProgress& progress, const BarrierStressOptions& o, std::int32_t rank, int gpus) {
  const std::int32_t cp = o.cp;
  std::uint64_t host_phase = 0;
  progress.step("setup");
  CPKV_CUDA_CHECK(cudaSetDevice(rank % gpus));
  cudaStream_t stream = nullptr;
  CPKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::uint64_t* pad = nullptr;
  std::uint64_t* stamps = nullptr;  // two parity words
  CPKV_CUDA_CHECK(cudaMalloc(&pad, 256));
  CPKV_CUDA_CHECK(cudaMalloc(&stamps, 256));
  CPKV_CUDA_CHECK(cudaMemset(pad, 0, 256));
  CPKV_CUDA_CHECK(cudaMemset(stamps, 0, 256));
  CPKV_CUDA_CHECK(cudaIpcGetMemHandle(&boot->pad[rank], pad));
  CPKV_CUDA_CHECK(cudaIpcGetMemHandle(&boot->staging[rank], stamps));
  {
    const harness::Waiting waiting(progress, harness::kWaitingOnDevice);
    CPKV_CUDA_CHECK(cudaDeviceSynchronize());
  }
  host_barrier(boot, progress, rank, cp, host_phase);
  std::vector<std::uint64_t*> pads(cp), stamp0(cp), stamp1(cp);
  for (std::int32_t p = 0; p < cp; ++p) {
    void* a = pad;
    void* b = stamps;
    if (p != rank) {
      CPKV_CUDA_CHECK(cudaIpcOpenMemHandle(&a, boot->pad[p], cudaIpcMemLazyEnablePeerAccess));
      CPKV_CUDA_CHECK(cudaIpcOpenMemHandle(&b, boot->staging[p], cudaIpcMemLazyEnablePeerAccess));
    }
    pads[p] = static_cast<std::uint64_t*>(a);
    stamp0[p] = static_cast<std::uint64_t*>(b);
    stamp1[p] = static_cast<std::uint64_t*>(b) + 1;
  }
  std::uint64_t** d_pads = nullptr;
  std::uint64_t** d_stamp[2] = {nullptr, nullptr};
  CPKV_CUDA_CHECK(cudaMalloc(&d_pads, cp * sizeof(void*)));
  CPKV_CUDA_CHECK(cudaMalloc(&d_stamp[0], cp * sizeof(void*)));
  CPKV_CUDA_CHECK(cudaMalloc(&d_stamp[1], cp * sizeof(void*)));
  CPKV_CUDA_CHECK(cudaMemcpy(d_pads, pads.data(), cp * sizeof(void*), cudaMemcpyHostToDevice));
  CPKV_CUDA_CHECK(cudaMemcpy(d_stamp[0], stamp0.data(), cp * sizeof(void*), cudaMemcpyHostToDevice));
  CPKV_CUDA_CHECK(cudaMemcpy(d_stamp[1], stamp1.data(), cp * sizeof(void*), cudaMemcpyHostToDevice));
  kernels::BarrierStatus* status = nullptr;
  unsigned long long* errors = nullptr;
  CPKV_CUDA_CHECK(cudaMalloc(&status, sizeof(kernels::BarrierStatus)));
  CPKV_CUDA_CHECK(cudaMalloc(&errors, sizeof(unsigned long long)));
  CPKV_CUDA_CHECK(cudaMemset(status, 0, sizeof(kernels::BarrierStatus)));
  CPKV_CUDA_CHECK(cudaMemset(errors, 0, sizeof(unsigned long long)));
  int clock_khz = 0;
  CPKV_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, rank % gpus));
  const long long delay_cycles = static_cast<long long>(o.slow_delay_us) * clock_khz / 1000;
  host_barrier(boot, progress, rank, cp, host_phase);
  progress.step("stress");
  std::uint64_t phase = 0;
  for (std::int32_t i = 1; i <= o.iterations; ++i) {
    ++phase;
    if (i % cp == rank && delay_cycles > 0) CPKV_CUDA_CHECK(kernels::launch_spin(delay_cycles, stream));
    CPKV_CUDA_CHECK(kernels::launch_stamp(stamps + (i % 2), phase, stream));
    CPKV_CUDA_CHECK(kernels::launch_barrier(d_pads, rank, cp, phase, status, stream));
    CPKV_CUDA_CHECK(kernels::launch_check_stamps(d_stamp[i % 2], cp, phase, errors, stream));
  }
  wait_device(progress, stream);
  progress.step("timed");
  if (o.timed_barriers > 0) {
    cudaEvent_t start = nullptr;
    cudaEvent_t stop = nullptr;
    CPKV_CUDA_CHECK(cudaEventCreate(&start));
    CPKV_CUDA_CHECK(cudaEventCreate(&stop));
    for (int warm = 0; warm < 20; ++warm) CPKV_CUDA_CHECK(kernels::launch_barrier(d_pads, rank, cp, ++phase, status, stream));
    wait_device(progress, stream);
    host_barrier(boot, progress, rank, cp, host_phase);  // everyone starts the timed run together
    CPKV_CUDA_CHECK(cudaEventRecord(start, stream));
    for (std::int32_t i = 0; i < o.timed_barriers; ++i) CPKV_CUDA_CHECK(kernels::launch_barrier(d_pads, rank, cp, ++phase, status, stream));
    CPKV_CUDA_CHECK(cudaEventRecord(stop, stream));
    {
      const harness::Waiting waiting(progress, harness::kWaitingOnDevice);
      CPKV_CUDA_CHECK(cudaEventSynchronize(stop));
    }
    float ms = 0;
    CPKV_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    boot->us_per_barrier[rank] = 1000.0 * ms / o.timed_barriers;
  }
  kernels::BarrierStatus host_status{};
  unsigned long long host_errors = 0;
  CPKV_CUDA_CHECK(cudaMemcpy(&host_status, status, sizeof(host_status), cudaMemcpyDeviceToHost));
  CPKV_CUDA_CHECK(cudaMemcpy(&host_errors, errors, sizeof(host_errors), cudaMemcpyDeviceToHost));
  boot->phase_errors[rank] = host_errors;
  boot->timeouts[rank] = host_status.timed_out_phase != 0 ? 1 : 0;
  host_barrier(boot, progress, rank, cp, host_phase);  // quiescence: every rank has finished every barrier
  std::vector<std::uint64_t> words(cp);
  CPKV_CUDA_CHECK(cudaMemcpy(words.data(), pad, cp * sizeof(std::uint64_t), cudaMemcpyDeviceToHost));
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
  sim::SharedRegion region = sim::SharedRegion::create(sizeof(Bootstrap));
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

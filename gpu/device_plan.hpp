// The per-batch plan of one GPU rank: built on the host from the model's VariantPlan (gather
// entries, page inverse, pool pages to populate, the oracle's slot sources), checked against the
// pointer table it will be read through, then uploaded once per batch and freed with it (RAII).
#pragma once

#include <cstdint>
#include <vector>

#include "checks.cuh"
#include "cpkv/model/batch.hpp"
#include "cpkv/model/plan.hpp"
#include "cpkv/model/setting.hpp"
#include "launchers.cuh"
#include "mutant_policy.hpp"

namespace cpkv::cuda {

// Everything a batch needs on the device, on the host.
struct BatchPlan {
  model::BatchLayout layout;
  model::VariantPlan plan;
  bool overflow = false;
  std::vector<kernels::GatherEntry> local_prefix, zero_own, pack, gather1, publish, gather2, unpack;
  // The fused compose launch's entries, each with its destination buffer: pre-signal (the pack and
  // the publish, which read the fill), then post (local prefix, gather 1, gather 2; gather 2 first
  // where there are pre-signal entries: compose_entries says why).
  std::vector<kernels::GatherEntry> compose;
  std::int64_t compose_pre = 0;
  std::vector<std::int32_t> inv_request;
  std::vector<std::int64_t> inv_token, inv_dest;
  // The producer launch: the fill destination pages and, per row of each, its token in the inverse
  // (or kernels::kRowZero / kRowUntouched).
  std::vector<std::int64_t> produce_pages;
  std::vector<std::int32_t> row_token;
  std::vector<kernels::SlotSource> slots;
  std::vector<std::int64_t> populate_logical, populate_local;
};

// `populated` (per local pool page) is updated with the pages this batch writes; an overflowing
// batch moves nothing and claims nothing.
BatchPlan build_batch_plan(const model::Setting& setting, const model::Batch& batch, model::Variant variant, std::int32_t rank,
                           std::int64_t staging_slots, std::vector<bool>& populated);

// Section 12's send rows of one rank under a token-split plan: the tokens it computes in its query
// order (request by request, ascending), each as its request and its position in the request's
// sequence (prefix included), -1 for the padding up to the largest rank's count (rows_per_rank,
// the plan's allgather_rank_rows). Read off the plan's reorder_source, so the rows the producer
// writes are the ones the re-ordering reads back.
struct SendRows {
  std::int64_t rows_per_rank = 0;
  std::vector<std::int32_t> request;  // [rows_per_rank]
  std::vector<std::int64_t> token;    // [rows_per_rank]
};
SendRows token_send_rows(const model::BatchLayout& layout, const model::Batch& batch, const model::VariantPlan& plan, std::int32_t rank);

// The bounds a gather entry read through the pointer table must keep: entries 0..cp-1 address pool
// pages, cp..2cp-1 staging slots (or symmetric dense slots), the own bases this rank's buffers.
struct TableBounds {
  std::int32_t cp = 1;
  std::int64_t pool_pages = 0;        // local pool pages per rank
  std::int64_t shared_pages = 0;      // staging slots or dense slots, whichever the variant reads
  // [rank][local page]: pages some batch of the source references, the only ones with memory
  // behind them in a sparse pool (pool_backing.hpp); null: not checked.
  const std::vector<std::vector<bool>>* pool_referenced = nullptr;
};
// The host half of the paired assertion (the gather kernel asserts the same where it reads).
void check_entries(const std::vector<kernels::GatherEntry>& entries, const TableBounds& bounds);

// Device copies of host vectors, freed when the owner goes (after the batch's last synchronization).
class DeviceUploads {
 public:
  explicit DeviceUploads(cudaStream_t stream) : stream_(stream) {}
  DeviceUploads(const DeviceUploads&) = delete;
  DeviceUploads& operator=(const DeviceUploads&) = delete;
  ~DeviceUploads();
  template <typename T>
  T* upload(const std::vector<T>& host) {
    if (host.empty()) return nullptr;
    void* device = nullptr;
    CPKV_CUDA_CHECK(cudaMalloc(&device, host.size() * sizeof(T)));
    CPKV_CUDA_CHECK(cudaMemcpyAsync(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream_));
    owned_.push_back(device);
    return static_cast<T*>(device);
  }

 private:
  cudaStream_t stream_;
  std::vector<void*> owned_;
};

// The pages a rank's gathers read from its peers (pools and staging or dense buffers of other
// ranks), per active kind and layer: the fused plugin's peer-bytes counter.
std::uint64_t peer_pages_per_kind(const BatchPlan& b, std::int32_t cp, std::int32_t rank);
// Section 12's variants: the rows each all-gather brings from the peers (cp - 1 ranks' padded send
// rows), per active kind and layer; 0 for the other variants.
std::uint64_t peer_rows_all_gathered(const BatchPlan& b, std::int32_t cp);

// The barrier of the fused compose launch: none (the variant has none, or the planted bug no_barrier),
// the signal at its start, or after the publish (the peers read what the publish writes). The
// fused plugin launches with it.
kernels::ComposeBarrier compose_barrier(const BatchPlan& b, const GpuMutantPolicy& mutant);

// The batch plan on the device: the 9 uploads.
struct DevicePlan {
  const kernels::GatherEntry *compose, *unpack;
  const std::int64_t* produce_pages;
  const std::int32_t* row_token;
  const std::int32_t* inv_request;
  const std::int64_t* inv_token;
  const kernels::SlotSource* slots;
  const std::int64_t *populate_logical, *populate_local;
};
DevicePlan upload_plan(const BatchPlan& b, const TableBounds& bounds, DeviceUploads& uploads);

}  // namespace cpkv::cuda

// The per-batch costs that `cpkv replay --backend model` reports, computed without building the
// per-rank slot descriptors: every byte count model::layer_bytes(variant_plan(...)) gives depends on
// the batch only through a few counts (prefix pages per storage owner, current pages per writer,
// slots, requests), so one pass over the batch gives every variant and rank. The closed form is
// checked against model::layer_bytes field by field (tests/import_test.cpp, and `--exact-model`).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "cpkv/model/batch.hpp"
#include "cpkv/model/plan.hpp"
#include "cpkv/model/setting.hpp"
#include "cpkv/model/staging.hpp"

namespace cpkv::cli {

using model::kVariantCount;

// The batch-logical counts every byte count depends on.
struct BatchCounts {
  std::int64_t requests = 0;
  std::int64_t prefix_tokens = 0;
  std::int64_t extend_tokens = 0;
  std::int64_t slot_count = 0;
  std::int64_t current_pages_total = 0;
  std::vector<std::int64_t> prefix_pages_by_owner;   // [cp]: prefix slots whose page lives on rank p
  std::vector<std::int64_t> current_pages_by_writer; // [cp]
};

// Counts of a batch (writers from model::writer_of, so every split policy is the model's).
void count_batch(const model::Setting& setting, const model::Batch& batch, BatchCounts& counts);

// model::layer_bytes(setting, model::variant_plan(layout, variant, rank), layer), from the counts.
model::LayerBytes layer_bytes_from_counts(const model::Setting& setting, const BatchCounts& counts,
                                          model::Variant variant, std::int32_t rank, std::int32_t layer);

// Bandwidth and latency ceilings of the modelled time. gbps = 1e9 bytes per second (GB/s), as
// nccl-tests reports bus bandwidth.
struct Ceilings {
  double peer_gbps = 350.0;            // one rank's aggregate read bandwidth from peers' memory (IPC, NVLink)
  double local_gbps = 2000.0;          // local copy bandwidth (HBM read + write)
  double barrier_us = 5.0;             // one counting barrier over IPC flags
  double allreduce_busbw_gbps = 360.0; // NCCL sum all-reduce bus bandwidth
  double allreduce_latency_us = 20.0;  // fixed cost of one all-reduce call (launch + small-message latency)
  std::string source = "nominal H200 defaults (assumed, not measured)";
};

// Modelled exchange time of one rank for one layer (microseconds): gathers from peers at peer_gbps;
// own-memory gather reads, local copies and zeroing at local_gbps; barriers; all-reduces at
// latency + N * 2(cp-1)/cp / busbw. Compute is not modelled: the same for every variant.
double layer_time_us(const model::Setting& setting, const BatchCounts& counts, model::Variant variant,
                     const model::LayerBytes& bytes, const Ceilings& ceilings, std::uint64_t page_bytes);

// Everything the model replay reports for one batch.
struct BatchCosts {
  BatchCounts counts;
  model::Verdict verdict;
  // [variant][rank]: bytes pulled from peers over all layers (LayerBytes::pulled_from_peers summed).
  std::array<std::vector<std::uint64_t>, kVariantCount> pulled_from_peers_all_layers;
  // [variant]: modelled time of the batch, sum over layers of the slowest rank (microseconds).
  std::array<double, kVariantCount> modelled_us{};
};

class CostModel {
 public:
  CostModel(const model::Setting& setting, const Ceilings& ceilings);
  // Reuses `out`'s storage: no allocation per batch once warm.
  void evaluate(const model::Batch& batch, BatchCosts& out) const;
  std::int64_t staging_slots() const { return capacity_.staging_slots; }

 private:
  model::Setting setting_;
  Ceilings ceilings_;
  model::StagingCapacity capacity_;
  std::int32_t full_layers_ = 0;
  std::int32_t shared_layers_ = 0;
  std::int32_t first_full_ = -1;    // a layer of each class, for the per-layer counts
  std::int32_t first_shared_ = -1;
};

}  // namespace cpkv::cli

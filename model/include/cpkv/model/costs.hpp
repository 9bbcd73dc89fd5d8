// The per-batch costs that `cpkv replay --backend model` reports, computed without building the
// per-rank slot descriptors: every byte count model::layer_bytes(variant_plan(...)) gives depends on
// the batch only through a few counts (prefix pages per storage owner, current pages per writer,
// slots, requests), so one pass over the batch gives every variant and rank. The closed form is
// checked against model::layer_bytes field by field (tests/model_costs_test.cpp, and `--exact-model`).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cpkv/model/batch.hpp"
#include "cpkv/model/plan.hpp"
#include "cpkv/model/setting.hpp"
#include "cpkv/model/staging.hpp"

namespace cpkv::model {


// The batch-logical counts every byte count depends on.
struct BatchCounts {
  std::int64_t requests = 0;
  std::int64_t prefix_tokens = 0;
  std::int64_t extend_tokens = 0;
  std::int64_t slot_count = 0;
  std::int64_t current_pages_total = 0;
  std::vector<std::int64_t> prefix_pages_by_owner;   // [cp]: prefix slots whose page lives on rank p
  std::vector<std::int64_t> current_pages_by_writer; // [cp]
  std::vector<std::int64_t> span_pages;              // per request: its prefix pages, then its current pages (legacy's spans)
  // [TokenSplit]: the most tokens one rank computes under the split (section 12), what every rank
  // sends to the all-gather (the others pad); 0 for TokenSplit::none.
  std::array<std::int64_t, kTokenSplitCount> max_rank_tokens{};
  std::array<std::vector<std::int64_t>, kTokenSplitCount> tokens_by_rank;  // [split][cp], for max_rank_tokens
};

// Counts of a batch (writers from model::writer_of, so every split policy is the model's).
void count_batch(const model::Setting& setting, const model::Batch& batch, BatchCounts& counts);

// A variant's closed form (its kVariantTable row's `counts`) evaluated on one batch for one rank:
// pages and launches of one layer and one active buffer kind.
struct LayerCounts {
  std::int64_t gathers = 0;
  std::int64_t barriers = 0;
  std::int64_t allreduce_calls = 0;
  std::int64_t allreduce_pages = 0;
  std::int64_t pre_signal_pages = 0;
  std::int64_t unpack_pages = 0;
  std::int64_t materialize_pages = 0;
  std::int64_t allgather_calls = 0;
  std::int64_t allgather_rows = 0;              // rows of one call: cp * max_rank_tokens, padding included
  std::vector<std::int64_t> pulled_pages_from;  // [cp]: pages the gathers read from rank p
  std::int64_t local_copy_pages() const { return pre_signal_pages + unpack_pages + materialize_pages; }
};
// split: the row's token split (its all-gather rows are cp * counts.max_rank_tokens[split]).
LayerCounts closed_form_counts(const model::ClosedForm& form, const BatchCounts& counts, std::int32_t rank,
                               model::TokenSplit split = model::TokenSplit::none);
// The same into `out`, reusing its storage (the cost model's loop: no allocation per rank).
void closed_form_counts(const model::ClosedForm& form, const BatchCounts& counts, std::int32_t rank, model::TokenSplit split,
                        LayerCounts& out);
// The bytes of one layer from a rank's counts, into `out` (its storage reused).
void layer_bytes_of_counts(const model::Setting& setting, const LayerCounts& counts, std::int32_t rank, std::int32_t layer,
                           model::LayerBytes& out);

// model::layer_bytes(setting, model::variant_plan(layout, variant, rank), layer), from the counts:
// the row's closed form times the layer's page bytes and active kinds.
model::LayerBytes layer_bytes_from_counts(const model::Setting& setting, const BatchCounts& counts,
                                          model::Variant variant, std::int32_t rank, std::int32_t layer);

// Bandwidth and latency ceilings of the modelled time. gbps = 1e9 bytes per second (GB/s), as
// nccl-tests reports bus bandwidth.
struct CostParameters {
  double peer_gbps = 350.0;            // one rank's aggregate read bandwidth from peers' memory (IPC, NVLink)
  double local_gbps = 2000.0;          // local copy bandwidth (HBM read + write)
  double barrier_us = 2.0;             // the flag exchange of the barrier inside a compose launch (its launch counted apart)
  double allreduce_busbw_gbps = 360.0; // NCCL sum all-reduce bus bandwidth
  double allreduce_latency_us = 20.0;  // fixed cost of one all-reduce call (launch + small-message latency)
  double launch_us = 1.5;              // one graph node that moves no bytes of its own: its launch (the dense zero's)
  double gather_fixed_us = 9.0;        // the part of one gather launch (a warp or block per page) that is not bytes: launch, one page's latency, tail
  // NCCL all-reduce time per call by size, measured (bytes ascending); when present it replaces
  // latency + bytes / busbw, which mid-sized calls do not follow (2xH200: a 1.5 MB call took about
  // 19 us in the layers against 12 us from the 4-KiB latency and the 64-MiB bus bandwidth).
  std::vector<std::pair<double, double>> allreduce_curve;  // (bytes per call, us per call)
  std::string source = "nominal H200 defaults (assumed, not measured)";
};

// What `cpkv bench` measures in the same run (gpu/bench.cpp measure_ceilings, worst rank; the GPU
// backend fills this type itself), and the model's ceilings derived from it: the one derivation
// `cpkv bench` and `cpkv replay --ceilings BENCH.json` share.
struct MeasuredCeilings {
  double ce_peer_gbps = 0;            // cudaMemcpyAsync from a peer's IPC buffer, every rank pulling at once
  double ce_push_gbps = 0;            // cudaMemcpyAsync into a peer's IPC buffer, every rank pushing at once (reported, not modelled)
  double local_copy_gbps = 0;         // device-to-device copy within one GPU (bytes copied per second)
  double barrier_us = 0;              // a barrier kernel back to back, launch included (max over ranks)
  double barrier_us_graph = 0;        // the same as nodes of a CUDA graph (how the layers run)
  double barrier_us_launch_free = 0;  // the same looped inside one kernel: the flag exchange alone
  double allreduce_busbw_gbps = 0;    // NCCL sum all-reduce, 64 MiB, bus bandwidth (0: not measured, no NCCL)
  double allreduce_latency_us = 0;    // NCCL sum all-reduce of 4 KiB: the curve's first point
  // (bytes, us per call as CUDA graph nodes: median over replays, max over ranks), bytes ascending.
  std::vector<std::pair<double, double>> allreduce_curve;
  struct Gather {
    std::uint64_t page_bytes = 0;
    std::int64_t pages = 0;
    double gbps = 0;           // the fused compose copy (a warp per page, or per 64-KiB chunk) pulling from the peer: what the model reads
    // Reported beside it by the bench, not modelled:
    double block_gbps = 0;     // the single-list gather kernel (block per page), the same pages
    double ce_batch_gbps = 0;  // the copy engines, one cudaMemcpyBatchAsync of the same pages (0: not in this CUDA)
    double bulk_gbps = 0;      // the bulk-copy (TMA) gather (cpkv bench --bulk; 0: not measured, -1: wrong bytes or a timeout)
    double push_gbps = 0;      // the same pages pushed (block per page, loads local, stores into the peer; -1: wrong bytes)
  };
  std::vector<Gather> gather;
};
// launch_us = barrier_us_graph - barrier_us_launch_free (a graph node less what its kernel does);
// gather_fixed_us = the gather sweep's time at its fewest pages of its largest page, less those bytes
// at the copy-engine rate, less the launch a graph saves over a stream (barrier_us - barrier_us_graph).
CostParameters derive_ceilings(const MeasuredCeilings& measured);

// One all-reduce call of `bytes` on `cp` ranks: the measured curve, linear between its points, the
// first point's time below it, and past its last point the extra bytes at the bus bandwidth; without
// a curve, allreduce_latency_us + bytes x 2(cp-1)/cp / allreduce_busbw_gbps.
double allreduce_call_us(const CostParameters& ceilings, double bytes, std::int32_t cp);

// Modelled exchange time of one rank for one layer (microseconds), as the built-in exchange runs the
// layer (gpu/fused/fused_exchange.cpp: fused_compose_layer, PROTOCOL.md section 7); page_bytes is a
// page of every kind active on the layer together (row_bytes_on_layer x page size):
//   dense zero (dense all-reduce variants): one launch over every active kind's range
//     (gpu/fused/fused_exchange.cpp: zero_dense_half), launch_us + the batch's slots x page_bytes at
//     local_gbps; none where that is 0 bytes;
//   the fused compose launch: gather_fixed_us; its pre-signal entries (staging_publish's publish,
//     v2's pack) run before the rest can start: + gather_fixed_us + their bytes at local_gbps; the
//     barrier's flag exchange barrier_us; then the post entries: the longer of the gathers from
//     peers at peer_gbps and the own-memory reads and local copies at local_gbps (they run at once
//     on the launch's warps, over NVLink and HBM; on 2xH200 the max fit staging_direct and
//     symm_dense within 8%, the sum over-predicted staging_direct by 6-11%);
//   all-reduces: allreduces_us, call by call;
//   v2's unpack: one gather launch per kind, gather_fixed_us each + its bytes at local_gbps;
//   section 12's variants: the all-gathers (allgathers_us), then the re-ordering as v2's unpack.
// Compute (the fill, which also zeroes the partial pages' tails) is not modelled: the same for every variant.
double layer_time_us(const model::Setting& setting, const BatchCounts& counts, model::Variant variant,
                     const model::LayerBytes& bytes, const CostParameters& ceilings, std::uint64_t page_bytes,
                     std::int32_t layer);

// layer_time_us less the all-reduces: the copies, launches and barrier of one rank.
double layer_copy_us(const model::Setting& setting, const BatchCounts& counts, model::Variant variant,
                     const model::LayerBytes& bytes, const CostParameters& ceilings, std::uint64_t page_bytes);

// Where layer_time_us goes, part by part (microseconds); the parts sum to it (the total is unchanged:
// tests/model_costs_test.cpp checks every variant on the bundled traces):
//   zero_us: the dense zero (its one launch: launch_us + the bytes at local_gbps);
//   fill_us: the compose launch's entries before its signal, which fill the exchange's source
//     (staging_publish's publish, v2's pack: gather_fixed_us + their bytes at local_gbps); the
//     producer's own fill of the content is not modelled (the same for every variant);
//   launch_us: the compose launch's fixed part (gather_fixed_us);
//   barrier_us: the barrier's flag exchange;
//   peer_us / local_us: the post entries run their peer pulls and own-memory copies at once, so
//     the longer of the two is on the critical path and carries the time, the other 0 (overlapped);
//     v2's unpack (a gather launch per compact all-reduce and its bytes) is local_us;
//   allreduce_us: allreduces_us;
//   allgather_us: allgathers_us (section 12's variants).
struct TimeComponents {
  double zero_us = 0, fill_us = 0, launch_us = 0, barrier_us = 0, peer_us = 0, local_us = 0, allreduce_us = 0, allgather_us = 0;
  double total_us() const { return zero_us + fill_us + launch_us + barrier_us + peer_us + local_us + allreduce_us + allgather_us; }
  // this += times x other, part by part.
  void add(const TimeComponents& other, double times);
};
// layer_copy_us's parts (allreduce_us 0): their sum is layer_copy_us.
TimeComponents layer_copy_components(const model::Setting& setting, const BatchCounts& counts, model::Variant variant,
                                     const model::LayerBytes& bytes, const CostParameters& ceilings, std::uint64_t page_bytes);

// The all-reduces of one layer, call by call with allreduce_call_us, per active kind (each kind is
// its own call): legacy_span_ar's two spans per request (its prefix pages, its current pages),
// the dense buffer's slots for fused_ar and v2_fallback, v2's compact buffer of current pages.
double allreduces_us(const model::Setting& setting, const BatchCounts& counts, model::Variant variant, std::int32_t layer,
                     const CostParameters& ceilings);

// The all-gathers of one layer (section 12's variants), per active kind: one call of cp *
// max_rank_tokens rows, padding included. Not measured yet (the GPU path runs only time-sliced on one
// GPU, which times nothing): an all-gather of N bytes
// is timed as an all-reduce of N / 2 (allreduce_call_us), because with nccl-tests' bus bandwidth
// convention a ring all-gather moves (cp-1)/cp N per rank and a ring all-reduce of N / 2 the same.
double allgathers_us(const model::Setting& setting, const BatchCounts& counts, model::Variant variant, std::int32_t layer,
                     const CostParameters& ceilings);

// Everything the model replay reports for one batch.
struct BatchCosts {
  BatchCounts counts;
  model::Verdict verdict;
  // [variant][rank]: bytes pulled from peers over all layers (LayerBytes::pulled_from_peers summed).
  std::array<std::vector<std::uint64_t>, kVariantCount> pulled_from_peers_all_layers;
  // [variant]: modelled time of the batch, sum over layers of the slowest rank (microseconds).
  std::array<double, kVariantCount> modelled_us{};
  // [variant]: modelled_us by part (TimeComponents): the slowest rank's copy parts per layer plus
  // the all-reduces, over all layers; their sum is modelled_us.
  std::array<TimeComponents, kVariantCount> components{};
};

class CostModel {
 public:
  CostModel(const model::Setting& setting, const CostParameters& ceilings);
  // Reuses `out`'s storage: no allocation per batch once warm.
  void evaluate(const model::Batch& batch, BatchCosts& out) const;
  std::int64_t staging_slots() const { return capacity_.staging_slots; }

 private:
  model::Setting setting_;
  CostParameters ceilings_;
  model::StagingCapacity capacity_;
  std::int32_t full_layers_ = 0;
  std::int32_t shared_layers_ = 0;
  std::int32_t first_full_ = -1;    // a layer of each class, for the per-layer counts
  std::int32_t first_shared_ = -1;
  std::array<std::uint64_t, 2> class_row_bytes_{};  // [full, shared]: row bytes of the kinds active on such a layer
  std::array<std::int32_t, 2> class_kinds_{};       // [full, shared]: the kinds active on it
};

}  // namespace cpkv::model

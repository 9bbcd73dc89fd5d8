// `cpkv bench` on the GPUs, the cuda backend's bench entry (BackendEntry::bench): every variant of
// the request timed through one path, the plugin host (the request's exchange table, the built-in
// plugin by default, and the bench parts it offers), against the ceilings measured
// in the same run (copy-engine peer pull, local copy, barrier), with the model's bytes and the cost
// model's prediction, as the JSON rows and the markdown tables.
#include <algorithm>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench_markdown.hpp"
#include "cpkv/exchange_abi.h"
#include "cpkv/harness/attention_limit.hpp"
#include "cpkv/model/costs.hpp"
#include "cpkv/model/limits.hpp"
#include "cpkv/model/plan.hpp"
#include "cpkv/model/staging.hpp"
#include "cuda_backend.hpp"

namespace cpkv::cuda {
namespace {

// Bytes one rank moves on layer `layer` (all active kinds), max over ranks, from each rank's plan.
struct ModelBytes {
  std::uint64_t peer = 0;   // gathered from peers
  std::uint64_t local = 0;  // gathered from itself, local copies
  std::uint64_t allreduce = 0;
};
ModelBytes model_bytes(const model::Setting& setting, const std::vector<model::VariantPlan>& plans, std::int32_t layer) {
  ModelBytes out;
  for (std::int32_t rank = 0; rank < setting.cp; ++rank) {
    const model::LayerBytes b = model::layer_bytes(setting, plans[rank], layer);
    const std::uint64_t gather_peer = b.pulled_from_peers();
    out.peer = std::max(out.peer, gather_peer);
    out.local = std::max(out.local, b.pulled_from[rank] + b.local_copy_bytes);
    out.allreduce = std::max(out.allreduce, b.allreduce_bytes);
  }
  return out;
}

// The batch's layout and each rank's plan once, then every layer's bytes from them.
ModelBytes mean_bytes(const model::Setting& setting, const model::Batch& batch, model::Variant variant, std::int32_t layers) {
  const model::BatchLayout layout = model::layout_batch(setting, batch);
  std::vector<model::VariantPlan> plans;
  for (std::int32_t rank = 0; rank < setting.cp; ++rank) plans.push_back(model::variant_plan(layout, variant, rank));
  ModelBytes sum;
  for (std::int32_t l = 0; l < layers; ++l) {
    const ModelBytes b = model_bytes(setting, plans, l);
    sum.peer += b.peer;
    sum.local += b.local;
    sum.allreduce += b.allreduce;
  }
  return {sum.peer / layers, sum.local / layers, sum.allreduce / layers};
}

// The source on the GPUs, the layers timed, and every batch (for the model's bytes: benchmark
// traces are small, a handful of batches) with the ones the overflow verdict rejects (nothing of
// them is timed).
struct BenchSetup {
  explicit BenchSetup(harness::BatchSource from) : source(std::move(from)) {}  // the rest starts at its default

  harness::BatchSource source;
  std::int32_t gpus = 0;
  std::int32_t layers = 0;
  std::int32_t timed_cycle = 0;  // the timing cycle
  std::vector<model::Batch> batches;
  std::vector<harness::RejectedBatch> rejected;
};

BenchSetup bench_setup(const harness::CheckedBench& c, const harness::BatchSource& source) {
  BenchSetup s{source};
  if (c.cp) s.source.setting.cp = *c.cp;
  harness::refuse_attention_over_limit(c.checked, s.source);  // as the replay does, after the --cp override
  s.gpus = gpus_or_refuse();
  if (s.gpus < s.source.setting.cp && !c.time_sliced) {
    throw harness::RequestError("cp", fmt::format("{} ranks on {} GPUs would time-slice; benchmarks need one GPU per rank "
                                                  "(--time-sliced runs them anyway, for the path's byte check: its timings measure nothing)",
                                                  s.source.setting.cp, s.gpus));
  }
  s.layers = std::min(c.checked.request.layers.value_or(s.source.setting.layer_count()), s.source.setting.layer_count());
  if (s.layers < 2) throw harness::RequestError("layers", "timing needs at least 2 layers (consecutive layers must alternate staging halves)");
  s.timed_cycle = s.layers % 2 == 0 ? s.layers : s.layers - 1;
  const std::int64_t staging_slots = model::staging_capacity(s.source.setting).staging_slots;
  harness::BatchCursor cursor(s.source);
  while (auto b = cursor.next()) {
    const model::BatchLayout layout = model::layout_batch(s.source.setting, *b);
    const model::Verdict verdict = model::overflow_verdict(layout.current_pages_total, staging_slots);
    if (verdict.overflow) s.rejected.push_back({cursor.index(), verdict});
    s.batches.push_back(*b);
  }
  return s;
}

// The cost model's compose time per layer: `cpkv replay --backend model`'s CostModel with the
// ceilings measured in this run, on the timed cycle's layers only, averaged like the measurement
// (the dense zero over the batch's own slots, as gpu/fused/fused_exchange.cpp: zero_dense_half does).
double predicted_us(const model::Setting& setting, const model::Batch& batch, model::Variant variant, std::int32_t cycle,
                    const model::CostParameters& ceilings) {
  model::Setting timed = setting;
  timed.layer_pattern = setting.layer_pattern.substr(0, static_cast<std::size_t>(cycle));
  model::BatchCosts costs;
  model::CostModel(timed, ceilings).evaluate(batch, costs);
  return costs.modelled_us[static_cast<std::size_t>(variant)] / cycle;
}

// The figures of batch b that kTimingTable names a JSON key for (gpu/bench_timings.hpp): the
// median (null where the row says 0 means none, and for a part the exchange does not offer), min
// and max where the row keeps its spread, and the launches per layer.
void add_timing_keys(const BenchResult& result, const cpkv_exchange_parts* parts, std::size_t b, nlohmann::json& row) {
  for (const TimingRow& timing : kTimingTable) {
    const bool timed = timed_by(timing, parts);
    const auto figure = [&](TimingStat stat) { return timed ? nlohmann::json(result.per_batch(timing.timing, stat)[b]) : nlohmann::json(); };
    if (timing.json_nodes != nullptr) row[timing.json_nodes] = figure(kNodes);
    if (timing.json_stem == nullptr) continue;
    const std::string stem = timing.json_stem;
    const bool none = !timed || (timing.zero_is_none && result.per_batch(timing.timing)[b] <= 0);
    row[stem + "_median"] = none ? nlohmann::json() : figure(kMedian);
    if (!timing.spread) continue;
    row[stem + "_min"] = none ? nlohmann::json() : figure(kMin);
    row[stem + "_max"] = none ? nlohmann::json() : figure(kMax);
  }
}

// The figures derived from two timings (the isolated exchange, the barrier's shares), null where the
// exchange offers no such parts (cpkv cannot take a foreign layer apart unless it does).
void add_shares(const BenchResult& result, model::Variant variant, std::size_t b, double us, const cpkv_exchange_parts* parts, nlohmann::json& row) {
  const auto offers = [&](Timing t) { return timed_by(kTimingTable[timing_index(t)], parts); };
  const double isolated_us = result.per_batch(Timing::isolated)[b];
  const double no_barrier_us = result.per_batch(Timing::compose_no_barrier)[b];
  // The isolated current-page exchange exists where current pages move on their own: barrier +
  // gather (staging and symmetric variants) or the compact all-reduce (v2).
  const bool isolated_applies = offers(Timing::isolated) && model::info(variant).isolated != model::IsolatedExchange::none;
  const bool barrier_and_gather = isolated_applies && offers(Timing::isolated_gather_only) && model::info(variant).isolated == model::IsolatedExchange::barrier_and_gather;
  row["isolated_current_us"] = isolated_applies ? nlohmann::json(isolated_us) : nlohmann::json(nullptr);
  row["barrier_share_us"] =
      barrier_and_gather ? nlohmann::json(isolated_us - result.per_batch(Timing::isolated_gather_only)[b]) : nlohmann::json(nullptr);
  row["barrier_share_in_layer_us"] = offers(Timing::compose_no_barrier) && no_barrier_us > 0 ? nlohmann::json(us - no_barrier_us) : nlohmann::json(nullptr);
}

// One row per timed batch of one variant's run. The ratio to the ideal is of the compose exchange
// alone (the exchange's compose part where it offers one, else its whole compose_layer), which is
// what the ideal counts (the fill is the model's own KV write in serving).
void add_rows(const BenchSetup& s, model::Variant variant, const cpkv_exchange_parts* parts, const BenchResult& result, const Ceilings& ceilings,
              nlohmann::json& rows) {
  const model::CostParameters model_c = model::derive_ceilings(ceilings);
  const Timing compose = timed_by(kTimingTable[timing_index(Timing::compose_only)], parts) ? Timing::compose_only : Timing::plugin_compose;
  for (std::size_t b = 0; b < result.per_batch(compose).size() && b < s.batches.size(); ++b) {
    // Bytes averaged over the layers the timing cycles through (F and S layers move different kinds).
    const ModelBytes bytes = mean_bytes(s.source.setting, s.batches[b], variant, s.timed_cycle);
    const ModelBytes ideal_bytes = mean_bytes(s.source.setting, s.batches[b], model::Variant::staging_direct, s.timed_cycle);
    const double ideal_us =
        ideal_bytes.peer / (ceilings.ce_peer_gbps * 1e3) + ideal_bytes.local / (ceilings.local_copy_gbps * 1e3) + ceilings.barrier_us;
    const double us = result.per_batch(compose)[b];
    if (us <= 0.0) continue;  // an overflowing batch is rejected before anything moves: nothing to time
    const double predicted = predicted_us(s.source.setting, s.batches[b], variant, s.timed_cycle, model_c);
    nlohmann::json row = {{"batch", b},
                          {"variant", model::to_string(variant)},
                          {"byte_exact", result.report.passed()},
                          {"ms_per_batch_compose", us * s.source.setting.layer_count() / 1000.0}};
    add_shares(result, variant, b, us, parts, row);
    row.update({{"peer_bytes_per_rank_layer", bytes.peer},
                {"local_bytes_per_rank_layer", bytes.local},
                {"allreduce_bytes_per_layer", bytes.allreduce},
                {"achieved_peer_gbps", bytes.peer / (us * 1e3)},
                {"ideal_us_per_layer", ideal_us},
                {"ratio_to_ideal", us / ideal_us},
                {"model_us_per_layer", predicted},
                {"model_error", predicted / us - 1.0},
                {"host_syncs_per_layer", result.host_syncs_in_layer_loop}});
    add_timing_keys(result, parts, b, row);
    rows.push_back(row);
  }
}

// The ceilings, in the bench's own shape and in the one `cpkv replay --backend model --ceilings FILE` reads.
void add_ceilings(const Ceilings& ceilings, nlohmann::json& out) {
  nlohmann::json gathers = nlohmann::json::array();
  for (const auto& g : ceilings.gather) {
    nlohmann::json row = {{"page_bytes", g.page_bytes}, {"pages", g.pages}};
#define CPKV_GATHER_KEY(rank_field, field, key) row[key] = g.field;
    CPKV_BENCH_GATHER_RATES(CPKV_GATHER_KEY)
#undef CPKV_GATHER_KEY
    gathers.push_back(row);
  }
  nlohmann::json curve = nlohmann::json::array();
  for (const auto& point : ceilings.allreduce_curve) curve.push_back({{"bytes", point.first}, {"us", point.second}});
  nlohmann::json measured = {{"allreduce_latency_us", ceilings.allreduce_latency_us}, {"allreduce_curve", curve}, {"gather", gathers}};
#define CPKV_CEILING_KEY(name, fold, ...) measured[#name] = ceilings.name;
  CPKV_BENCH_CEILING_SCALARS(CPKV_CEILING_KEY)
#undef CPKV_CEILING_KEY
  out["ceilings"] = measured;
  const model::CostParameters model_c = model::derive_ceilings(ceilings);
  out["peer_gbps"] = model_c.peer_gbps;
  out["local_gbps"] = model_c.local_gbps;
  out["barrier_us"] = model_c.barrier_us;
  out["allreduce_busbw_gbps"] = model_c.allreduce_busbw_gbps;
  out["allreduce_latency_us"] = model_c.allreduce_latency_us;
  out["launch_us"] = model_c.launch_us;
  out["gather_fixed_us"] = model_c.gather_fixed_us;
}

// The JSON's run-wide keys.
nlohmann::json bench_json(const harness::CheckedBench& c, const BenchSetup& s) {
  const harness::CheckedRequest& checked = c.checked;
  nlohmann::json out;
  out["trace"] = checked.request.trace_label;
  out["rejected_batches"] = harness::rejected_json(s.rejected);
  out["cp"] = s.source.setting.cp;
  out["page_size"] = s.source.setting.page_size;  // the model replay checks a ceilings file against the trace by both
  out["layers_timed"] = s.layers;
  out["layers_model"] = s.source.setting.layer_count();
  out["reps"] = c.reps;
  if (checked.exchange) {
    out["exchange"] = {{"plugin", checked.exchange->name},
                       {"path", checked.exchange_by_default ? std::string(harness::kBuiltinExchange) : checked.request.exchange.value_or("")},
                       {"parts", checked.exchange->parts != nullptr}};
  }
  if (s.gpus < s.source.setting.cp) out["time_sliced"] = true;
  return out;
}

}  // namespace

harness::BenchReport bench_report(const harness::CheckedBench& c, const harness::BatchSource& source, const harness::BenchPrint& print) {
  const harness::CheckedRequest& checked = c.checked;
  const BenchSetup s = bench_setup(c, source);
  print.line(fmt::format("cpkv bench: {} | cp {} on {} GPUs | {} batches | {} layers timed x {} reps (of {} in the model)",
                         checked.request.trace_label, s.source.setting.cp, s.gpus, s.batches.size(), s.layers, c.reps,
                         s.source.setting.layer_count()));
  print.line(fmt::format("{}{}--bulk {} ({})", harness::knobs_line(checked), checked.knobs.empty() ? "knobs: " : " | ", c.bulk ? "on" : "off", c.bulk_origin));
  if (!checked.backend_line.empty()) print.line(checked.backend_line);
  if (s.gpus < s.source.setting.cp)
    print.line(fmt::format("TIME-SLICED: {} ranks on {} GPUs: the bytes are checked, the timings measure nothing", s.source.setting.cp, s.gpus));
  print.rejected(s.rejected);
  const cpkv_exchange_parts* parts = checked.exchange ? checked.exchange->parts : nullptr;
  harness::BenchReport report;
  report.json = bench_json(c, s);
  nlohmann::json rows = nlohmann::json::array();
  Ceilings ceilings;
  bool first = true;
  const auto need_line_printed = std::make_shared<std::string>();  // the memory line once per size over the variants
  for (model::Variant variant : checked.variants) {
    harness::RunOptions options;
    options.variant = variant;
    options.layers = s.layers;
    CudaOptions cuda_options;
    cuda_options.timing_reps = c.reps;
    cuda_options.measure_ceilings = first;
    cuda_options.need_line_printed = need_line_printed;
    cuda_options.exchange = checked.exchange;
    cuda_options.timeline = checked.request.timeline.value_or("");  // the checked layers only (gpu/timeline.hpp)
    apply_knobs(checked.request, cuda_options);
    cuda_options.bench_bulk = c.bulk;
    const BenchResult result = run_bench(s.source, options, cuda_options);
    if (!result.report.passed()) {
      report.exact = false;
      print.line(fmt::format("{}: FAILED: {} {}", model::to_string(variant), result.report.failure,
                             result.report.ranks.empty() ? "" : result.report.ranks[0].first_mismatch));
    }
    if (first) ceilings = result.ceilings;
    first = false;
    add_rows(s, variant, parts, result, ceilings, rows);
  }
  add_ceilings(ceilings, report.json);
  report.json["rows"] = rows;
  report.markdown = bench_markdown(rows, ceilings, s.source.setting.layer_count());
  return report;
}

}  // namespace cpkv::cuda

// cpkv bench: every exchange variant side by side on the GPUs, against the ceilings measured in the
// same run (copy-engine peer pull, local copy, barrier), with the model's bytes.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench_markdown.hpp"
#include "commands.hpp"
#include "cpkv/harness/request.hpp"
#include "cpkv/model/costs.hpp"
#include "files.hpp"
#include "options.hpp"
#include "rejected.hpp"
#include "cpkv/model/limits.hpp"
#include "cpkv/model/staging.hpp"
#include "cpkv/model/plan.hpp"
#include "cpkv/sim/runner.hpp"
#include "cuda_backend.hpp"

namespace cpkv::cli {
namespace {

struct BenchOptions {
  std::string trace_path;
  std::string backend = "cuda";
  std::string variant = "all";
  std::int32_t layers = 4;
  std::int32_t reps = 50;
  std::optional<std::int32_t> cp;
  std::optional<std::string> json_path;
  std::optional<std::string> markdown_path;
};

// Bytes one rank moves for one layer of `layer` (all active kinds), max over ranks.
struct ModelBytes {
  std::uint64_t peer = 0;   // gathered from peers
  std::uint64_t local = 0;  // gathered from itself, local copies
  std::uint64_t allreduce = 0;
};
ModelBytes model_bytes(const model::Setting& setting, const model::Batch& batch, model::Variant variant, std::int32_t layer) {
  const model::BatchLayout layout = model::layout_batch(setting, batch);
  ModelBytes out;
  for (std::int32_t rank = 0; rank < setting.cp; ++rank) {
    const model::LayerBytes b = model::layer_bytes(setting, model::variant_plan(layout, variant, rank), layer);
    const std::uint64_t gather_peer = b.pulled_from_peers();
    out.peer = std::max(out.peer, gather_peer);
    out.local = std::max(out.local, b.pulled_from[rank] + b.local_copy_bytes);
    out.allreduce = std::max(out.allreduce, b.allreduce_bytes);
  }
  return out;
}

ModelBytes mean_bytes(const model::Setting& setting, const model::Batch& batch, model::Variant variant, std::int32_t layers) {
  ModelBytes sum;
  for (std::int32_t l = 0; l < layers; ++l) {
    const ModelBytes b = model_bytes(setting, batch, variant, l);
    sum.peer += b.peer;
    sum.local += b.local;
    sum.allreduce += b.allreduce;
  }
  return {sum.peer / layers, sum.local / layers, sum.allreduce / layers};
}

// The one variant-list parser (harness/request.hpp), as `cpkv replay --variant` reads it.
std::vector<model::Variant> bench_variants(const std::string& name) {
  std::string unknown;
  if (auto variants = harness::parse_variant_list(name, &unknown)) return *std::move(variants);
  throw OptionError(fmt::format("--variant: unknown variant '{}' (one of: {}; a comma-separated list, or 'all')", unknown, model::variant_names()));
}

// The trace, the ranks on the GPUs, the layers timed, and every batch (for the model's bytes:
// benchmark traces are small, a handful of batches) with the ones the overflow verdict rejects
// (nothing of them is timed).
struct BenchSetup {
  harness::BatchSource source;
  std::int32_t gpus = 0;
  std::int32_t layers = 0;
  std::int32_t timed_cycle = 0;  // the backend's timing cycle
  std::vector<model::Batch> batches;
  std::vector<RejectedBatch> rejected;
  std::int64_t dense_slots = 0;  // the slots of the dense buffer: the largest batch's, as the executor sizes it
};

BenchSetup bench_setup(const BenchOptions& o, const InputFile& trace) {
  BenchSetup s{harness::BatchSource::from_trace(trace.path())};
  if (o.cp) {
    if (*o.cp < 1 || *o.cp > model::limits::cp_max) throw OptionError(fmt::format("--cp: {} is outside 1..{}", *o.cp, model::limits::cp_max));
    s.source.setting.cp = *o.cp;
  }
  s.gpus = cuda::gpu_count();
  if (s.gpus == 0) throw OptionError("--backend cuda: no CUDA device is visible on this machine");
  if (s.gpus < s.source.setting.cp) {
    throw OptionError(fmt::format("--cp: {} ranks on {} GPUs would time-slice; benchmarks need one GPU per rank", s.source.setting.cp, s.gpus));
  }
  s.layers = std::min(o.layers, s.source.setting.layer_count());
  if (s.layers < 2) throw OptionError("--layers: timing needs at least 2 layers (consecutive layers must alternate staging halves)");
  s.timed_cycle = s.layers % 2 == 0 ? s.layers : s.layers - 1;
  const std::int64_t staging_slots = model::staging_capacity(s.source.setting).staging_slots;
  harness::BatchCursor cursor(s.source);
  while (auto b = cursor.next()) {
    const model::BatchLayout layout = model::layout_batch(s.source.setting, *b);
    s.dense_slots = std::max(s.dense_slots, layout.slot_count);
    const model::Verdict verdict = model::overflow_verdict(layout.current_pages_total, staging_slots);
    if (verdict.overflow) s.rejected.push_back({cursor.index(), verdict});
    s.batches.push_back(*b);
  }
  return s;
}

// The cost model's compose time per layer: `cpkv replay --backend model`'s CostModel with the
// ceilings measured in this run, on the timed cycle's layers only, averaged like the measurement.
// The dense buffer the executor zeroes holds the trace's largest batch (harness shape.slot_count_max).
double predicted_us(const model::Setting& setting, const model::Batch& batch, model::Variant variant, std::int32_t cycle, const model::CostParameters& ceilings,
                    std::int64_t dense_slots) {
  model::Setting timed = setting;
  timed.layer_pattern = setting.layer_pattern.substr(0, static_cast<std::size_t>(cycle));
  model::BatchCosts costs;
  model::CostModel(timed, ceilings, dense_slots).evaluate(batch, costs);
  return costs.modelled_us[static_cast<std::size_t>(variant)] / cycle;
}


// The figures of batch b that kTimingTable names a JSON key for (gpu/bench_timings.hpp): the
// median (null where the row says 0 means none), min and max where the row keeps its spread, and
// the launches per layer.
void add_timing_keys(const cuda::BenchResult& result, std::size_t b, nlohmann::json& row) {
  for (const cuda::TimingRow& timing : cuda::kTimingTable) {
    const auto figure = [&](cuda::TimingStat stat) { return result.per_batch(timing.timing, stat)[b]; };
    if (timing.json_nodes != nullptr) row[timing.json_nodes] = figure(cuda::kNodes);
    if (timing.json_stem == nullptr) continue;
    const std::string stem = timing.json_stem;
    row[stem + "_median"] = timing.zero_is_none && figure(cuda::kMedian) <= 0 ? nlohmann::json() : nlohmann::json(figure(cuda::kMedian));
    if (!timing.spread) continue;
    row[stem + "_min"] = figure(cuda::kMin);
    row[stem + "_max"] = figure(cuda::kMax);
  }
}

// One row per timed batch of one variant's run. The ratio to the ideal is of the compose exchange
// alone, which is what the ideal counts (the fill is the model's own KV write in serving).
void add_rows(const BenchSetup& s, model::Variant variant, const cuda::BenchResult& result, const cuda::Ceilings& ceilings, nlohmann::json& rows) {
  const model::CostParameters model_c = model::derive_ceilings(ceilings);
  for (std::size_t b = 0; b < result.per_batch(cuda::Timing::with_fill).size() && b < s.batches.size(); ++b) {
    // Bytes averaged over the layers the timing cycles through (F and S layers move different kinds).
    const ModelBytes bytes = mean_bytes(s.source.setting, s.batches[b], variant, s.timed_cycle);
    const ModelBytes ideal_bytes = mean_bytes(s.source.setting, s.batches[b], model::Variant::staging_direct, s.timed_cycle);
    const double ideal_us = ideal_bytes.peer / (ceilings.ce_peer_gbps * 1e3) + ideal_bytes.local / (ceilings.local_copy_gbps * 1e3) + ceilings.barrier_us;
    const double us = result.per_batch(cuda::Timing::compose_only)[b];
    const double isolated_us = result.per_batch(cuda::Timing::isolated)[b];
    const double no_barrier_us = result.per_batch(cuda::Timing::compose_no_barrier)[b];
    if (us <= 0.0) continue;  // an overflowing batch is rejected before anything moves: nothing to time
    const double predicted = predicted_us(s.source.setting, s.batches[b], variant, s.timed_cycle, model_c, s.dense_slots);
    // The isolated current-page exchange exists where current pages move on their own: barrier +
    // gather (staging and symmetric variants) or the compact all-reduce (v2).
    const bool isolated_applies = model::info(variant).isolated != model::IsolatedExchange::none;
    rows.push_back({{"batch", b},
                    {"variant", model::to_string(variant)},
                    {"byte_exact", result.report.passed()},
                    {"ms_per_batch_compose", us * s.source.setting.layer_count() / 1000.0},
                    {"isolated_current_us", isolated_applies ? nlohmann::json(isolated_us) : nlohmann::json(nullptr)},
                    {"barrier_share_us", model::info(variant).isolated == model::IsolatedExchange::barrier_and_gather
                                             ? nlohmann::json(isolated_us - result.per_batch(cuda::Timing::isolated_gather_only)[b])
                                             : nlohmann::json(nullptr)},
                    {"barrier_share_in_layer_us", no_barrier_us > 0 ? nlohmann::json(us - no_barrier_us) : nlohmann::json(nullptr)},
                    {"peer_bytes_per_rank_layer", bytes.peer},
                    {"local_bytes_per_rank_layer", bytes.local},
                    {"allreduce_bytes_per_layer", bytes.allreduce},
                    {"achieved_peer_gbps", bytes.peer / (us * 1e3)},
                    {"ideal_us_per_layer", ideal_us},
                    {"ratio_to_ideal", us / ideal_us},
                    {"model_us_per_layer", predicted},
                    {"model_error", predicted / us - 1.0},
                    {"host_syncs_per_layer", result.host_syncs_in_layer_loop}});
    add_timing_keys(result, b, rows.back());
  }
}

// The ceilings, in the bench's own shape and in the one `cpkv replay --backend model --ceilings FILE` reads.
void add_ceilings(const cuda::Ceilings& ceilings, nlohmann::json& out) {
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

void run_bench(const BenchOptions& o) {
  if (o.backend != "cuda") throw OptionError(fmt::format("--backend: '{}': benchmarks run on cuda only", o.backend));
  const std::vector<model::Variant> variants = bench_variants(o.variant);
  // Inputs, then outputs, before any work: nothing is opened for writing until the results exist.
  const InputFile trace("trace", o.trace_path, /*spool=*/true);
  std::unique_ptr<OutputFile> json = o.json_path ? std::make_unique<OutputFile>("--json", *o.json_path) : nullptr;
  std::unique_ptr<OutputFile> markdown = o.markdown_path ? std::make_unique<OutputFile>("--markdown", *o.markdown_path) : nullptr;
  refuse_same_files({&trace}, {json.get(), markdown.get()});
  const BenchSetup s = bench_setup(o, trace);
  fmt::print("cpkv bench: {} | cp {} on {} GPUs | {} batches | {} layers timed x {} reps (of {} in the model)\n", o.trace_path, s.source.setting.cp,
             s.gpus, s.batches.size(), s.layers, o.reps, s.source.setting.layer_count());
  std::fflush(stdout);
  print_rejected("cpkv bench", s.rejected);

  nlohmann::json out;
  out["trace"] = o.trace_path;
  out["rejected_batches"] = rejected_json(s.rejected);
  out["cp"] = s.source.setting.cp;
  out["page_size"] = s.source.setting.page_size;  // the model replay checks a ceilings file against the trace by both
  out["layers_timed"] = s.layers;
  out["layers_model"] = s.source.setting.layer_count();
  out["reps"] = o.reps;
  nlohmann::json rows = nlohmann::json::array();
  cuda::Ceilings ceilings;
  bool first = true;
  bool all_exact = true;
  for (model::Variant variant : variants) {
    harness::RunOptions options;
    options.variant = variant;
    options.layers = s.layers;
    cuda::CudaOptions cuda_options;
    cuda_options.timing_reps = o.reps;
    cuda_options.measure_ceilings = first;
    const cuda::BenchResult result = cuda::run_bench(s.source, options, cuda_options);
    if (!result.report.passed()) {
      all_exact = false;
      fmt::print("{}: FAILED: {} {}\n", model::to_string(variant), result.report.failure,
                 result.report.ranks.empty() ? "" : result.report.ranks[0].first_mismatch);
    }
    if (first) {
      ceilings = result.ceilings;
      first = false;
    }
    add_rows(s, variant, result, ceilings, rows);
  }
  add_ceilings(ceilings, out);
  out["rows"] = rows;
  const std::string md = bench_markdown(rows, ceilings, s.source.setting.layer_count());
  fmt::print("{}", md);
  if (json) json->write(out.dump(2) + "\n");
  if (markdown) markdown->write(md);
  exit_status() = all_exact ? kExitOk : kExitFailure;
}

}  // namespace

void register_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand("bench",
                                     "Time every exchange variant per layer on the GPUs, byte-exact checked first: each batch's layer loop is "
                                     "captured once into a CUDA graph and replayed (CUDA events, median/min/max over replays after a "
                                     "warm-up), the compose exchange alone and with the fill, against ceilings measured in the same run "
                                     "and the cost model's prediction with those ceilings.");
  cmd->add_option("trace", o->trace_path, "batch trace")->required();
  cmd->add_option("--backend", o->backend, "cuda")->capture_default_str();
  cmd->add_option("--variant", o->variant, "a variant or 'all'")->capture_default_str();
  cmd->add_option("--layers", o->layers, "layers run (the timing cycles through them)")->capture_default_str()->check(whole_in<std::int32_t>(1, model::limits::layer_count_max));
  cmd->add_option("--reps", o->reps, "timed replays of the layer loop per batch and variant")->capture_default_str()
      ->check(whole_in<std::int32_t>(1, static_cast<std::int32_t>(option_limits::repetitions_max)));
  cmd->add_option("--cp", o->cp, "override the trace's cp (one GPU per rank)")->check(whole_in<std::int32_t>(1, model::limits::cp_max));
  cmd->add_option("--json", o->json_path, "write the results as JSON (a regular file, replaced only when the run completes)");
  cmd->add_option("--markdown", o->markdown_path, "write the Markdown table (a regular file)");
  cmd->callback([o] { run_bench(*o); });
}

}  // namespace cpkv::cli

// The model replay: one pass over a source's BatchCursor, every batch's verdict, bytes and modelled
// time from the closed form (model/costs.hpp); with exact_model, every rank's plan built by the
// model and checked field by field against it.
#include "cpkv/harness/model_replay.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cpkv/harness/interrupt.hpp"
#include "cpkv/model/batch.hpp"
#include "cpkv/model/plan.hpp"
#include "cpkv/model/staging.hpp"
#include "cpkv/traces/text.hpp"

namespace cpkv::harness {
namespace {

using Clock = std::chrono::steady_clock;
using model::kVariantCount;
using model::BatchCosts;
using model::BatchCounts;

// Nearest-rank percentiles of a sample (sorted here).
template <typename T>
nlohmann::json percentiles(std::vector<T>& values) {
  if (values.empty()) return nullptr;
  std::sort(values.begin(), values.end());
  const auto at = [&](double q) {
    const auto rank = static_cast<std::size_t>(std::max(1.0, std::ceil(q * static_cast<double>(values.size()))));
    return values[std::min(rank, values.size()) - 1];
  };
  double sum = 0;
  for (const T& v : values) sum += static_cast<double>(v);
  return {{"min", values.front()}, {"p50", at(0.50)}, {"p90", at(0.90)}, {"p99", at(0.99)}, {"max", values.back()},
          {"mean", sum / static_cast<double>(values.size())}, {"count", values.size()}};
}

std::string brief(const nlohmann::json& p, double scale = 1.0, int digits = 0) {
  if (p.is_null()) return "(no samples)";
  const auto f = [&](const char* key) { return fmt::format("{:.{}f}", p[key].get<double>() * scale, digits); };
  return fmt::format("min {} p50 {} p90 {} p99 {} max {}", f("min"), f("p50"), f("p90"), f("p99"), f("max"));
}

// --exact-model: the model's own plans and byte counts for every rank, variant and layer.
void check_against_model(const model::Setting& setting, const model::Batch& batch, const BatchCounts& counts, std::int64_t index) {
  const model::BatchLayout layout = model::layout_batch(setting, batch);
  for (model::Variant variant : model::kAllVariants) {
    for (std::int32_t rank = 0; rank < setting.cp; ++rank) {
      const model::VariantPlan plan = model::variant_plan(layout, variant, rank);
      for (std::int32_t layer = 0; layer < setting.layer_count(); ++layer) {
        const model::LayerBytes want = model::layer_bytes(setting, plan, layer);
        const model::LayerBytes got = layer_bytes_from_counts(setting, counts, variant, rank, layer);
        if (want.pulled_from != got.pulled_from || want.allreduce_bytes != got.allreduce_bytes ||
            want.local_copy_bytes != got.local_copy_bytes || want.allreduces != got.allreduces || want.barriers != got.barriers ||
            want.gathers != got.gathers) {
          throw std::logic_error(fmt::format("exact model: batch {} variant {} rank {} layer {}: closed-form bytes differ from model::layer_bytes",
                                             index, model::to_string(variant), rank, layer));
        }
      }
    }
  }
}

// What one pass over the trace gathers.
struct ModelTotals {
  std::int64_t batches = 0, requests = 0, prefix_tokens = 0, extend_tokens = 0;
  std::vector<std::int64_t> current_pages;
  std::vector<RejectedBatch> rejected;
  std::vector<std::int64_t> batch_index;                                     // batches that moved bytes
  std::array<std::vector<double>, kVariantCount> pulled_per_rank_per_layer;  // samples: (batch, rank)
  std::vector<std::array<double, kVariantCount>> batch_ms;
  std::array<double, kVariantCount> total_ms{};
  double model_seconds = 0, read_seconds = 0;
  std::int64_t evaluations = 0;
};

void add_batch(const model::Setting& setting, const BatchCosts& costs, std::int64_t index, ModelTotals& t) {
  ++t.batches;
  t.requests += costs.counts.requests;
  t.prefix_tokens += costs.counts.prefix_tokens;
  t.extend_tokens += costs.counts.extend_tokens;
  t.current_pages.push_back(costs.counts.current_pages_total);
  if (costs.verdict.overflow) {
    t.rejected.push_back({index, costs.verdict});
    return;
  }
  const double layers = setting.layer_count();
  std::array<double, kVariantCount> ms{};
  for (std::size_t v = 0; v < kVariantCount; ++v) {
    for (std::uint64_t bytes : costs.pulled_from_peers_all_layers[v]) t.pulled_per_rank_per_layer[v].push_back(static_cast<double>(bytes) / layers);
    ms[v] = costs.modelled_us[v] / 1000.0;
    t.total_ms[v] += ms[v];
  }
  t.batch_index.push_back(index);
  t.batch_ms.push_back(ms);
}

ModelTotals read_all(const BatchSource& source, const model::CostModel& cost_model, const ModelReplayOptions& o) {
  const model::Setting& setting = source.setting;
  ModelTotals t;
  BatchCosts costs;
  BatchCursor cursor(source);
  auto read_start = Clock::now();
  while (const std::optional<model::Batch> batch = cursor.next()) {
    if (stop_requested() != 0) break;  // a front end's stop (interrupt.hpp): it discards these totals
    t.read_seconds += std::chrono::duration<double>(Clock::now() - read_start).count();
    const auto model_start = Clock::now();
    for (std::int64_t k = 0; k < o.repeat; ++k) cost_model.evaluate(*batch, costs);
    t.model_seconds += std::chrono::duration<double>(Clock::now() - model_start).count();
    t.evaluations += o.repeat;
    if (o.exact_model) check_against_model(setting, *batch, costs.counts, cursor.index());
    add_batch(setting, costs, cursor.index(), t);
    read_start = Clock::now();
  }
  return t;
}

nlohmann::json ceilings_json(const model::CostParameters& ceilings) {
  return {{"peer_gbps", ceilings.peer_gbps}, {"local_gbps", ceilings.local_gbps}, {"barrier_us", ceilings.barrier_us},
          {"allreduce_busbw_gbps", ceilings.allreduce_busbw_gbps}, {"allreduce_latency_us", ceilings.allreduce_latency_us},
          {"launch_us", ceilings.launch_us}, {"gather_fixed_us", ceilings.gather_fixed_us},
          {"allreduce_curve", ceilings.allreduce_curve}, {"source", ceilings.source}};
}

}  // namespace

ModelReplayOutput model_replay(const BatchSource& source, const std::string& label, const model::CostParameters& ceilings,
                               const ModelReplayOptions& o) {
  const model::Setting& setting = source.setting;
  const model::CostModel cost_model(setting, ceilings, o.dense_slots);
  ModelTotals t = read_all(source, cost_model, o);
  const std::int32_t full_layers = static_cast<std::int32_t>(std::count(setting.layer_pattern.begin(), setting.layer_pattern.end(), 'F'));
  const double hit_rate = t.prefix_tokens + t.extend_tokens == 0 ? 0.0 : static_cast<double>(t.prefix_tokens) / static_cast<double>(t.prefix_tokens + t.extend_tokens);
  const double batches_per_second = t.model_seconds > 0 ? static_cast<double>(t.evaluations) / t.model_seconds : 0.0;
  nlohmann::json pages_p = percentiles(t.current_pages);
  std::string text;
  auto out = std::back_inserter(text);
  fmt::format_to(out, "cpkv replay: {} | backend model | cp {} page {} | {} layers ({} F) | staging_slots {} ({})\n", label, setting.cp,
                 setting.page_size, setting.layer_count(), full_layers, cost_model.staging_slots(), model::to_string(model::staging_capacity(setting).source));
  fmt::format_to(out, "  batches {}, requests {}, extend tokens {}, prefix tokens {}, prefix hit rate {:.4f} (prefix / (prefix + extend) tokens)\n",
                 t.batches, t.requests, t.extend_tokens, t.prefix_tokens, hit_rate);
  fmt::format_to(out, "  overflow batches {} (rejected before any rank moves a byte; left out of the bytes and times below)\n", t.rejected.size());
  fmt::format_to(out, "  current_pages_total: {}\n", brief(pages_p));
  fmt::format_to(out, "  ceilings: peer {:.4g} GB/s, local {:.4g} GB/s, barrier {:.4g} us, all-reduce {:.4g} GB/s bus + {:.4g} us per call, launch {:.4g} us, gather fixed {:.4g} us [{}]\n",
                 ceilings.peer_gbps, ceilings.local_gbps, ceilings.barrier_us, ceilings.allreduce_busbw_gbps, ceilings.allreduce_latency_us,
                 ceilings.launch_us, ceilings.gather_fixed_us, ceilings.source);
  fmt::format_to(out, "  {:<16} {:>62}   {:>12}  {}\n", "variant", "MB pulled from peers per rank per layer", "modelled ms", "per batch (ms)");
  nlohmann::json variants = nlohmann::json::array();
  for (std::size_t v = 0; v < kVariantCount; ++v) {
    std::vector<double> per_batch;
    per_batch.reserve(t.batch_ms.size());
    for (const auto& ms : t.batch_ms) per_batch.push_back(ms[v]);
    nlohmann::json bytes_p = percentiles(t.pulled_per_rank_per_layer[v]);
    nlohmann::json ms_p = percentiles(per_batch);
    fmt::format_to(out, "  {:<16} {:>62}   {:>12.3f}  {}\n", model::to_string(model::kAllVariants[v]), brief(bytes_p, 1e-6, 2), t.total_ms[v], brief(ms_p, 1.0, 3));
    variants.push_back({{"variant", model::to_string(model::kAllVariants[v])},
                        {"bytes_pulled_from_peers_per_rank_per_layer", bytes_p},
                        {"modelled_ms_total", t.total_ms[v]},
                        {"modelled_ms_per_batch", ms_p}});
  }
  fmt::format_to(out, "  model speed: {} batch evaluations in {:.4f} s = {:.0f} batches/s on one core (reading and checking the trace: {:.4f} s)\n",
                 t.evaluations, t.model_seconds, batches_per_second, t.read_seconds);
  ModelReplayOutput result;
  result.json = {
        {"trace", traces::escape_bytes(label)}, {"backend", "model"}, {"cp", setting.cp}, {"page_size", setting.page_size}, {"layers", setting.layer_count()},
        {"staging_slots", cost_model.staging_slots()}, {"batches", t.batches}, {"requests", t.requests}, {"extend_tokens", t.extend_tokens},
        {"prefix_tokens", t.prefix_tokens}, {"prefix_hit_rate", hit_rate}, {"overflow_batches", t.rejected.size()},
        {"rejected_batches", rejected_json(t.rejected)}, {"current_pages_total", pages_p},
        {"ceilings", ceilings_json(ceilings)},
        {"variants", variants},
        {"timing", {{"evaluations", t.evaluations}, {"model_seconds", t.model_seconds}, {"batches_per_second", batches_per_second},
                    {"read_seconds", t.read_seconds}}}};
  result.text = std::move(text);
  result.rejected = std::move(t.rejected);
  result.batch_index = std::move(t.batch_index);
  result.batch_ms = std::move(t.batch_ms);
  return result;
}

}  // namespace cpkv::harness

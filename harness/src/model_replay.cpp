// The model replay: one pass over a source's BatchCursor, every batch's verdict, bytes and modelled
// time from the closed form (model/costs.hpp); with exact_model, every rank's plan built by the
// model and checked field by field against it.
#include "cpkv/harness/model_replay.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iterator>
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
            want.gathers != got.gathers || want.allgather_bytes != got.allgather_bytes || want.allgathers != got.allgathers) {
          throw std::logic_error(fmt::format("exact model: batch {} variant {} rank {} layer {}: closed-form bytes differ from model::layer_bytes",
                                             index, model::to_string(variant), rank, layer));
        }
      }
    }
  }
}

// One variant's cost of one batch, from model/costs.hpp's functions, with the parts they compute
// apart: all layers, the slowest rank's time (barriers and collectives hold every layer to it).
// The barrier and all-reduce figures are the parts' own (parts.barrier_us, parts.allreduce_us).
struct VariantCost {
  double us = 0;
  std::vector<std::uint64_t> pulled;  // [rank]: bytes pulled from peers (LayerBytes::pulled_from_peers)
  std::uint64_t local_copy_bytes = 0; // the most any rank copies locally
  std::uint64_t allreduce_bytes = 0;  // summed by one rank's all-reduces (the same on every rank)
  std::uint64_t allgather_bytes = 0;  // gathered by one rank's all-gathers, padding included (the same on every rank)
  model::TimeComponents parts;        // `us` by part (model/costs.hpp): the slowest rank's per layer
};

// The model's time of a variant layer by layer class, as model::CostModel::evaluate sums it, for
// the batches and parts CostModel does not give: an overflowing batch's variants without staging,
// and the per-batch components (layer_copy_us less the barrier, the barrier, allreduces_us).
class VariantCoster {
 public:
  VariantCoster(const model::Setting& setting, const model::CostParameters& ceilings) : setting_(setting), ceilings_(ceilings) {
    for (std::int32_t layer = 0; layer < setting.layer_count(); ++layer) {
      LayerClass& c = setting.layer_is_full(layer) ? classes_[0] : classes_[1];
      if (c.count++ == 0) c.layer = layer;
    }
  }
  VariantCost operator()(const BatchCounts& counts, model::Variant variant) const {
    VariantCost cost;
    cost.pulled.assign(setting_.cp, 0);
    for (const LayerClass& c : classes_) {
      if (c.count == 0) continue;
      const std::uint64_t page_bytes = setting_.row_bytes_on_layer(c.layer) * static_cast<std::uint32_t>(setting_.page_size);
      double slowest_us = 0;
      model::TimeComponents slowest;
      std::uint64_t local = 0;
      for (std::int32_t rank = 0; rank < setting_.cp; ++rank) {
        const model::LayerBytes bytes = model::layer_bytes_from_counts(setting_, counts, variant, rank, c.layer);
        cost.pulled[rank] += bytes.pulled_from_peers() * static_cast<std::uint64_t>(c.count);
        const model::TimeComponents parts = model::layer_copy_components(setting_, counts, variant, bytes, ceilings_, page_bytes);
        const double us = parts.total_us();
        if (rank == 0 || us > slowest_us) slowest = parts;
        slowest_us = std::max(slowest_us, us);
        local = std::max(local, bytes.local_copy_bytes);
        if (rank == 0) cost.allreduce_bytes += bytes.allreduce_bytes * static_cast<std::uint64_t>(c.count);
        if (rank == 0) cost.allgather_bytes += bytes.allgather_bytes * static_cast<std::uint64_t>(c.count);
      }
      const double allreduce_us = model::allreduces_us(setting_, counts, variant, c.layer, ceilings_);
      const double allgather_us = model::allgathers_us(setting_, counts, variant, c.layer, ceilings_);
      cost.local_copy_bytes += local * static_cast<std::uint64_t>(c.count);
      cost.us += (slowest_us + allreduce_us + allgather_us) * c.count;
      slowest.allreduce_us = allreduce_us;
      slowest.allgather_us = allgather_us;
      cost.parts.add(slowest, c.count);
    }
    return cost;
  }

 private:
  struct LayerClass {
    std::int32_t layer = -1, count = 0;
  };
  model::Setting setting_;
  model::CostParameters ceilings_;
  std::array<LayerClass, 2> classes_{};  // full layers, shared layers: bytes depend on the layer only through its class
};

// What one pass over the trace gathers.
struct ModelTotals {
  std::int64_t batches = 0, requests = 0, prefix_tokens = 0, extend_tokens = 0;
  std::vector<std::int64_t> current_pages;
  std::vector<RejectedBatch> rejected;
  std::array<std::int64_t, kVariantCount> rejected_per_variant{};
  std::vector<std::int64_t> batch_index;
  std::array<std::vector<double>, kVariantCount> pulled_per_rank_per_layer;  // samples: (batch, rank)
  std::vector<std::array<double, kVariantCount>> batch_ms;                    // NaN: rejected for the variant
  std::vector<nlohmann::json> per_batch;
  std::array<double, kVariantCount> total_ms{};
  std::array<model::TimeComponents, kVariantCount> parts_total{};  // over the batches each variant counts
  double model_seconds = 0, read_seconds = 0;
  std::int64_t evaluations = 0;
};

nlohmann::json batch_record(const BatchCosts& costs, std::int64_t index) {
  const BatchCounts& c = costs.counts;
  return {{"batch", index}, {"requests", c.requests}, {"extend_tokens", c.extend_tokens}, {"prefix_tokens", c.prefix_tokens},
          {"current_pages", c.current_pages_total}, {"slots", c.slot_count}, {"staging_slots", costs.verdict.staging_slots},
          {"verdict", costs.verdict.overflow ? "overflow" : "ok"}, {"variants", nlohmann::json::object()}};
}

nlohmann::json variant_record(const VariantCost& cost) {
  const model::TimeComponents& p = cost.parts;
  return {{"ms", cost.us / 1000.0}, {"copies_ms", (cost.us - p.barrier_us - p.allreduce_us - p.allgather_us) / 1000.0},
          {"barrier_ms", p.barrier_us / 1000.0}, {"allreduce_ms", p.allreduce_us / 1000.0}, {"allgather_ms", p.allgather_us / 1000.0},
          {"zero_ms", p.zero_us / 1000.0}, {"fill_ms", p.fill_us / 1000.0}, {"launch_ms", p.launch_us / 1000.0},
          {"local_ms", p.local_us / 1000.0}, {"peer_ms", p.peer_us / 1000.0},
          {"peer_bytes_max", *std::max_element(cost.pulled.begin(), cost.pulled.end())}, {"local_copy_bytes_max", cost.local_copy_bytes},
          {"allreduce_bytes", cost.allreduce_bytes}, {"allgather_bytes", cost.allgather_bytes}};
}

void add_batch(const model::Setting& setting, const BatchCosts& costs, const VariantCoster& coster, bool per_batch, std::int64_t index,
               ModelTotals& t) {
  ++t.batches;
  t.requests += costs.counts.requests;
  t.prefix_tokens += costs.counts.prefix_tokens;
  t.extend_tokens += costs.counts.extend_tokens;
  t.current_pages.push_back(costs.counts.current_pages_total);
  const bool overflow = costs.verdict.overflow;
  if (overflow) t.rejected.push_back({index, costs.verdict});
  nlohmann::json record = per_batch ? batch_record(costs, index) : nlohmann::json();
  const double layers = setting.layer_count();
  std::array<double, kVariantCount> ms{};
  for (std::size_t v = 0; v < kVariantCount; ++v) {
    const model::Variant variant = model::kAllVariants[v];
    if (overflow && uses_staging(variant)) {  // rejected before any rank writes staging (PROTOCOL.md section 4)
      ++t.rejected_per_variant[v];
      ms[v] = std::nan("");
      if (per_batch) record["variants"][std::string(model::to_string(variant))] = nullptr;
      continue;
    }
    // CostModel's numbers when it gave them; the coster's (the same functions) otherwise.
    VariantCost cost;
    if (overflow || per_batch) {
      cost = coster(costs.counts, variant);
    } else {
      cost.pulled = costs.pulled_from_peers_all_layers[v];
      cost.us = costs.modelled_us[v];
      cost.parts = costs.components[v];
    }
    t.parts_total[v].add(cost.parts, 1.0);
    for (std::uint64_t bytes : cost.pulled) t.pulled_per_rank_per_layer[v].push_back(static_cast<double>(bytes) / layers);
    ms[v] = cost.us / 1000.0;
    t.total_ms[v] += ms[v];
    if (per_batch) record["variants"][std::string(model::to_string(variant))] = variant_record(cost);
  }
  t.batch_index.push_back(index);
  t.batch_ms.push_back(ms);
  if (per_batch) t.per_batch.push_back(std::move(record));
}

ModelTotals read_all(const BatchSource& source, const model::Setting& setting, const model::CostModel& cost_model,
                     const VariantCoster& coster, const ModelReplayOptions& o) {
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
    add_batch(setting, costs, coster, o.per_batch, cursor.index(), t);
    if (o.per_batch_sink) {  // streamed: at most one record held
      for (const nlohmann::json& record : t.per_batch) o.per_batch_sink(record);
      t.per_batch.clear();
    }
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

// "staging_publish 1, staging_direct 1" (the variants an overflow rejects, and how often).
std::string rejected_by_variant(const ModelTotals& t) {
  std::vector<std::string> parts;
  for (std::size_t v = 0; v < kVariantCount; ++v) {
    if (uses_staging(model::kAllVariants[v])) parts.push_back(fmt::format("{} {}", model::to_string(model::kAllVariants[v]), t.rejected_per_variant[v]));
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

nlohmann::json components_json(const model::TimeComponents& p) {
  return {{"zero_ms", p.zero_us / 1000.0},       {"fill_ms", p.fill_us / 1000.0}, {"launch_ms", p.launch_us / 1000.0},
          {"barrier_ms", p.barrier_us / 1000.0}, {"peer_ms", p.peer_us / 1000.0}, {"local_ms", p.local_us / 1000.0},
          {"allreduce_ms", p.allreduce_us / 1000.0}, {"allgather_ms", p.allgather_us / 1000.0}, {"total_ms", p.total_us() / 1000.0}};
}

// The per-variant table of the summary, and its JSON.
nlohmann::json variants_table(const ModelTotals& t, std::back_insert_iterator<std::string> out) {
  fmt::format_to(out, "  {:<20} {:>8} {:>8} {:>62}   {:>12}  {}\n", "variant", "counted", "rejected", "MB pulled from peers per rank per layer",
                 "modelled ms", "per batch (ms)");
  nlohmann::json variants = nlohmann::json::array();
  for (std::size_t v = 0; v < kVariantCount; ++v) {
    std::vector<double> per_batch;
    per_batch.reserve(t.batch_ms.size());
    for (const auto& ms : t.batch_ms) {
      if (!std::isnan(ms[v])) per_batch.push_back(ms[v]);
    }
    const auto counted = static_cast<std::int64_t>(per_batch.size());
    std::vector<double> pulled = t.pulled_per_rank_per_layer[v];
    nlohmann::json bytes_p = percentiles(pulled);
    nlohmann::json ms_p = percentiles(per_batch);
    fmt::format_to(out, "  {:<20} {:>8} {:>8} {:>62}   {:>12.3f}  {}\n", model::to_string(model::kAllVariants[v]), counted, t.rejected_per_variant[v],
                   brief(bytes_p, 1e-6, 2), t.total_ms[v], brief(ms_p, 1.0, 3));
    variants.push_back({{"variant", model::to_string(model::kAllVariants[v])},
                        {"uses_staging", uses_staging(model::kAllVariants[v])},
                        {"batches_counted", counted},
                        {"batches_rejected", t.rejected_per_variant[v]},
                        {"bytes_pulled_from_peers_per_rank_per_layer", bytes_p},
                        {"modelled_ms_total", t.total_ms[v]},
                        {"components_ms_total", components_json(t.parts_total[v])},
                        {"modelled_ms_per_batch", ms_p}});
  }
  return variants;
}

// Where each variant's modelled time goes, over the batches it counts (model/costs.hpp TimeComponents).
void components_table(const ModelTotals& t, std::back_insert_iterator<std::string> out) {
  fmt::format_to(out, "  where the time goes (ms over the counted batches; peer / local: the longer of the overlapped post-signal streams carries it)\n");
  fmt::format_to(out, "  {:<20} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}\n", "variant", "zero", "fill", "launch", "barrier", "peer", "local", "all-reduce",
                 "all-gather");
  for (std::size_t v = 0; v < kVariantCount; ++v) {
    const model::TimeComponents& p = t.parts_total[v];
    fmt::format_to(out, "  {:<20} {:>10.3f} {:>10.3f} {:>10.3f} {:>10.3f} {:>10.3f} {:>10.3f} {:>10.3f} {:>10.3f}\n", model::to_string(model::kAllVariants[v]),
                   p.zero_us / 1000.0, p.fill_us / 1000.0, p.launch_us / 1000.0, p.barrier_us / 1000.0, p.peer_us / 1000.0, p.local_us / 1000.0,
                   p.allreduce_us / 1000.0, p.allgather_us / 1000.0);
  }
}

// The staging slots `mib` MiB of staging gives the setting (model::staging_capacity's override).
std::int64_t slots_at(const model::Setting& setting, std::int64_t mib) {
  model::Setting s = setting;
  s.caps.staging_mib_override = mib;
  return model::staging_capacity(s).staging_slots;
}

// --staging-sweep: overflows per size, the smallest size of the sweep that admits every batch, and
// the smallest whole MiB that does (staging slots grow with the size: a binary search).
nlohmann::json staging_sweep(const model::Setting& setting, const std::vector<std::int64_t>& sizes, const std::vector<std::int64_t>& pages,
                             std::back_insert_iterator<std::string> out) {
  const std::int64_t most = pages.empty() ? 0 : *std::max_element(pages.begin(), pages.end());
  nlohmann::json rows = nlohmann::json::array();
  nlohmann::json in_sweep = nullptr;
  fmt::format_to(out, "  staging sweep (MiB: staging slots, overflow batches of {}):", pages.size());
  for (const std::int64_t mib : sizes) {
    const std::int64_t slots = slots_at(setting, mib);
    const auto overflows = std::count_if(pages.begin(), pages.end(), [&](std::int64_t p) { return model::overflow_verdict(p, slots).overflow; });
    rows.push_back({{"mib", mib}, {"staging_slots", slots}, {"overflow_batches", overflows}});
    if (overflows == 0 && in_sweep.is_null()) in_sweep = mib;
    fmt::format_to(out, " {}: {}, {};", mib, slots, overflows);
  }
  std::int64_t low = 1, high = std::int64_t{1} << 40;  // a byte count that still fits the override's shift
  if (model::overflow_verdict(most, slots_at(setting, high)).overflow) high = 0;  // nothing admits it
  while (high > 0 && low < high) {
    const std::int64_t mid = low + (high - low) / 2;
    if (model::overflow_verdict(most, slots_at(setting, mid)).overflow) {
      low = mid + 1;
    } else {
      high = mid;
    }
  }
  const nlohmann::json smallest = high > 0 ? nlohmann::json(low) : nlohmann::json(nullptr);
  fmt::format_to(out, "\n  smallest staging that admits every batch (current_pages_total up to {}): {} in the sweep, {} exactly\n", most,
                 in_sweep.is_null() ? "none" : fmt::format("{} MiB", in_sweep.get<std::int64_t>()),
                 smallest.is_null() ? "none" : fmt::format("{} MiB ({} slots)", low, slots_at(setting, low)));
  return {{"sizes", rows}, {"smallest_admitting_mib_in_sweep", in_sweep}, {"smallest_admitting_mib", smallest}, {"current_pages_total_max", most}};
}

}  // namespace

bool uses_staging(model::Variant variant) { return model::info(variant).peer_pages == model::PeerPages::staging; }

ModelReplayOutput model_replay(const BatchSource& source, const std::string& label, const model::CostParameters& ceilings,
                               const ModelReplayOptions& o) {
  model::Setting setting = source.setting;
  if (o.staging_mib) setting.caps.staging_mib_override = *o.staging_mib;
  const model::CostModel cost_model(setting, ceilings);
  const VariantCoster coster(setting, ceilings);
  ModelTotals t = read_all(source, setting, cost_model, coster, o);
  const std::int32_t full_layers = static_cast<std::int32_t>(std::count(setting.layer_pattern.begin(), setting.layer_pattern.end(), 'F'));
  const double hit_rate = t.prefix_tokens + t.extend_tokens == 0 ? 0.0 : static_cast<double>(t.prefix_tokens) / static_cast<double>(t.prefix_tokens + t.extend_tokens);
  const double batches_per_second = t.model_seconds > 0 ? static_cast<double>(t.evaluations) / t.model_seconds : 0.0;
  const std::vector<std::int64_t> pages = t.current_pages;  // percentiles sorts its copy in place
  nlohmann::json pages_p = percentiles(t.current_pages);
  std::string text;
  auto out = std::back_inserter(text);
  fmt::format_to(out, "cpkv replay: {} | backend model | cp {} page {} | {} layers ({} F) | staging_slots {} ({})\n", label, setting.cp,
                 setting.page_size, setting.layer_count(), full_layers, cost_model.staging_slots(), model::to_string(model::staging_capacity(setting).source));
  fmt::format_to(out, "  batches {}, requests {}, extend tokens {}, prefix tokens {}, prefix hit rate {:.4f} (prefix / (prefix + extend) tokens)\n",
                 t.batches, t.requests, t.extend_tokens, t.prefix_tokens, hit_rate);
  fmt::format_to(out, "  overflow batches {}: rejected before any rank moves a byte by the variants that use staging ({}); the others run them and are counted\n",
                 t.rejected.size(), rejected_by_variant(t));
  fmt::format_to(out, "  current_pages_total: {}\n", brief(pages_p));
  fmt::format_to(out, "  ceilings: peer {:.4g} GB/s, local {:.4g} GB/s, barrier {:.4g} us, all-reduce {:.4g} GB/s bus + {:.4g} us per call, launch {:.4g} us, gather fixed {:.4g} us [{}]\n",
                 ceilings.peer_gbps, ceilings.local_gbps, ceilings.barrier_us, ceilings.allreduce_busbw_gbps, ceilings.allreduce_latency_us,
                 ceilings.launch_us, ceilings.gather_fixed_us, ceilings.source);
  nlohmann::json variants = variants_table(t, out);
  components_table(t, out);
  const nlohmann::json sweep = o.staging_sweep.empty() ? nlohmann::json(nullptr) : staging_sweep(setting, o.staging_sweep, pages, out);
  fmt::format_to(out, "  model speed: {} batch evaluations in {:.4f} s = {:.0f} batches/s on one core (reading and checking the trace: {:.4f} s)\n",
                 t.evaluations, t.model_seconds, batches_per_second, t.read_seconds);
  ModelReplayOutput result;
  result.json = {
        {"trace", traces::escape_bytes(label)}, {"backend", "model"}, {"cp", setting.cp}, {"page_size", setting.page_size}, {"layers", setting.layer_count()},
        {"staging_slots", cost_model.staging_slots()}, {"staging_source", model::to_string(model::staging_capacity(setting).source)},
        {"batches", t.batches}, {"requests", t.requests}, {"extend_tokens", t.extend_tokens},
        {"prefix_tokens", t.prefix_tokens}, {"prefix_hit_rate", hit_rate}, {"overflow_batches", t.rejected.size()},
        {"rejected_batches", rejected_json(t.rejected)}, {"current_pages_total", pages_p},
        {"ceilings", ceilings_json(ceilings)},
        {"variants", variants},
        {"staging_sweep", sweep},
        {"timing", {{"evaluations", t.evaluations}, {"model_seconds", t.model_seconds}, {"batches_per_second", batches_per_second},
                    {"read_seconds", t.read_seconds}}}};
  result.text = std::move(text);
  result.rejected = std::move(t.rejected);
  result.batch_index = std::move(t.batch_index);
  result.batch_ms = std::move(t.batch_ms);
  result.per_batch = std::move(t.per_batch);
  return result;
}

}  // namespace cpkv::harness

#include "bench_markdown.hpp"

#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench_timings.hpp"

namespace cpkv::cuda {
namespace {

std::string one_decimal_or_dash(const nlohmann::json& value) { return value.is_null() ? "-" : fmt::format("{:.1f}", value.get<double>()); }

// The header cells of one timing's columns: its median (with the spread where kept) and its launches.
void timing_headers(const TimingRow& t, std::vector<std::string>& cells) {
  cells.push_back(fmt::format("{} {}", t.column, t.unit));
  if (t.spread) cells.push_back(fmt::format("{} min-max", t.column));
  if (t.json_nodes != nullptr) cells.push_back(fmt::format("launches/layer ({})", t.column));
}

// A row's figure, or null where the row lacks the key (a report of an older cpkv).
nlohmann::json figure(const nlohmann::json& row, const std::string& key) { return row.contains(key) ? row.at(key) : nlohmann::json(); }

void timing_cells(const TimingRow& t, const nlohmann::json& row, std::vector<std::string>& cells) {
  const std::string stem = t.json_stem;
  const nlohmann::json median = figure(row, stem + "_median");
  const bool none = median.is_null();
  cells.push_back(one_decimal_or_dash(median));
  if (t.spread) cells.push_back(none ? "-" : fmt::format("{:.1f}-{:.1f}", row.at(stem + "_min").get<double>(), row.at(stem + "_max").get<double>()));
  if (t.json_nodes != nullptr) cells.push_back(none || figure(row, t.json_nodes).is_null() ? "-" : fmt::format("{:.0f}", row.at(t.json_nodes).get<double>()));
}

// A timing with a column of its own: every exchange's table has them all, '-' where its exchange
// does not offer the part (a plugin without cpkv_exchange_parts).
bool has_column(const TimingRow& t) { return t.column != nullptr && t.json_stem != nullptr; }

std::string table_line(const std::vector<std::string>& cells) { return "| " + fmt::format("{}", fmt::join(cells, " | ")) + " |\n"; }

std::string legend(std::int32_t layer_count) {
  std::vector<std::string> parts;
  for (const TimingRow& t : kTimingTable) {
    if (has_column(t)) parts.push_back(fmt::format("{} = {}", t.column, t.legend));
  }
  return fmt::format(
      "{}. Figures in {} per layer, median over replays of the batch's captured layer loop (min-max); x ideal and the model are of compose (the plugin compose where the exchange offers no parts); "
      "ms/batch = compose x {} layers; barrier in the layer = compose less the same launch with its barrier taken out (bytes not checked "
      "there).\n\n",
      fmt::join(parts, "; "), kTimingTable[0].unit, layer_count);
}

std::string rows_table(const nlohmann::json& rows) {
  std::vector<std::string> header = {"batch", "variant"};
  for (const TimingRow& t : kTimingTable) {
    if (has_column(t)) timing_headers(t, header);
  }
  for (const char* derived : {"ms/batch", "isolated current us (barrier's share)", "barrier in the layer us", "peer MB/rank/layer", "GB/s",
                              "x ideal", "model us", "model error", "exact"}) {
    header.emplace_back(derived);
  }
  std::string md = table_line(header) + table_line(std::vector<std::string>(header.size(), "---"));
  for (const auto& r : rows) {
    std::vector<std::string> cells = {fmt::format("{}", r["batch"].get<int>()), r["variant"].get<std::string>()};
    for (const TimingRow& t : kTimingTable) {
      if (has_column(t)) timing_cells(t, r, cells);
    }
    std::string isolated = one_decimal_or_dash(r["isolated_current_us"]);
    if (!r["barrier_share_us"].is_null()) isolated += fmt::format(" ({:.1f})", r["barrier_share_us"].get<double>());
    cells.insert(cells.end(), {fmt::format("{:.2f}", r["ms_per_batch_compose"].get<double>()), isolated, one_decimal_or_dash(r["barrier_share_in_layer_us"]),
                               fmt::format("{:.2f}", r["peer_bytes_per_rank_layer"].get<double>() / 1e6),
                               fmt::format("{:.0f}", r["achieved_peer_gbps"].get<double>()), fmt::format("{:.2f}", r["ratio_to_ideal"].get<double>()),
                               fmt::format("{:.1f}", r["model_us_per_layer"].get<double>()), fmt::format("{:+.0f}%", 100.0 * r["model_error"].get<double>()),
                               r["byte_exact"].get<bool>() ? "yes" : "NO"});
    md += table_line(cells);
  }
  return md;
}

std::string ceilings_lines(const model::MeasuredCeilings& ceilings) {
  std::vector<std::string> parts;
#define CPKV_CEILING_PART(name, fold, label, unit, decimals) parts.push_back(fmt::format("{} {:.{}f} {}", label, ceilings.name, decimals, unit));
  CPKV_BENCH_CEILING_SCALARS(CPKV_CEILING_PART)
#undef CPKV_CEILING_PART
  std::string md = fmt::format("\nCeilings (same run, worst rank): {}, NCCL all-reduce {:.1f} us at 4 KiB (per call as CUDA graph nodes); in the layers "
                               "the barrier is folded into the compose launch.\n",
                               fmt::join(parts, ", "), ceilings.allreduce_latency_us);
  if (!ceilings.allreduce_curve.empty()) {
    std::vector<std::string> points;
    for (const auto& point : ceilings.allreduce_curve) points.push_back(fmt::format("{} KiB {:.1f} us", static_cast<std::uint64_t>(point.first) >> 10, point.second));
    md += fmt::format("NCCL all-reduce per call as CUDA graph nodes, by size (the model's curve): {}.\n", fmt::join(points, ", "));
  }
  return md;
}

std::string rate_and_share(double gbps, double ce) {
  return gbps == 0 ? "- | -" : gbps < 0 ? "WRONG | -" : fmt::format("{:.0f} | {:.2f}", gbps, gbps / ce);
}

std::string gather_table(const model::MeasuredCeilings& ceilings) {
  std::string md =
      "\nScattered pages pulled from the peer, every rank at once (GB/s and share of the copy-engine ceiling):\n\n"
      "| page bytes | pages | fused compose copy (warp per page) | of CE | gather (block per page) | of CE | copy engines, batched | of CE | "
      "bulk copy (TMA) | of CE | pushed instead (block per page, remote stores) | of CE |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& g : ceilings.gather) {
    const double ce = ceilings.ce_peer_gbps;
    md += fmt::format("| {} | {} | {:.0f} | {:.2f} | {:.0f} | {:.2f} | {:.0f} | {:.2f} | {} | {} |\n", g.page_bytes, g.pages, g.gbps, g.gbps / ce, g.block_gbps,
                      g.block_gbps / ce, g.ce_batch_gbps, g.ce_batch_gbps / ce, rate_and_share(g.bulk_gbps, ce), rate_and_share(g.push_gbps, ce));
  }
  return md;
}

}  // namespace

std::string bench_markdown(const nlohmann::json& rows, const model::MeasuredCeilings& ceilings, std::int32_t layer_count) {
  return legend(layer_count) + rows_table(rows) + ceilings_lines(ceilings) + gather_table(ceilings);
}

}  // namespace cpkv::cuda

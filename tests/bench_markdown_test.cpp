// `cpkv bench --markdown` rendered from a hand-made result (no GPU): the columns come from
// gpu/bench_timings.hpp's kTimingTable (a timing with a column gets its median, its spread where
// kept and its launches; every exchange has every column, '-' where it does not offer the part), the ceilings line from CPKV_BENCH_CEILING_SCALARS, a figure a variant
// does not have is "-", a wrong gather rate "WRONG". A table whose rows and header disagree in
// width renders as garbage on GitHub, so the cell counts are checked too.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_markdown.hpp"

namespace cpkv::cuda {
namespace {

// A row of the built-in plugin, which offers every bench part: every timing has its figure.
nlohmann::json staging_direct_row() {
  return {{"batch", 0}, {"variant", "staging_direct"}, {"byte_exact", true},
          {"with_fill_us_per_layer_median", 30.04}, {"with_fill_us_per_layer_min", 29.5}, {"with_fill_us_per_layer_max", 31.25},
          {"launches_per_layer_with_fill", 2.0}, {"compose_us_per_layer_median", 20.0}, {"compose_us_per_layer_min", 19.5},
          {"compose_us_per_layer_max", 21.0}, {"launches_per_layer_compose", 1.0}, {"fill_alone_us_per_layer_median", 9.5},
          {"pre_signal_alone_us_per_layer_median", nullptr}, {"plugin_compose_us_per_layer_median", 31.0}, {"plugin_compose_us_per_layer_min", 30.5},
          {"plugin_compose_us_per_layer_max", 32.0}, {"plugin_with_fill_us_per_layer_median", 30.04}, {"plugin_with_fill_us_per_layer_min", 29.5},
          {"plugin_with_fill_us_per_layer_max", 31.25}, {"launches_per_layer_plugin_with_fill", 2.0}, {"ms_per_batch_compose", 1.22},
          {"isolated_current_us", 12.0}, {"barrier_share_us", 3.0}, {"barrier_share_in_layer_us", 2.5}, {"peer_bytes_per_rank_layer", 5.0e6},
          {"achieved_peer_gbps", 250.0}, {"ratio_to_ideal", 1.25}, {"model_us_per_layer", 22.0}, {"model_error", 0.1}};
}

nlohmann::json v2_row() {
  nlohmann::json row = staging_direct_row();
  row["batch"] = 1;
  row["variant"] = "v2";
  row["byte_exact"] = false;
  row["pre_signal_alone_us_per_layer_median"] = 4.0;
  row["barrier_share_us"] = nullptr;
  row["barrier_share_in_layer_us"] = nullptr;
  row["model_error"] = -0.2;
  return row;
}

model::MeasuredCeilings ceilings() {
  model::MeasuredCeilings c;
  c.ce_peer_gbps = 400;
  c.ce_push_gbps = 300;
  c.local_copy_gbps = 2000;
  c.barrier_us = 5.25;
  c.barrier_us_graph = 3.5;
  c.barrier_us_launch_free = 2;
  c.allreduce_busbw_gbps = 360;
  c.allreduce_latency_us = 20;
  c.allreduce_curve = {{4096, 20.0}, {1 << 20, 31.5}};
  c.gather.push_back({.page_bytes = 65536, .pages = 64, .gbps = 200, .block_gbps = 100, .ce_batch_gbps = 300, .bulk_gbps = 0, .push_gbps = -1});
  return c;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::size_t cells(const std::string& line) { return static_cast<std::size_t>(std::count(line.begin(), line.end(), '|')) - 1; }

constexpr const char* kHeader =
    "| batch | variant | with fill us | with fill min-max | launches/layer (with fill) | compose us | compose min-max | "
    "launches/layer (compose) | fill alone us | pre-signal copies alone us | plugin compose us | plugin compose min-max | plugin with fill us | "
    "plugin with fill min-max | launches/layer (plugin with fill) | ms/batch | isolated current us (barrier's share) | "
    "barrier in the layer us | peer MB/rank/layer | GB/s | x ideal | model us | model error | exact |";

TEST(BenchMarkdown, TimingColumnsComeFromTheTimingTableAndDerivedFiguresFollow) {
  const std::vector<std::string> lines = lines_of(bench_markdown(nlohmann::json::array({staging_direct_row(), v2_row()}), ceilings(), 61));
  ASSERT_GE(lines.size(), 6u);
  EXPECT_EQ(lines[0].rfind("with fill = the layer including the producer step", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find("compose = the exchange alone"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("ms/batch = compose x 61 layers"), std::string::npos) << lines[0];
  EXPECT_EQ(lines[2], kHeader);
  EXPECT_EQ(lines[4], "| 0 | staging_direct | 30.0 | 29.5-31.2 | 2 | 20.0 | 19.5-21.0 | 1 | 9.5 | - | 31.0 | 30.5-32.0 | 30.0 | 29.5-31.2 | 2 | 1.22 | "
                      "12.0 (3.0) | 2.5 | 5.00 | 250 | 1.25 | 22.0 | +10% | yes |");
  EXPECT_EQ(lines[5], "| 1 | v2 | 30.0 | 29.5-31.2 | 2 | 20.0 | 19.5-21.0 | 1 | 9.5 | 4.0 | 31.0 | 30.5-32.0 | 30.0 | 29.5-31.2 | 2 | 1.22 | 12.0 | - | "
                      "5.00 | 250 | 1.25 | 22.0 | -20% | NO |");
  for (std::size_t i = 3; i <= 5; ++i) EXPECT_EQ(cells(lines[i]), cells(lines[2])) << lines[i];
}

// A plugin without the bench's parts (cpkv_exchange_parts) and not replayable: the same columns,
// every part and graph figure "-" (the report writes them null), and the figures derived from the
// parts (the isolated exchange, the barrier's shares) "-" too. Keys missing altogether (a report of
// an older cpkv) read as null.
TEST(BenchMarkdown, APluginWithoutTheBenchPartsHasTheSameColumnsWithDashes) {
  nlohmann::json row = {{"batch", 0}, {"variant", "staging_direct"}, {"byte_exact", true}, {"plugin_compose_us_per_layer_median", 41.25},
                        {"plugin_compose_us_per_layer_min", 40.0}, {"plugin_compose_us_per_layer_max", 44.5}, {"ms_per_batch_compose", 2.52},
                        {"with_fill_us_per_layer_median", nullptr}, {"with_fill_us_per_layer_min", nullptr}, {"with_fill_us_per_layer_max", nullptr},
                        {"launches_per_layer_with_fill", nullptr}, {"compose_us_per_layer_median", nullptr}, {"fill_alone_us_per_layer_median", nullptr},
                        {"isolated_current_us", nullptr}, {"barrier_share_us", nullptr}, {"barrier_share_in_layer_us", nullptr},
                        {"peer_bytes_per_rank_layer", 5.0e6}, {"achieved_peer_gbps", 121.2}, {"ratio_to_ideal", 2.5}, {"model_us_per_layer", 22.0},
                        {"model_error", -0.4667}};
  const std::vector<std::string> lines = lines_of(bench_markdown(nlohmann::json::array({row}), ceilings(), 61));
  ASSERT_GE(lines.size(), 5u);
  EXPECT_NE(lines[0].find("plugin compose = the exchange plugin's compose_layer, between CUDA events"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("a produce_rows plugin's producer, its fill, is inside it"), std::string::npos) << "where the fill is, said\n" << lines[0];
  EXPECT_EQ(lines[2], kHeader);
  EXPECT_EQ(lines[4], "| 0 | staging_direct | - | - | - | - | - | - | - | - | 41.2 | 40.0-44.5 | - | - | - | 2.52 | - | - | 5.00 | 121 | 2.50 | 22.0 | "
                      "-47% | yes |");
  EXPECT_EQ(cells(lines[4]), cells(lines[2]));
}

TEST(BenchMarkdown, CeilingsLineNamesEveryScalarWithItsUnitAndTheGatherSweepMarksWrongRates) {
  const std::string md = bench_markdown(nlohmann::json::array(), ceilings(), 4);
  EXPECT_NE(md.find("\nCeilings (same run, worst rank): copy-engine peer pull 400 GB/s, copy-engine push into the peer 300 GB/s, local copy 2000 GB/s, "
                    "barrier (launch included) 5.25 us, barrier launch-free (looped in one kernel) 2.00 us, barrier as CUDA graph nodes 3.50 us, "
                    "NCCL all-reduce bus bandwidth at 64 MiB 360 GB/s, NCCL all-reduce 20.0 us at 4 KiB"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("by size (the model's curve): 4 KiB 20.0 us, 1024 KiB 31.5 us.\n"), std::string::npos) << md;
  EXPECT_NE(md.find("| 65536 | 64 | 200 | 0.50 | 100 | 0.25 | 300 | 0.75 | - | - | WRONG | - |\n"), std::string::npos) << md;
}

}  // namespace
}  // namespace cpkv::cuda

// `cpkv bench --exchange` on the GPUs: an exchange plugin (examples/exchange_plain) timed through
// the cuda backend's bench entry, its bytes checked first. The report is the built-in bench's (the
// same JSON and markdown) with the plugin's compose_layer as its timing row ("plugin compose"),
// beside the ceilings measured in the same run and the cost model's prediction. Without a GPU every
// test skips.
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_run.hpp"
#include "cuda_backend.hpp"
#include "gpu_require.hpp"

namespace cpkv {
namespace {

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

TEST(GpuBenchPlugin, ThePlainPluginIsTimedAsThePluginComposeRowBesideTheCeilingsAndTheModel) {
  CPKV_REQUIRE_GPU();
  const std::filesystem::path json = test::temp_dir("cpkv_gpu_bench_plugin") / "bench.json";
  const test::CliRun run =
      test::run_cpkv(fmt::format("bench traces/samples/tiny.jsonl --exchange {} --cp 1 --reps 5 --json {}", CPKV_PLAIN_PLUGIN, json.string()));
  ASSERT_EQ(run.status, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("exchange: plugin 'plain'"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("| plugin compose us | plugin compose min-max |"), std::string::npos) << run.out;
  const nlohmann::json out = read_json(json);
  EXPECT_EQ(out["exchange"]["plugin"], "plain");
  EXPECT_FALSE(out.contains("time_sliced"));
  EXPECT_GT(out["ceilings"]["ce_peer_gbps"].get<double>(), 0.0);
  ASSERT_FALSE(out["rows"].empty()) << out.dump(2);
  for (const nlohmann::json& row : out["rows"]) {
    const double median = row["plugin_compose_us_per_layer_median"].get<double>();
    EXPECT_GT(median, 0.0) << row.dump();
    EXPECT_LE(row["plugin_compose_us_per_layer_min"].get<double>(), median) << row.dump();
    EXPECT_GE(row["plugin_compose_us_per_layer_max"].get<double>(), median) << row.dump();
    EXPECT_TRUE(row["byte_exact"].get<bool>()) << row.dump();
    EXPECT_GT(row["model_us_per_layer"].get<double>(), 0.0) << row.dump();
    EXPECT_DOUBLE_EQ(row["ratio_to_ideal"].get<double>(), median / row["ideal_us_per_layer"].get<double>()) << row.dump();
    for (const char* part : {"compose_us_per_layer_median", "fill_alone_us_per_layer_median", "pre_signal_alone_us_per_layer_median", "with_fill_us_per_layer_median"}) {
      EXPECT_TRUE(row[part].is_null()) << "the plain plugin offers no bench parts (and is not replayable): " << part << " is '-'\n" << row.dump();
    }
    EXPECT_TRUE(row["isolated_current_us"].is_null()) << row.dump();
    EXPECT_TRUE(row["plugin_with_fill_us_per_layer_median"].is_null())
        << "the plain plugin keeps its barrier phase on the host and does not declare CPKV_FLAG_REPLAYABLE: no graph is replayed\n" << row.dump();
  }
  std::filesystem::remove_all(json.parent_path());
}

// The fused plugin's .so declares CPKV_FLAG_REPLAYABLE: its layers are also timed as a replayed
// CUDA graph ("plugin with fill"), byte-exact first, and its flag pads drain at teardown although
// the replays issued barriers its host never counted (the device's own count is the reference).
TEST(GpuBenchPlugin, AReplayablePluginIsAlsoTimedAsAReplayedGraph) {
  CPKV_REQUIRE_GPU();
  const std::filesystem::path json = test::temp_dir("cpkv_gpu_bench_fused") / "bench.json";
  const test::CliRun run = test::run_cpkv(
      fmt::format("bench traces/samples/seeds_batch.jsonl --exchange {} --variant staging_direct,v2 --cp 1 --reps 5 --json {}", CPKV_FUSED_PLUGIN, json.string()));
  ASSERT_EQ(run.status, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("| plugin with fill us |"), std::string::npos) << run.out;
  const nlohmann::json out = read_json(json);
  ASSERT_FALSE(out["rows"].empty()) << out.dump(2);
  for (const nlohmann::json& row : out["rows"]) {
    EXPECT_TRUE(row["byte_exact"].get<bool>()) << row.dump();
    ASSERT_TRUE(row["plugin_with_fill_us_per_layer_median"].is_number()) << row.dump();
    const double median = row["plugin_with_fill_us_per_layer_median"].get<double>();
    EXPECT_GT(median, 0.0) << row.dump();
    EXPECT_LE(row["plugin_with_fill_us_per_layer_min"].get<double>(), median) << row.dump();
    EXPECT_GE(row["launches_per_layer_plugin_with_fill"].get<double>(), 2.0) << "at least the producer and the compose launch per layer\n" << row.dump();
    EXPECT_GT(row["compose_us_per_layer_median"].get<double>(), 0.0) << "the .so offers the bench's parts too\n" << row.dump();
  }
  std::filesystem::remove_all(json.parent_path());
}

// No --exchange: the built-in plugin, timed through the plugin host like any plugin, with every
// bench part it offers (cpkv_exchange_parts): the layer with its fill (the same replayed graph as
// 'plugin with fill'), compose alone, fill alone, the isolated exchange and the barrier's shares.
TEST(GpuBenchPlugin, TheDefaultBenchTimesTheBuiltInPluginAndItsPartsThroughOnePath) {
  CPKV_REQUIRE_GPU();
  if (std::getenv("CPKV_EXCHANGE") != nullptr) GTEST_SKIP() << "CPKV_EXCHANGE is set: the bench's default is another exchange";
  const std::filesystem::path json = test::temp_dir("cpkv_gpu_bench_default") / "bench.json";
  const test::CliRun run = test::run_cpkv(fmt::format("bench traces/samples/tiny.jsonl --cp 1 --reps 5 --json {}", json.string()));
  ASSERT_EQ(run.status, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("exchange: plugin 'fused' (builtin, the default), ABI version 1, with the bench's parts"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("| with fill us |"), std::string::npos) << run.out;
  const nlohmann::json out = read_json(json);
  EXPECT_EQ(out["exchange"]["plugin"], "fused");
  EXPECT_TRUE(out["exchange"]["parts"].get<bool>()) << out["exchange"].dump();
  ASSERT_FALSE(out["rows"].empty()) << out.dump(2);
  for (const nlohmann::json& row : out["rows"]) {
    EXPECT_TRUE(row["byte_exact"].get<bool>()) << row.dump();
    EXPECT_FALSE(row.contains("abi_over_in_process_with_fill")) << "no in-process exchange to compare with\n" << row.dump();
    EXPECT_GT(row["with_fill_us_per_layer_median"].get<double>(), 0.0) << row.dump();
    EXPECT_DOUBLE_EQ(row["with_fill_us_per_layer_median"].get<double>(), row["plugin_with_fill_us_per_layer_median"].get<double>()) << row.dump();
    EXPECT_GT(row["compose_us_per_layer_median"].get<double>(), 0.0) << row.dump();
    EXPECT_GE(row["launches_per_layer_compose"].get<double>(), 1.0) << row.dump();
    EXPECT_TRUE(row["fill_alone_us_per_layer_median"].is_number()) << row.dump();
    EXPECT_TRUE(row["host_syncs_per_layer"].is_number()) << row.dump();
    if (row["variant"] == "staging_direct") {
      EXPECT_TRUE(row["isolated_current_us"].is_number()) << row.dump();
    }
  }
  std::filesystem::remove_all(json.parent_path());
}

// Ranks time-slicing one GPU are refused for timing unless --time-sliced asks for the path's byte
// check anyway, and then the report says its timings measure nothing.
TEST(GpuBenchPlugin, TimeSlicedRanksAreRefusedUnlessAskedForAndThenMarked) {
  CPKV_REQUIRE_GPU();
  const std::int32_t cp = cuda::gpu_count() + 1;
  if (cp > 8) GTEST_SKIP() << "every rank has its own GPU at the cap";
  const std::string args = fmt::format("bench traces/samples/tiny.jsonl --exchange {} --cp {} --reps 2", CPKV_PLAIN_PLUGIN, cp);
  test::expect_bad_input(test::run_cpkv(args), "would time-slice; benchmarks need one GPU per rank");
  const std::filesystem::path json = test::temp_dir("cpkv_gpu_bench_sliced") / "bench.json";
  const test::CliRun run = test::run_cpkv(args + " --time-sliced --json " + json.string());
  ASSERT_EQ(run.status, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("TIME-SLICED:"), std::string::npos) << run.out;
  const nlohmann::json out = read_json(json);
  EXPECT_TRUE(out["time_sliced"].get<bool>());
  for (const nlohmann::json& row : out["rows"]) EXPECT_TRUE(row["byte_exact"].get<bool>()) << row.dump();
  std::filesystem::remove_all(json.parent_path());
}

TEST(GpuBenchPlugin, APluginThatFailsIsNamedWithItsOwnText) {
  CPKV_REQUIRE_GPU();
  const test::CliRun run =
      test::run_cpkv(fmt::format("bench traces/samples/tiny.jsonl --exchange {} --variant staging_direct --cp 1 --reps 2", CPKV_STUB_PLUGIN));
  EXPECT_EQ(run.status, 1) << run.out << run.err;
  EXPECT_NE((run.out + run.err).find("exchange plugin 'stub' setup on rank"), std::string::npos) << run.out << run.err;
}

}  // namespace
}  // namespace cpkv

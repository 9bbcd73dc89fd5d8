// What the plugin host checks of a foreign exchange beyond its bytes (issue 35, items 1, 2 and 4),
// through the real binary and real shared objects (tests/plugins/misbehaving_exchange.cu: the plain
// example, whose bytes are right, plus one misbehaviour each): a write one byte past a dense buffer
// and one into a pool slab each fail with a located line; counters that lie are flagged beside the
// model's figure and the report says whose figure is whose; a device fault names the call whose
// work faulted with CUDA's text; the well-behaved one passes. Without a GPU every test skips.
#include <fstream>
#include <regex>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_run.hpp"
#include "gpu_require.hpp"

namespace cpkv {
namespace {

test::CliRun replay(const char* plugin, const std::string& trace, const std::string& args) {
  return test::run_cpkv(fmt::format("replay traces/samples/{} --backend cuda --exchange {} --variant staging_direct {}", trace, plugin, args));
}

bool found(const std::string& text, const std::string& pattern) { return std::regex_search(text, std::regex(pattern)); }

TEST(GpuGuard, AWellBehavedPluginPassesAndTheReportSaysWhoseCountersAreWhose) {
  CPKV_REQUIRE_GPU();
  for (const char* trace : {"tiny.jsonl", "seeds_batch.jsonl"}) {
    const test::fs::path json = test::temp_dir("gpu_guard") / fmt::format("none_{}.json", trace);
    const test::CliRun run = replay(CPKV_MISBEHAVING_none, trace, fmt::format("--layers 2 --json {}", json.string()));
    EXPECT_EQ(run.status, 0) << trace << "\n" << run.out << run.err;
    EXPECT_EQ((run.out + run.err).find("wrote outside its buffers"), std::string::npos) << run.out << run.err;
    EXPECT_NE(run.out.find("counters: peer_bytes and barriers are the plugin's own (ctx->counters)"), std::string::npos) << run.out;
    EXPECT_EQ(run.out.find("the plugin's differ"), std::string::npos) << "the plain plugin counts nothing (0): not flagged\n" << run.out;
    std::ifstream in(json);
    ASSERT_TRUE(in) << json;
    const nlohmann::json report = nlohmann::json::parse(in);
    for (const nlohmann::json& rank : report.at("runs").at(0).at("ranks")) {
      EXPECT_EQ(rank.at("counted_by").at("bytes_gathered_from_peers"), "plugin") << rank;
      EXPECT_EQ(rank.at("counted_by").at("collectives"), "cpkv") << rank;
      EXPECT_EQ(rank.at("bytes_gathered_from_peers"), 0) << rank;
    }
  }
}

TEST(GpuGuard, AWriteOneBytePastADenseBufferFailsWithALocatedLine) {
  CPKV_REQUIRE_GPU();
  const test::CliRun run = replay(CPKV_MISBEHAVING_past_dense, "tiny.jsonl", "--layers 2");
  EXPECT_EQ(run.status, 1) << run.out << run.err;
  // Every byte it was asked for is right: the guard alone sees it, on the first layer it ran.
  EXPECT_TRUE(found(run.out, "rank [0-9] batch 0 layer 0: wrote outside its buffers: 1 byte\\(s\\) of the guard past rank [0-9]'s dense buffer of [a-z_0-9]+ half 0 "
                             "changed, the first at byte 0 past its end \\(0x00, the poison 0xc3\\)"))
      << run.out << run.err;
  EXPECT_EQ(run.out.find("mismatch: rank"), std::string::npos) << "its bytes are right\n" << run.out;
}

TEST(GpuGuard, AWriteIntoAPoolSlabFailsWithALocatedLine) {
  CPKV_REQUIRE_GPU();
  const test::CliRun run = replay(CPKV_MISBEHAVING_pool, "tiny.jsonl", "--layers 2");
  EXPECT_EQ(run.status, 1) << run.out << run.err;
  EXPECT_TRUE(found(run.out, "rank ([0-9]) batch 0: wrote outside its buffers: rank \\1's pool slab of [a-z_0-9]+ changed on layer [01] \\(local page [0-9]+, "
                             "logical page [0-9]+; [0-9]+ page\\(s\\) changed"))
      << run.out << run.err;
}

TEST(GpuGuard, CountersThatLieAreFlaggedBesideTheModelsFigure) {
  CPKV_REQUIRE_GPU();
  const test::fs::path json = test::temp_dir("gpu_guard") / "counters.json";
  const test::CliRun run = replay(CPKV_MISBEHAVING_counters, "tiny.jsonl", fmt::format("--layers 2 --json {}", json.string()));
  EXPECT_EQ(run.status, 1) << run.out << run.err;
  // It says 1 byte per layer; staging_direct at cp 2 gathers whole pages from the peer.
  EXPECT_TRUE(found(run.out, "rank [0-9] batch 0: counters: exchange plugin 'lying_counters' reported 2 bytes gathered from peers \\(ctx->counters\\), the "
                             "model's staging_direct moves [1-9][0-9]* in the batch's 2 layer\\(s\\)"))
      << run.out << run.err;
  EXPECT_NE(run.out.find("the plugin's differ on rank(s)"), std::string::npos) << run.out;
  std::ifstream in(json);
  ASSERT_TRUE(in) << json;
  const nlohmann::json rank0 = nlohmann::json::parse(in).at("runs").at(0).at("ranks").at(0);
  EXPECT_EQ(rank0.at("counted_by").at("model_bytes_gathered_from_peers"), "model") << rank0;
  EXPECT_GT(rank0.at("model_bytes_gathered_from_peers").get<std::uint64_t>(), 2U) << rank0;
}

TEST(GpuGuard, ADeviceFaultInAPluginsWorkNamesTheCallTheRankBatchAndLayer) {
  CPKV_REQUIRE_GPU();
  const test::CliRun run = replay(CPKV_MISBEHAVING_fault, "tiny.jsonl", "--layers 2");
  EXPECT_EQ(run.status, 1) << run.out << run.err;
  EXPECT_TRUE(found(run.out, "exchange plugin 'faulting' compose_layer on rank [0-9] batch 0 layer 1: a device fault in the work it enqueued: CUDA: an illegal "
                             "memory access was encountered"))
      << run.out << run.err;
  EXPECT_EQ((run.out + run.err).find("cudaStreamSynchronize(stream) failed"), std::string::npos) << "not the raw abort\n" << run.out << run.err;
}

}  // namespace
}  // namespace cpkv

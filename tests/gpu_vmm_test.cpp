// The sparse pool on a GPU (gpu/vmm.cpp, gpu/pool_backing.cpp): a trace with the production pool
// (65,536 pages, 61 layers) replays at cp 2 on one GPU with every dense byte verified, where the
// whole pool (about 94 GiB a rank) would not fit; a run that cannot fit is refused before anything
// is allocated, with the need-beside-free line on stdout and one line on stderr, exit 2.
#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cli_run.hpp"
#include "gpu_require.hpp"

namespace cpkv {
namespace {

namespace fs = std::filesystem;

// cpkv with `args` on GPU 0 alone (CUDA_VISIBLE_DEVICES=0: cp 2 and 4 oversubscribe it).
test::CliRun cpkv_on_one_gpu(const std::vector<std::string>& args, std::vector<std::string> env = {}) {
  static std::atomic<int> runs{0};
  std::vector<std::string> argv = {test::cpkv_binary().string()};
  argv.insert(argv.end(), args.begin(), args.end());
  env.push_back("CUDA_VISIBLE_DEVICES=0");
  const fs::path dir = test::temp_dir("gpu_vmm") / fmt::format("run{}", runs++);
  const test::CliRun run = test::spawn(argv, dir, test::RunSetup{{}, env, {}, {}});
  fs::remove_all(dir);
  return run;
}

// Batches 1784 and 1785 of the Mooncake sample's default import (traces/samples/mooncake_slice.jsonl
// at cp 8), imported at `cp`: the production pool, its prefix pages recycled and scattered.
std::string production_trace(std::int32_t cp) {
  const fs::path path = test::temp_dir("gpu_vmm") / fmt::format("mooncake-cp{}.jsonl", cp);
  if (fs::exists(path)) return path.string();
  const test::CliRun run = cpkv_on_one_gpu({"import", "mooncake", "traces/data/mooncake/synthetic_trace.jsonl", "-o", path.string(), "--cp",
                                            std::to_string(cp), "--skip-batches", "1784", "--max-batches", "2"});
  EXPECT_EQ(run.status, 0) << run.err;
  return path.string();
}

std::vector<std::string> replay_all(const std::string& trace) { return {"replay", trace, "--backend", "cuda", "--variant", "all", "--layers", "all"}; }

TEST(GpuVmm, TheProductionPoolReplaysAtCpTwoOnOneGpuByteExact) {
  CPKV_REQUIRE_GPU();
  const test::CliRun run = cpkv_on_one_gpu(replay_all(production_trace(2)));
  EXPECT_EQ(run.status, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("gpu memory (sparse pool): GPU 0 (ranks 0 1) needs "), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("of 187.77 GiB reserved"), std::string::npos) << "the whole pool of both ranks is reserved: " << run.out;
  EXPECT_EQ(run.out.find("FAIL"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("pass"), std::string::npos) << run.out;
}

TEST(GpuVmm, TheProductionPoolAtCpFourOnOneGpuIsByteExact) {
  CPKV_REQUIRE_GPU();
  const test::CliRun run = cpkv_on_one_gpu({"replay", production_trace(4), "--backend", "cuda", "--variant", "staging_direct,v2", "--layers", "all"});
  EXPECT_EQ(run.status, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("GPU 0 (ranks 0 1 2 3) needs "), std::string::npos) << run.out;
  EXPECT_EQ(run.out.find("FAIL"), std::string::npos) << run.out;
}

// The whole pool allocated per rank (the cudaMalloc path of before) does not fit two ranks on one
// H200: refused up front, nothing allocated, no rank started.
TEST(GpuVmm, TheDensePoolOfTwoRanksOnOneGpuIsRefusedUpFront) {
  CPKV_REQUIRE_GPU();
  const test::CliRun run = cpkv_on_one_gpu(replay_all(production_trace(2)), {"CPKV_POOL_MEMORY=dense"});
  EXPECT_EQ(run.status, 2) << run.out << run.err;
  EXPECT_TRUE(test::one_line(run.err)) << run.err;
  EXPECT_NE(run.err.find("cuda: the run does not fit: GPU 0 (ranks 0 1) needs 189."), std::string::npos) << run.err;
  EXPECT_NE(run.out.find("gpu memory (dense pool): GPU 0 (ranks 0 1)"), std::string::npos) << run.out;
  EXPECT_EQ(run.out.find("pass"), std::string::npos) << "no variant ran: " << run.out;
}

// A sparse pool that still does not fit: a prefix that reads every 41st page of a 262,144-page pool
// touches every chunk of every slab (a 2-MiB kv chunk holds 49 pages), about 400 GB a rank.
TEST(GpuVmm, ASparsePoolThatCannotFitIsRefusedWithTheNeedBesideTheFree) {
  CPKV_REQUIRE_GPU();
  std::string pages;
  std::int64_t count = 0;
  for (std::int64_t g = 0; g < 262144; g += 41, ++count) pages += fmt::format("{}{}", count == 0 ? "" : ",", g);
  const std::string trace = test::write_temp("gpu_vmm", "every-chunk.jsonl",
      fmt::format("{{\"format\":\"cpkv-batch-trace\",\"version\":1,\"cp\":2,\"page_size\":64,\"buffer_kinds\":[\"kv_fp8\",\"indexer_k\"],"
                  "\"layers\":{{\"count\":61,\"pattern\":\"{}\"}},\"pool_pages\":262144,"
                  "\"caps\":{{\"max_total_extend_tokens\":64,\"max_batch_requests\":1,\"staging_mib\":null}}}}\n"
                  "{{\"batch\":0,\"requests\":[{{\"prefix_len\":{},\"extend_len\":1,\"prefix_pages\":[{}]}}]}}\n",
                  std::string(61, 'F'), count * 64, pages));
  const test::CliRun run = cpkv_on_one_gpu({"replay", trace, "--backend", "cuda", "--variant", "staging_direct", "--layers", "all"});
  EXPECT_EQ(run.status, 2) << run.out << run.err;
  EXPECT_TRUE(test::one_line(run.err)) << run.err;
  EXPECT_NE(run.err.find("cuda: the run does not fit: GPU 0 (ranks 0 1) needs "), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("GiB free"), std::string::npos) << run.err;
  EXPECT_NE(run.out.find("gpu memory (sparse pool): GPU 0 (ranks 0 1)"), std::string::npos) << run.out;
}

}  // namespace
}  // namespace cpkv

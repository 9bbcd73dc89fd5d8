// An engine team's exchange as a plugin (include/cpkv/exchange_abi.h) under cpkv's harness on the
// GPUs: examples/exchange_plain (staging_direct in three plain kernels) through the real binary.
// It must pass every bundled trace (ranks oversubscribed where the GPUs are fewer), also under the
// rotating slow rank; each planted bug of the harness (a stale page inverse, a plan reused across
// batches, rows with unzeroed tails) must fail it with a located mismatch and a replay line that
// reproduces it; a plugin that fails is named with its own text. Without a GPU every test skips.
#include <gtest/gtest.h>

#include "cli_run.hpp"
#include "cuda_backend.hpp"
#include "gpu_require.hpp"

namespace cpkv {
namespace {

test::CliRun replay(const std::string& trace, const std::string& args) {
  return test::run_cpkv(fmt::format("replay traces/samples/{} --backend cuda --exchange {} {}", trace, CPKV_PLAIN_PLUGIN, args));
}

TEST(GpuPlugin, ThePlainExamplePassesEveryBundledTrace) {
  CPKV_REQUIRE_GPU();
  for (const char* args : {"--layers 2", "--layers 2 --swarm --seed 5"}) {
    const test::CliRun run = replay("tiny.jsonl", args);
    EXPECT_EQ(run.status, 0) << args << "\n" << run.out << run.err;
    EXPECT_NE(run.out.find("exchange: plugin 'plain'"), std::string::npos) << run.out;
  }
  const test::CliRun seeds = replay("seeds_batch.jsonl", "--layers 3");  // cp 8
  EXPECT_EQ(seeds.status, 0) << seeds.out << seeds.err;
  const test::CliRun mooncake = replay("mooncake_slice.jsonl", "--layers 2");
  EXPECT_EQ(mooncake.status, 0) << mooncake.out << mooncake.err;
}

TEST(GpuPlugin, EveryHarnessPlantedBugFailsThePlainExampleAndItsReplayLineReproducesIt) {
  CPKV_REQUIRE_GPU();
  for (harness::Mutant mutant : harness::kHarnessMutants) {
    const std::string name(harness::to_string(mutant));
    // mooncake_slice: many batches of different shapes, so a first batch's plan or inverse is stale later.
    const test::CliRun run = replay("mooncake_slice.jsonl", "--layers 2 --mutant " + name);
    EXPECT_EQ(run.status, 1) << name << "\n" << run.out << run.err;
    EXPECT_NE(run.out.find("mismatch: rank"), std::string::npos) << name << ": a located wrong byte\n" << run.out;
    const std::size_t at = run.out.find("replay: cpkv replay ");
    ASSERT_NE(at, std::string::npos) << run.out;
    const std::size_t from = at + std::string("replay: cpkv ").size();  // run_cpkv names the binary itself
    const std::string line = run.out.substr(from, run.out.find('\n', at) - from);
    EXPECT_NE(line.find("--mutant " + name), std::string::npos) << line;
    const test::CliRun again = test::run_cpkv(line);
    EXPECT_EQ(again.status, 1) << "the printed line reproduces the failure: " << line << "\n" << again.out << again.err;
  }
}

TEST(GpuPlugin, APluginThatFailsIsNamedWithItsOwnTextAndNothingIsLeftRunning) {
  CPKV_REQUIRE_GPU();
  const test::CliRun run = test::run_cpkv(fmt::format("replay traces/samples/tiny.jsonl --backend cuda --exchange {} --variant staging_direct", CPKV_STUB_PLUGIN));
  EXPECT_EQ(run.status, 1) << run.out << run.err;
  EXPECT_NE((run.out + run.err).find("exchange plugin 'stub' setup on rank"), std::string::npos) << run.out << run.err;
  EXPECT_NE((run.out + run.err).find("refuses to set up (a test plugin)"), std::string::npos) << run.out << run.err;
}

}  // namespace
}  // namespace cpkv

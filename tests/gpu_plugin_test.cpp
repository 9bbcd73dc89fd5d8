// Exchange plugins (include/cpkv/exchange_abi.h) under cpkv's harness on the GPUs, through the real
// binary: examples/exchange_plain (staging_direct in three plain kernels) and cpkv's own fused
// compose (gpu/fused/), as libcpkv_exchange_fused.so and as the built-in table (`--exchange builtin`).
// Each must pass every bundled trace in every variant it implements (ranks oversubscribed where the
// GPUs are fewer), also under the rotating slow rank; each planted bug of the harness that reaches
// what it reads must fail it with a located mismatch and a replay line that reproduces it; the fused
// plugin's own planted bugs (the GPU's four) must be caught by `cpkv mutants --backend cuda
// --exchange`; a plugin that fails is named with its own text. Without a GPU every test skips.
#include <fstream>
#include <regex>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_run.hpp"
#include "cuda_backend.hpp"
#include "gpu_require.hpp"

namespace cpkv {
namespace {

struct PluginCase {
  const char* label;     // the test's name
  const char* exchange;  // what --exchange names
};
void PrintTo(const PluginCase& c, std::ostream* os) { *os << c.label << " (--exchange " << c.exchange << ")"; }
const PluginCase kPlugins[] = {{"plain", CPKV_PLAIN_PLUGIN}, {"fused_so", CPKV_FUSED_PLUGIN}, {"builtin", "builtin"}};

class GpuPlugin : public testing::TestWithParam<PluginCase> {
 public:
  // The plugin as the harness sees it (the built-in one once the cuda backend registered it).
  std::shared_ptr<const harness::ExchangePlugin> plugin() const {
    harness::Registry registry;
    cuda::register_backend(registry);
    return harness::find_exchange(GetParam().exchange);
  }
  test::CliRun replay(const std::string& trace, const std::string& args) const {
    return test::run_cpkv(fmt::format("replay traces/samples/{} --backend cuda --exchange {} {}", trace, GetParam().exchange, args));
  }
};

// One replay of every variant the plugin implements: exit 0, and its --json has one passing run per
// variant, in the plugin's own list, with no mismatch.
void expect_every_variant_passes(const GpuPlugin& t, const harness::ExchangePlugin& plugin, const std::string& trace, const std::string& args) {
  const test::fs::path json = test::temp_dir("gpu_plugin") / fmt::format("{}_{}.json", plugin.name, trace);
  const test::CliRun run = t.replay(trace, fmt::format("--variant all --json {} {}", json.string(), args));
  EXPECT_EQ(run.status, 0) << trace << " " << args << "\n" << run.out << run.err;
  EXPECT_NE(run.out.find(fmt::format("exchange: plugin '{}'", plugin.name)), std::string::npos) << run.out;
  std::ifstream in(json);
  ASSERT_TRUE(in) << "no --json written: " << json;
  const nlohmann::json report = nlohmann::json::parse(in);
  std::vector<std::string> ran, expected;
  for (const nlohmann::json& r : report.at("runs")) {
    ran.push_back(r.at("variant").get<std::string>());
    EXPECT_TRUE(r.at("passed").get<bool>()) << trace << " " << r.at("variant") << ": " << r.at("failure");
    EXPECT_EQ(r.at("mismatches").get<std::int64_t>(), 0) << trace << " " << r.at("variant");
  }
  for (model::Variant v : plugin.variants) expected.emplace_back(model::to_string(v));
  EXPECT_EQ(ran, expected) << trace << ": every variant the plugin implements ran";
}

TEST_P(GpuPlugin, PassesEveryBundledTraceInEveryVariantItImplements) {
  CPKV_REQUIRE_GPU();
  const auto p = plugin();
  expect_every_variant_passes(*this, *p, "tiny.jsonl", "--layers 2");
  expect_every_variant_passes(*this, *p, "tiny.jsonl", "--layers 2 --swarm --seed 5");
  expect_every_variant_passes(*this, *p, "seeds_batch.jsonl", "--layers 3");  // cp 8
  expect_every_variant_passes(*this, *p, "mooncake_slice.jsonl", "--layers 2");
}

TEST_P(GpuPlugin, EveryHarnessPlantedBugThatReachesItFailsItAndItsReplayLineReproducesIt) {
  CPKV_REQUIRE_GPU();
  const auto p = plugin();
  int reaching = 0;
  for (harness::Mutant mutant : harness::kHarnessMutants) {
    if ((p->uses & harness::input_corrupted_by(mutant)) == 0) continue;
    ++reaching;
    const std::string name(harness::to_string(mutant));
    // mooncake_slice: many batches of different shapes, so a first batch's plan or inverse is stale later.
    const test::CliRun run = replay("mooncake_slice.jsonl", "--layers 2 --variant staging_direct --mutant " + name);
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
  EXPECT_GT(reaching, 0) << p->name << " reads at least the rows, which unzeroed_rows corrupts";
}

INSTANTIATE_TEST_SUITE_P(Plugins, GpuPlugin, testing::ValuesIn(kPlugins), [](const testing::TestParamInfo<PluginCase>& info) { return info.param.label; });

// `cpkv mutants --backend cuda --exchange` over the fused plugin: the correct protocol passes at cp
// 2, 4 and 8, and each planted bug it holds (the GPU's four) and the harness's that reach it
// (unzeroed_rows) is caught at each cp.
TEST(GpuFusedPlugin, CpkvMutantsCatchesTheGpuPlantedBugsAndTheHarnessOnesThatReachIt) {
  CPKV_REQUIRE_GPU();
  const test::CliRun run = test::run_cpkv(fmt::format("mutants --backend cuda --exchange {}", CPKV_FUSED_PLUGIN));
  EXPECT_EQ(run.status, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("exchange plugin 'fused'"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("verify self-test: passes"), std::string::npos) << run.out;
  std::vector<std::string> expected = {"none"};
  for (harness::Mutant m : harness::kGpuMutants) expected.emplace_back(harness::to_string(m));
  expected.emplace_back(harness::to_string(harness::Mutant::unzeroed_rows));
  for (const std::string& name : expected) {
    for (int cp : {2, 4, 8}) {
      const std::regex row(fmt::format("(^|\n){} +{} +[0-9]+  {}", name, cp, name == "none" ? "passes" : "yes"));
      EXPECT_TRUE(std::regex_search(run.out, row)) << name << " at cp " << cp << " is " << (name == "none" ? "clean" : "caught") << "\n" << run.out;
    }
  }
  // Invariant 9's three, in the attention plan it returns: caught by the plugin host's check of the
  // plan, located by the checker's line (the bytes are right).
  for (const char* name : {"batch_as_one_sequence", "causal_off_by_one", "key_base_skips_prefix"}) {
    for (int cp : {2, 4, 8}) {
      const std::regex row(fmt::format("(^|\n){} +{} +[0-9]+  yes +invariant 9 \\(attention plan exactness\\): rank [0-9]+ batch [0-9]+: segment", name, cp));
      EXPECT_TRUE(std::regex_search(run.out, row)) << name << " at cp " << cp << " is caught as invariant 9\n" << run.out;
    }
  }
}

// A plugin's own planted bug under a name of cpkv's that only the simulator holds in cpkv
// (address_keyed_plan_cache, the plain example's) is run to the end of the table and caught; the
// harness's bugs of inputs it reads are caught, except unzeroed_rows for the build that zeroes its
// own tails: that one does not depend on cpkv's zeroed tails, is "robust", and the run passes.
TEST(GpuPluginMutants, APluginsOwnBugsAreCaughtToTheEndOfTheTableAndAnInputItDoesNotNeedIsRobust) {
  CPKV_REQUIRE_GPU();
  const test::CliRun run = test::run_cpkv(fmt::format("mutants --backend cuda --exchange {}", CPKV_PLAIN_ZERO_TAILS_PLUGIN));
  EXPECT_EQ(run.status, 0) << run.out << run.err;
  for (int cp : {2, 4, 8}) {
    for (const auto& [name, verdict] : {std::pair{"none", "passes"}, std::pair{"address_keyed_plan_cache", "yes"}, std::pair{"stale_page_inverse", "yes"},
                                         std::pair{"reused_plan", "yes"}, std::pair{"unzeroed_rows", "robust"}}) {
      const std::regex row(fmt::format("(^|\n){} +{} +[0-9]+  {} ", name, cp, verdict));
      EXPECT_TRUE(std::regex_search(run.out, row)) << name << " at cp " << cp << ": " << verdict << "\n" << run.out;
    }
  }
}

// The byte check of layer 0 through the plugin host: a plugin that composes nothing leaves cpkv's
// poison in every dense buffer, and the first wrong byte reported is layer 0's.
TEST(GpuPluginStub, AWrongByteOfLayer0IsReportedAtLayer0) {
  CPKV_REQUIRE_GPU();
  const test::CliRun run = test::run_cpkv(fmt::format("replay traces/samples/tiny.jsonl --backend cuda --layers 2 --variant staging_direct --exchange {}", CPKV_STUB_noop));
  EXPECT_EQ(run.status, 1) << run.out << run.err;
  EXPECT_TRUE(std::regex_search(run.out, std::regex("mismatch: rank [0-9]+ batch 0 layer 0 "))) << run.out;
}

// A plugin that refuses every batch on rank 1 only: the ranks' verdicts differ (invariant 3), which
// is reported at once, and no rank runs the batch's layers (so nothing waits for the refusing rank,
// and no wrong byte of a layer that should not have run is reported).
TEST(GpuPluginStub, APluginRefusingOnOneRankIsInvariant3AtOnce) {
  CPKV_REQUIRE_GPU();
  const test::CliRun run = test::run_cpkv(fmt::format("replay traces/samples/tiny.jsonl --backend cuda --layers 2 --variant staging_direct --exchange {}", CPKV_STUB_refuse1));
  EXPECT_EQ(run.status, 1) << run.out << run.err;
  EXPECT_NE(run.out.find("invariant 3 (overflow determinism): rank 0 batch 0"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("ranks disagree on the batch's overflow verdict (rank 0 accepted, rank 1 refused)"), std::string::npos) << run.out;
  EXPECT_EQ(run.out.find("mismatch: rank"), std::string::npos) << "no layer ran\n" << run.out;
  EXPECT_EQ((run.out + run.err).find("invariant 8"), std::string::npos) << "not a liveness finding\n" << run.out << run.err;
}

// A process exit inside a plugin call, status 0 included, is a failure naming the call: exit()
// (the exit handler names it), and _exit(), which runs no handler (the launching process names it).
TEST(GpuPluginStub, AnExitInsideAPluginCallIsAFailureNamingTheCall) {
  CPKV_REQUIRE_GPU();
  const std::string replay = "replay traces/samples/tiny.jsonl --backend cuda --layers 2 --variant staging_direct --exchange ";
  const test::CliRun exits = test::run_cpkv(replay + CPKV_STUB_exitcompose);
  EXPECT_EQ(exits.status, 1) << exits.out << exits.err;
  EXPECT_NE((exits.out + exits.err).find("exchange plugin 'stub' compose_layer on rank"), std::string::npos) << exits.out << exits.err;
  EXPECT_NE((exits.out + exits.err).find("batch 0 layer 0 ended the process (exit inside the call)"), std::string::npos) << exits.out << exits.err;
  const test::CliRun bare = test::run_cpkv(replay + CPKV_STUB_underscoreexit);
  EXPECT_EQ(bare.status, 1) << bare.out << bare.err;
  EXPECT_NE(bare.out.find("ended inside exchange plugin 'stub' begin_batch on rank"), std::string::npos) << bare.out << bare.err;
}

TEST(GpuPluginStub, APluginThatFailsIsNamedWithItsOwnTextAndNothingIsLeftRunning) {
  CPKV_REQUIRE_GPU();
  const test::CliRun run = test::run_cpkv(fmt::format("replay traces/samples/tiny.jsonl --backend cuda --exchange {} --variant staging_direct", CPKV_STUB_PLUGIN));
  EXPECT_EQ(run.status, 1) << run.out << run.err;
  EXPECT_NE((run.out + run.err).find("exchange plugin 'stub' setup on rank"), std::string::npos) << run.out << run.err;
  EXPECT_NE((run.out + run.err).find("refuses to set up (a test plugin)"), std::string::npos) << run.out << run.err;
}

// A plugin that declares CPKV_FLAG_ATTENTION_PLAN must return its plan: none, or a pointer cpkv
// cannot read, is invariant 9, named, and the rank lives on to report it (cpkv copies the plan
// without trusting the pointer).
TEST(GpuPluginStub, APluginThatDeclaresAnAttentionPlanAndReturnsNoneOrAWildOneIsInvariant9) {
  CPKV_REQUIRE_GPU();
  const std::string replay = "replay traces/samples/tiny.jsonl --backend cuda --layers 1 --variant staging_direct --exchange ";
  const test::CliRun none = test::run_cpkv(replay + CPKV_STUB_attnone);
  EXPECT_EQ(none.status, 1) << none.out << none.err;
  EXPECT_NE(none.out.find("invariant 9 (attention plan exactness): rank 0 batch 0: the plugin declares CPKV_FLAG_ATTENTION_PLAN but returned no attention plan"),
            std::string::npos) << none.out;
  const test::CliRun wild = test::run_cpkv(replay + CPKV_STUB_attwild);
  EXPECT_EQ(wild.status, 1) << wild.out << wild.err;
  EXPECT_NE(wild.out.find("ctx->attention_segments (3 segments at 0x10) is not memory this process can read"), std::string::npos) << wild.out;
  EXPECT_EQ((wild.out + wild.err).find("died from"), std::string::npos) << "no rank crashed\n" << wild.out << wild.err;
}

}  // namespace
}  // namespace cpkv

// The run's resolved configuration (harness/request.hpp: kKnobTable): every knob the environment
// may set is read by the request check alone, printed in the run header's knobs line with what chose
// it, and written into the replay line as a flag, so the reproducer replays the same run whatever the
// next shell sets. The knobs are the GPU backend's and the torch backend's (its conformance harness's
// import bound and cpkv binary); the request check runs without a GPU or torch, so these tests check
// it here through the real cuda and torch entries, and the real binary where a GPU is visible.
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cli_run.hpp"
#include "cpkv/backends/register_all.hpp"
#include "cpkv/harness/request.hpp"
#include "cpkv/sim/backend.hpp"
#include "cuda_backend.hpp"

namespace cpkv {
namespace {

// One knob as a user sets it: the variable, the flag, and a value that is not the default.
struct KnobCase {
  const char* environment;
  const char* flag;
  const char* value;
  const char* backend = "cuda";
};
// Values from the options' meanings (docs: the README's knobs), none of them a default.
const KnobCase kCases[] = {
    {"CPKV_EXCHANGE", "--exchange", CPKV_FUSED_PLUGIN},  // a plugin's path ("inprocess" is gone and refused)
    {"CPKV_EXCHANGE_LOAD_MS", "--exchange-load-ms-max", "2500"},
    {"CPKV_POOL_MEMORY", "--pool-memory", "dense"},
    {"CPKV_COMPOSE_BLOCKS_PER_SM", "--compose-blocks-per-sm", "2"},
    {"CPKV_IMPORT_S_MAX", "--import-s-max", "90", "torch"},
    {"CPKV_BIN", "--cpkv-bin", "/opt/cpkv/bin/cpkv", "torch"},
};

class RequestKnobs : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const harness::KnobInfo& k : harness::kKnobTable) ::unsetenv(k.environment);  // the shell's choices are not this test's
    sim::register_backends(registry);
    cuda::register_backend(registry);
    backends::register_torch_backend(registry);
  }
  void TearDown() override {
    for (const harness::KnobInfo& k : harness::kKnobTable) ::unsetenv(k.environment);
  }
  static harness::ReplayRequest cuda_request() {
    harness::ReplayRequest r;
    r.trace_label = "traces/samples/tiny.jsonl";
    r.backend = "cuda";
    r.variant = "staging_direct";
    return r;
  }
  // The backend's request: the torch backend's names its class and runs no named variant.
  static harness::ReplayRequest request_of(std::string_view backend) {
    harness::ReplayRequest r = cuda_request();
    if (backend == "torch") {
      r.backend = "torch";
      r.variant = "all";
      r.impl = "cpkv.conformance.reference:StagingDirect";
    }
    return r;
  }
  // The replay line's flags set on a request, as the CLI parses them (every knob's flag takes one value).
  static harness::ReplayRequest from_line(const std::string& line, std::string_view backend) {
    harness::ReplayRequest r = request_of(backend);
    std::istringstream words(line);
    std::string word, value;
    while (words >> word) {
      if (word.rfind("--", 0) != 0 || !(words >> value)) continue;
      if (word == "--exchange") r.exchange = value;
      if (word == "--exchange-load-ms-max") r.exchange_load_ms_max = std::stoll(value);
      if (word == "--pool-memory") r.pool_memory = value;
      if (word == "--compose-blocks-per-sm") r.compose_blocks_per_sm = std::stoi(value);
      if (word == "--import-s-max") r.import_s_max = std::stod(value);
      if (word == "--cpkv-bin") r.cpkv_bin = value;
    }
    return r;
  }
  harness::Registry registry;
};

// The table and the cases name the same knobs: a knob added to one and not the other fails here.
TEST_F(RequestKnobs, EveryKnobOfTheTableIsCoveredHere) {
  ASSERT_EQ(std::size(harness::kKnobTable), std::size(kCases));
  for (std::size_t i = 0; i < std::size(kCases); ++i) EXPECT_STREQ(harness::kKnobTable[i].environment, kCases[i].environment);
}

// Set by the environment: the header's knobs line names the value and the variable, the replay
// line carries the flag, and that line, replayed with the variable unset, resolves the same value
// (now from the flag).
TEST_F(RequestKnobs, AnEnvironmentKnobReachesTheHeaderAndTheReplayLineAndReplaysWithoutIt) {
  for (const KnobCase& k : kCases) {
    SCOPED_TRACE(k.environment);
    ::setenv(k.environment, k.value, 1);
    const harness::CheckedRequest c = harness::check_request(request_of(k.backend), registry);
    ::unsetenv(k.environment);
    const std::string header = harness::knobs_line(c);
    EXPECT_NE(header.find(fmt::format("{} {} ({})", k.flag, k.value, k.environment)), std::string::npos) << header;
    const std::string line = harness::replay_line(c, model::Variant::staging_direct, 2);
    EXPECT_NE(line.find(fmt::format(" {} {}", k.flag, k.value)), std::string::npos) << line;
    const harness::CheckedRequest replayed = harness::check_request(from_line(line, k.backend), registry);
    EXPECT_NE(harness::knobs_line(replayed).find(fmt::format("{} {} ({})", k.flag, k.value, k.flag)), std::string::npos) << harness::knobs_line(replayed);
    EXPECT_EQ(harness::replay_line(replayed, model::Variant::staging_direct, 2), line) << "the replayed line reproduces itself";
  }
}

// Given as a flag: the header names the flag; the environment's other value does not win.
TEST_F(RequestKnobs, AFlagWinsOverTheEnvironment) {
  harness::ReplayRequest r = cuda_request();
  r.pool_memory = "sparse";
  ::setenv("CPKV_POOL_MEMORY", "dense", 1);
  const harness::CheckedRequest c = harness::check_request(r, registry);
  EXPECT_NE(harness::knobs_line(c).find("--pool-memory sparse (--pool-memory)"), std::string::npos) << harness::knobs_line(c);
  EXPECT_NE(harness::replay_line(c, model::Variant::staging_direct, 2).find(" --pool-memory sparse"), std::string::npos);
}

// Unset everywhere: every knob is printed with its default, and the replay line names none.
TEST_F(RequestKnobs, DefaultsArePrintedAndLeftOutOfTheReplayLine) {
  const harness::CheckedRequest c = harness::check_request(cuda_request(), registry);
  EXPECT_EQ(harness::knobs_line(c), "knobs: --exchange builtin (default) | --exchange-load-ms-max 30000 (default) | --pool-memory sparse (default) | "
                                    "--compose-blocks-per-sm the kernels' (default)");
  const std::string line = harness::replay_line(c, model::Variant::staging_direct, 2);
  for (const KnobCase& k : kCases) EXPECT_EQ(line.find(k.flag), std::string::npos) << line;
  const harness::CheckedRequest torch = harness::check_request(request_of("torch"), registry);
  EXPECT_EQ(harness::knobs_line(torch), "knobs: --import-s-max 120 (default) | --cpkv-bin the build's (default)");
  const std::string torch_line = harness::replay_line(torch, model::Variant::staging_direct, 2);
  for (const KnobCase& k : kCases) EXPECT_EQ(torch_line.find(k.flag), std::string::npos) << torch_line;
}

// A bad value from the environment is one refusal naming the variable, the first bad knob in the
// table's order; a backend that does not take the knob ignores the variable (it is not that run's),
// but refuses the flag.
TEST_F(RequestKnobs, ABadEnvironmentValueIsRefusedNamingTheVariableAndOtherBackendsIgnoreIt) {
  ::setenv("CPKV_POOL_MEMORY", "half", 1);
  ::setenv("CPKV_COMPOSE_BLOCKS_PER_SM", "many", 1);
  try {
    harness::check_request(cuda_request(), registry);
    ADD_FAILURE() << "accepted CPKV_POOL_MEMORY=half";
  } catch (const harness::RequestError& e) {
    EXPECT_EQ(e.cli_message(), "--pool-memory: CPKV_POOL_MEMORY='half' is neither sparse nor dense");
  }
  ::unsetenv("CPKV_POOL_MEMORY");
  try {
    harness::check_request(cuda_request(), registry);
    ADD_FAILURE() << "accepted CPKV_COMPOSE_BLOCKS_PER_SM=many";
  } catch (const harness::RequestError& e) {
    EXPECT_EQ(e.cli_message(), "--compose-blocks-per-sm: CPKV_COMPOSE_BLOCKS_PER_SM=many is not a number of blocks in 1..32");
  }
  harness::ReplayRequest sim = cuda_request();
  sim.backend = "sim";
  const harness::CheckedRequest c = harness::check_request(sim, registry);
  EXPECT_TRUE(c.knobs.empty());
  EXPECT_EQ(harness::knobs_line(c), "");
  sim.pool_memory = "dense";
  EXPECT_THROW(harness::check_request(sim, registry), harness::RequestError);
}

// The knobs reach the GPU backend's options (what gpu/ runs with), not the environment.
TEST_F(RequestKnobs, TheResolvedKnobsAreWhatTheBackendRunsWith) {
  ::setenv("CPKV_POOL_MEMORY", "dense", 1);
  ::setenv("CPKV_COMPOSE_BLOCKS_PER_SM", "3", 1);
  const harness::CheckedRequest c = harness::check_request(cuda_request(), registry);
  ::unsetenv("CPKV_POOL_MEMORY");
  ::unsetenv("CPKV_COMPOSE_BLOCKS_PER_SM");
  cuda::CudaOptions options;
  cuda::apply_knobs(c.request, options);
  EXPECT_EQ(options.pool_memory, cuda::PoolMemory::dense);
  EXPECT_EQ(options.compose_blocks_per_sm, 3);
}

// The real binary: the variable's bad value is one line naming it, exit 2; the flag's bad value
// too; the variable of a knob sim does not take leaves a sim run alone.
TEST_F(RequestKnobs, TheBinaryReadsTheKnobsAtItsRequestCheck) {
  const test::fs::path dir = test::temp_dir("request_knobs_cli");
  test::RunSetup setup;
  setup.env = {"CPKV_POOL_MEMORY=half"};
  const std::string cpkv = test::cpkv_binary().string();
  test::expect_bad_input(test::spawn({cpkv, "replay", "traces/samples/tiny.jsonl", "--backend", "cuda"}, dir / "env", setup),
                         "--pool-memory: CPKV_POOL_MEMORY='half' is neither sparse nor dense");
  test::expect_bad_input(test::spawn({cpkv, "replay", "traces/samples/tiny.jsonl", "--backend", "cuda", "--compose-blocks-per-sm", "0"}, dir / "flag"),
                         "--compose-blocks-per-sm");
  const test::CliRun sim = test::spawn({cpkv, "replay", "traces/samples/tiny.jsonl", "--backend", "sim", "--variant", "staging_direct", "--layers", "1"},
                                       dir / "sim", setup);
  EXPECT_EQ(sim.status, 0) << sim.out << sim.err;
  EXPECT_EQ(sim.out.find("\nknobs: "), std::string::npos) << "sim takes none of the knobs: " << sim.out;
  EXPECT_NE(sim.out.find("\nfault knobs: "), std::string::npos) << "the header is the one searched: " << sim.out;
  test::fs::remove_all(dir);
}

// With a GPU: a run whose knobs came from the environment fails (a planted bug), its printed replay
// line is run with the environment cleared, and both runs' headers show the same knobs.
TEST_F(RequestKnobs, WithAGpuThePrintedReplayLineRunsWithTheSameKnobs) {
  if (cuda::gpu_count() == 0) GTEST_SKIP() << "no GPU: the request check is tested above; this runs the printed line on the GPUs";
  const test::fs::path dir = test::temp_dir("request_knobs_gpu");
  test::RunSetup setup;
  setup.env = {"CPKV_POOL_MEMORY=dense", "CPKV_COMPOSE_BLOCKS_PER_SM=2"};
  const std::string cpkv = test::cpkv_binary().string();
  const test::CliRun first = test::spawn(
      {cpkv, "replay", "traces/samples/tiny.jsonl", "--backend", "cuda", "--variant", "staging_direct", "--layers", "2", "--mutant", "single_half"}, dir / "1",
      setup);
  EXPECT_EQ(first.status, 1) << first.out << first.err;
  EXPECT_NE(first.out.find("--pool-memory dense (CPKV_POOL_MEMORY)"), std::string::npos) << first.out;
  EXPECT_NE(first.out.find("--compose-blocks-per-sm 2 (CPKV_COMPOSE_BLOCKS_PER_SM)"), std::string::npos) << first.out;
  const std::size_t at = first.out.find("replay: cpkv replay ");
  ASSERT_NE(at, std::string::npos) << first.out;
  std::istringstream line(first.out.substr(at + 8, first.out.find('\n', at) - at - 8));
  std::vector<std::string> argv{cpkv};
  for (std::string word; line >> word;) {
    if (word != "cpkv") argv.push_back(word);
  }
  const test::CliRun again = test::spawn(argv, dir / "2");  // the variables unset in this process (SetUp)
  EXPECT_EQ(again.status, 1) << again.out << again.err;
  EXPECT_NE(again.out.find("--pool-memory dense (--pool-memory)"), std::string::npos) << again.out;
  EXPECT_NE(again.out.find("--compose-blocks-per-sm 2 (--compose-blocks-per-sm)"), std::string::npos) << again.out;
  test::fs::remove_all(dir);
}

}  // namespace
}  // namespace cpkv

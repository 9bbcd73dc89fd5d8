// The torch backend (backends/src/torch_backend.cpp): a foreign PyTorch exchange is a backend of the
// one request. The request takes impl, device and ranks for it alone (every other backend refuses
// them, naming itself); its replay line names the class; `cpkv replay --backend torch` hands the
// checked request to Python's conformance harness through the configured interpreter, or refuses in
// one line naming the Python command that would run it.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_run.hpp"
#include "cpkv/backends/register_all.hpp"
#include "cpkv/harness/request.hpp"

namespace cpkv {
namespace {

using test::CliRun;
using test::RunSetup;

constexpr const char* kReference = "cpkv.conformance.reference:StagingDirect";

harness::ReplayRequest torch_request(const std::string& impl = kReference) {
  harness::ReplayRequest r;
  r.trace_label = test::sample("tiny.jsonl");
  r.backend = "torch";
  r.impl = impl;
  return r;
}

// The RequestError's option, or "" when the request passed.
std::string refused_option(const harness::ReplayRequest& r) {
  try {
    (void)harness::check_request(r, backends::registry());
  } catch (const harness::RequestError& e) {
    return e.option();
  }
  return "";
}

TEST(TorchBackend, OnlyTheTorchBackendTakesImplDeviceAndRanks) {
  for (const char* other : {"sim", "model"}) {
    harness::ReplayRequest r = torch_request();
    r.backend = other;
    EXPECT_EQ(refused_option(r), "impl") << other;
    r.impl.reset();
    r.device = "cpu";
    EXPECT_EQ(refused_option(r), "device") << other;
    r.device.reset();
    r.ranks = 2;
    EXPECT_EQ(refused_option(r), "ranks") << other;
  }
  harness::ReplayRequest r = torch_request();
  r.device = "cuda";
  r.ranks = 2;
  EXPECT_EQ(refused_option(r), "");
  r.schedule = "random";  // the simulator's option
  EXPECT_EQ(refused_option(r), "schedule");
}

TEST(TorchBackend, TheRequestChecksImplDeviceAndRanksLikeEveryOtherOption) {
  EXPECT_EQ(refused_option(torch_request(std::string(kReference) + "(mutant=None, slots=4)")), "");
  EXPECT_EQ(refused_option(torch_request("examples/my_exchange.py:MyExchange")), "");
  for (const char* bad : {"", "no_colon", "module:", ":Class", "module:1Class", "mod ule:Class", "module:Class(", "a\nb:C"}) {
    EXPECT_EQ(refused_option(torch_request(bad)), "impl") << bad;
  }
  harness::ReplayRequest r = torch_request();
  r.impl.reset();
  EXPECT_EQ(refused_option(r), "impl") << "the class is required";
  r = torch_request();
  r.device = "tpu";
  EXPECT_EQ(refused_option(r), "device");
  r = torch_request();
  r.ranks = 0;
  EXPECT_EQ(refused_option(r), "ranks");
  r = torch_request();
  r.variant = "staging_direct";  // the class is the variant
  EXPECT_EQ(refused_option(r), "variant");
  r = torch_request();
  r.mutant = "no barrier";
  EXPECT_EQ(refused_option(r), "mutant");
}

// The reproducer names the class (quoted: its arguments hold parentheses and spaces), never a
// variant, and every option the run was given.
TEST(TorchBackend, TheReplayLineNamesTheClassAndTheRunsOptions) {
  harness::ReplayRequest r = torch_request(std::string(kReference) + "(mutant='skip_zero')");
  r.ranks = 2;
  r.device = "cpu";
  r.swarm = true;
  r.mutant = "no_barrier";
  const std::string line = harness::replay_line(harness::check_request(r, backends::registry()), model::Variant::v2, 2);
  EXPECT_EQ(line, fmt::format("cpkv replay {} --backend torch --impl '{}(mutant='\\''skip_zero'\\'')' --seed 1 --layers 2 --ranks 2 --device cpu "
                              "--swarm --mutant no_barrier",
                              test::sample("tiny.jsonl"), kReference));
}

// The handoff: `python3 -m cpkv.conformance` with the request's options, the layers as every backend
// runs them (the request's 4, at most the trace's 2) and the ranks the trace's cp where none is given,
// from the one check of the whole run (check_run), with what that command reads instead of checking
// again: the header of each mode, the reproducer, the layers.
TEST(TorchBackend, TheHandoffIsTheConformanceCommandOfTheSameRequest) {
  harness::ReplayRequest r = torch_request();
  r.wait_ms_max = 5000;
  r.ipc_missing_rank = 1;
  const harness::CheckedRequest c = harness::check_run(r, backends::registry());
  ASSERT_TRUE(c.handed);
  const std::vector<std::string> expected = {"-m", "cpkv.conformance", r.trace_label, "--impl", kReference, "--ranks", "2", "--seed", "1", "--layers", "2",
                                             "--wait-ms-max", "5000", "--ipc-missing-rank", "1"};
  EXPECT_EQ(c.handed->arguments, expected);
  const nlohmann::json& checked = c.handed->checked;
  EXPECT_EQ(checked["format"], harness::kCheckedRunFormat);
  EXPECT_EQ(checked["arguments"], expected);
  EXPECT_EQ(checked["layers"], 2);
  const std::string first = checked["header"]["conformance/processes"][0];
  // (A sweep of another run's stale shared memory may add its count at the end.)
  EXPECT_EQ(first.rfind(fmt::format("cpkv conformance: {} | cp 2 page 4 | 3 batches | 2 of 2 layers | mode conformance/processes | seed 1", r.trace_label), 0), 0u)
      << first;
  // The defaults the command states (its ranks, its device) are the reproducer's too, as that command's own check wrote them.
  EXPECT_EQ(checked["replay_line"], fmt::format("cpkv replay {} --backend torch --impl {} --seed 1 --layers 2 --ranks 2 --device cpu --wait-ms-max 5000 "
                                                "--ipc-missing-rank 1",
                                                r.trace_label, kReference));
}

// The whole run is checked in the one call, the source too: a fault rank the trace's cp does not
// have, ranks other than its cp, a batch it does not hold, and a trace that is not a regular file
// are each refused there, naming the option.
TEST(TorchBackend, TheOneCheckRefusesWhatOnlyTheTraceShows) {
  const auto refused_run = [](const harness::ReplayRequest& r) -> std::string {
    try {
      (void)harness::check_run(r, backends::registry());
    } catch (const harness::RequestError& e) {
      return e.option();
    }
    return "";
  };
  harness::ReplayRequest r = torch_request();
  r.ipc_missing_rank = 7;  // tiny.jsonl is cp 2
  EXPECT_EQ(refused_option(r), "") << "without the trace the rank is in the model's range";
  EXPECT_EQ(refused_run(r), "ipc_missing_rank");
  r = torch_request();
  r.ranks = 3;
  EXPECT_EQ(refused_run(r), "ranks");
  r = torch_request();
  r.batch = 99;
  EXPECT_EQ(refused_run(r), "batch");
  r = torch_request();
  r.trace_label = "/dev/null";
  EXPECT_EQ(refused_run(r), "trace");
}

class TorchBackendCli : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::temp_dir("torch_backend_cli"); }
  void TearDown() override { test::fs::remove_all(dir_); }
  CliRun cpkv(std::vector<std::string> args, const RunSetup& setup = {}) {
    args.insert(args.begin(), test::cpkv_binary().string());
    return test::spawn(args, dir_ / "run", setup);
  }
  test::fs::path dir_;
};

// A real conformance run on CPU (two gloo rank processes), handed to the configured interpreter:
// its table and verdict on stdout, its exit status cpkv's. Where the interpreter has no torch, the
// refusal is the test's own subject (below), so this one must not pass without running.
TEST_F(TorchBackendCli, ReplayBackendTorchRunsTheConformanceHarness) {
  const CliRun run = cpkv({"replay", "traces/samples/tiny.jsonl", "--backend", "torch", "--impl", kReference, "--ranks", "2"});
  ASSERT_EQ(run.status, 0) << run.err << run.out;
  EXPECT_NE(run.out.find("cpkv conformance: traces/samples/tiny.jsonl | cp 2 page 4 | 3 batches | 2 of 2 layers"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find(std::string(kReference) + " "), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("pass"), std::string::npos) << run.out;
  EXPECT_EQ(run.out.find("FAIL"), std::string::npos) << run.out;
}

// A planted bug's run fails: exit 1 (not cpkv's 0), the invariant it breaks located, a replay line.
// token_split gives a page two writers: invariant 1 (PROTOCOL.md section 9).
TEST_F(TorchBackendCli, AFailingConformanceRunExitsOneWithItsReproducer) {
  const CliRun run = cpkv({"replay", "traces/samples/tiny.jsonl", "--backend", "torch", "--impl", kReference, "--mutant", "token_split"});
  EXPECT_EQ(run.status, 1) << run.err << run.out;
  EXPECT_NE(run.out.find("FAIL"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("invariant 1"), std::string::npos) << run.out;
  // The reproducer is the same request's line, the harness's: `cpkv replay --backend torch` again.
  EXPECT_NE(run.out.find("replay: cpkv replay traces/samples/tiny.jsonl --backend torch --impl " + std::string(kReference) + " "), std::string::npos) << run.out;
}

// No interpreter, or one without torch: one line, exit 2, naming the interpreter and the Python
// command that runs the same request; nothing ran.
TEST_F(TorchBackendCli, WithoutAnInterpreterThatHasTorchTheRefusalNamesThePythonCommand) {
  const std::string command = fmt::format("python3 -m cpkv.conformance traces/samples/tiny.jsonl --impl {} --ranks 2 --seed 1 --layers 2", kReference);
  RunSetup missing;
  missing.env = {"CPKV_PYTHON=" + (dir_ / "no_such_python").string()};
  CliRun run = cpkv({"replay", "traces/samples/tiny.jsonl", "--backend", "torch", "--impl", kReference}, missing);
  test::expect_bad_input(run, "`" + command + "`");
  EXPECT_NE(run.err.find("--backend torch: " + (dir_ / "no_such_python").string() + " (from CPKV_PYTHON)"), std::string::npos) << run.err;
  // An interpreter that starts but cannot import torch.
  const std::string lacking = test::write_temp("torch_backend_cli", "python_without_torch",
                                               "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'torch'\" >&2\nexit 1\n");
  test::fs::permissions(lacking, test::fs::perms::owner_all);
  RunSetup without;
  without.env = {"CPKV_PYTHON=" + lacking};
  run = cpkv({"replay", "traces/samples/tiny.jsonl", "--backend", "torch", "--impl", kReference}, without);
  test::expect_bad_input(run, "`" + command + "`");
  EXPECT_NE(run.err.find("No module named 'torch'"), std::string::npos) << run.err;
}

// An interpreter that records each time it runs: the probe ("-c ..."), then the run, whose arguments
// and the checked run handed on --request-fd it writes beside itself.
std::string recording_python(const test::fs::path& dir) {
  const std::string script = test::write_temp("torch_backend_cli", "recording_python",
                                              fmt::format("#!/bin/sh\necho ran >> {0}/ran\nif [ \"$1\" = -c ]; then exit 0; fi\n"
                                                          "printf '%s\\n' \"$@\" > {0}/argv\n"
                                                          "while [ $# -gt 1 ]; do if [ \"$1\" = --request-fd ]; then eval \"cat <&$2\" > {0}/checked; fi; shift; done\n",
                                                          dir.string()));
  test::fs::permissions(script, test::fs::perms::owner_all);
  return script;
}

// The cpkv command checks the whole run before it starts Python: what only the trace shows (a fault
// rank of a cp the trace does not have, ranks other than its cp) is its own one line, and no
// interpreter ran (the recording one would have left a file).
TEST_F(TorchBackendCli, TheWholeRunIsCheckedBeforeAnyInterpreterStarts) {
  test::fs::create_directories(dir_ / "record");
  RunSetup recording;
  recording.env = {"CPKV_PYTHON=" + recording_python(dir_ / "record")};
  test::expect_bad_input(cpkv({"replay", "traces/samples/tiny.jsonl", "--backend", "torch", "--impl", kReference, "--ipc-missing-rank", "7"}, recording),
                         "--ipc-missing-rank: 7 is not a rank of cp = 2");
  test::expect_bad_input(cpkv({"replay", "traces/samples/tiny.jsonl", "--backend", "torch", "--impl", kReference, "--ranks", "3"}, recording), "--ranks");
  test::expect_bad_input(cpkv({"replay", "traces/samples/tiny.jsonl", "--backend", "torch", "--impl", kReference, "--batch", "9"}, recording), "--batch");
  EXPECT_FALSE(test::fs::exists(dir_ / "record" / "ran")) << "an interpreter ran for a refused request";
}

// A run that passes the check reaches the interpreter with the checked run on --request-fd: the
// command's arguments, the header it prints, the reproducer, as the harness built them.
TEST_F(TorchBackendCli, TheCheckedRunIsHandedToTheInterpreter) {
  test::fs::create_directories(dir_ / "record");
  RunSetup recording;
  recording.env = {"CPKV_PYTHON=" + recording_python(dir_ / "record")};
  const CliRun run = cpkv({"replay", "traces/samples/tiny.jsonl", "--backend", "torch", "--impl", kReference, "--seed", "3"}, recording);
  ASSERT_EQ(run.status, 0) << run.err << run.out;
  EXPECT_EQ(test::slurp(dir_ / "record" / "ran"), "ran\nran\n");  // the probe, then the run
  const std::string argv = test::slurp(dir_ / "record" / "argv");
  EXPECT_NE(argv.find("\n--request-fd\n"), std::string::npos) << argv;
  const nlohmann::json checked = nlohmann::json::parse(test::slurp(dir_ / "record" / "checked"));
  EXPECT_EQ(checked["format"], harness::kCheckedRunFormat);
  const std::string first = checked["header"]["conformance/processes"][0];
  EXPECT_EQ(first.rfind("cpkv conformance: traces/samples/tiny.jsonl | cp 2 page 4 | 3 batches | 2 of 2 layers | mode conformance/processes | seed 3", 0), 0u)
      << first;
  const std::vector<std::string> header = checked["header"]["conformance/processes"];
  EXPECT_NE(std::find(header.begin(), header.end(), fmt::format("torch: impl {} | device cpu | ranks 2", kReference)), header.end()) << checked.dump();
  EXPECT_EQ(checked["replay_line"],
            fmt::format("cpkv replay traces/samples/tiny.jsonl --backend torch --impl {} --seed 3 --layers 2 --ranks 2 --device cpu", kReference));
}

TEST_F(TorchBackendCli, BadForeignOptionsAreRefusedBeforeAnyWork) {
  test::expect_bad_input(cpkv({"replay", "traces/samples/tiny.jsonl", "--backend", "torch", "--impl", "not-a-class"}), "--impl");
  test::expect_bad_input(cpkv({"replay", "traces/samples/tiny.jsonl", "--backend", "torch"}), "--impl");
  test::expect_bad_input(cpkv({"replay", "traces/samples/tiny.jsonl", "--impl", kReference}), "--impl: --backend sim does not take it");
  test::expect_bad_input(cpkv({"replay", "traces/samples/tiny.jsonl", "--backend", "torch", "--impl", kReference, "--device", "tpu"}), "--device");
}

}  // namespace
}  // namespace cpkv

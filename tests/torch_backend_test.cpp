// The torch backend (backends/src/torch_backend.cpp): a foreign PyTorch exchange is a backend of the
// one request. The request takes impl, device and ranks for it alone (every other backend refuses
// them, naming itself); its replay line names the class; `cpkv replay --backend torch` hands the
// checked request to Python's conformance harness through the configured interpreter, or refuses in
// one line naming the Python command that would run it.
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

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
// runs them (the request's 4, at most the trace's 2) and the ranks the trace's cp where none is given.
TEST(TorchBackend, TheHandoffIsTheConformanceCommandOfTheSameRequest) {
  harness::ReplayRequest r = torch_request();
  r.wait_ms_max = 5000;
  r.ipc_missing_rank = 1;
  const harness::CheckedRequest c = harness::check_request(r, backends::registry());
  ASSERT_TRUE(c.backend->handoff);
  const std::vector<std::string> args = c.backend->handoff(c, harness::BatchSource::from_trace(r.trace_label, std::nullopt));
  const std::vector<std::string> expected = {"-m", "cpkv.conformance", r.trace_label, "--impl", kReference, "--ranks", "2", "--seed", "1", "--layers", "2",
                                             "--wait-ms-max", "5000", "--ipc-missing-rank", "1"};
  EXPECT_EQ(args, expected);
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

TEST_F(TorchBackendCli, BadForeignOptionsAreRefusedBeforeAnyWork) {
  test::expect_bad_input(cpkv({"replay", "traces/samples/tiny.jsonl", "--backend", "torch", "--impl", "not-a-class"}), "--impl");
  test::expect_bad_input(cpkv({"replay", "traces/samples/tiny.jsonl", "--backend", "torch"}), "--impl");
  test::expect_bad_input(cpkv({"replay", "traces/samples/tiny.jsonl", "--impl", kReference}), "--impl: --backend sim does not take it");
  test::expect_bad_input(cpkv({"replay", "traces/samples/tiny.jsonl", "--backend", "torch", "--impl", kReference, "--device", "tpu"}), "--device");
}

}  // namespace
}  // namespace cpkv

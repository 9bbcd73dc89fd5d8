// cpkv's handling of files, numbers, pipes and messages (the reliability issue, CLI part): no input
// is ever overwritten, no output is opened before every input and option is checked, a refused or
// failed run leaves an existing output as it was, a file name is never run as shell code, every
// backend checks every option, NaN and out-of-range numbers are refused with the limit, a trace
// can come through a pipe, error lines are one line of bounded length, and rejected batches are
// reported. Each test runs the real cpkv binary (no shell, an argument vector) on real files.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_run.hpp"

namespace {

namespace fs = std::filesystem;
using namespace cpkv::test;  // NOLINT: the CLI tests' one runner (cli_run.hpp)

// A fresh folder per test, removed at the end.
class CliReliability : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("cpkv_reliability_{}_{}", ::getpid(), ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "tmp");
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;

  // Runs cpkv with exactly these arguments (no shell); stdout and stderr captured; TMPDIR is the
  // test's own folder, so spool files left behind would be seen.
  CliRun cpkv(const std::vector<std::string>& args, const RunSetup& setup = {}) {
    std::vector<std::string> argv = {cpkv_binary().string()};
    argv.insert(argv.end(), args.begin(), args.end());
    return cpkv::test::spawn(argv, dir_, setup);
  }

  // bash -c SCRIPT, for what needs a pipe or process substitution (the script is the test's own text).
  CliRun bash(const std::string& script) {
    return cpkv::test::spawn({"/bin/bash", "-c", script, "bash", cpkv_binary().string()}, dir_);
  }

  fs::path copy_sample(const std::string& name, const std::string& as) {
    const fs::path to = dir_ / as;
    fs::copy_file(fs::path(CPKV_SOURCE_DIR) / "traces" / "samples" / name, to);
    return to;
  }

  fs::path write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
    return dir_ / name;
  }

  std::vector<std::string> files_in(const fs::path& folder) {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(folder)) names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
};

std::string mooncake_log() {
  std::string log;
  for (int i = 0; i < 4; ++i) log += fmt::format("{{\"timestamp\": {}, \"input_length\": 1500, \"output_length\": 10, \"hash_ids\": [{}, {}, {}]}}\n", i, i, i + 1, i + 2);
  return log;
}

// --- 1. data loss -----------------------------------------------------------------------------

TEST_F(CliReliability, ReplayNeverOverwritesItsTrace) {
  const fs::path trace = copy_sample("tiny.jsonl", "t.jsonl");
  const std::string before = slurp(trace);
  expect_bad_input(cpkv({"replay", trace.string(), "--json", trace.string()}), "same file");
  expect_bad_input(cpkv({"replay", trace.string(), "--backend", "model", "--json", trace.string()}), "same file");
  expect_bad_input(cpkv({"replay", trace.string(), "--schedule", "random", "--variant", "staging_direct", "--event-log", trace.string()}), "same file");
  // Through another name of the same file: a hard link.
  fs::create_hard_link(trace, dir_ / "link.json");
  expect_bad_input(cpkv({"replay", trace.string(), "--backend", "model", "--json", (dir_ / "link.json").string()}), "same file");
  EXPECT_EQ(slurp(trace), before);
}

TEST_F(CliReliability, RefusedOrFailedRunLeavesAnExistingOutputAsItWas) {
  const fs::path json = write("report.json", "old report\n");
  expect_bad_input(cpkv({"replay", "traces/samples/tiny.jsonl", "--json", json.string(), "--variant", "bogus"}), "--variant");
  expect_bad_input(cpkv({"replay", "traces/samples/tiny.jsonl", "--json", json.string(), "--batch", "7"}), "--batch");
  EXPECT_EQ(slurp(json), "old report\n");
  // A write that fails (the file size limit stands in for a full disk): exit 1, never 0, old file kept.
  RunSetup full;
  full.file_size_max_bytes = 200;
  const CliRun run = cpkv({"replay", "traces/samples/tiny.jsonl", "--backend", "model", "--json", json.string()}, full);
  EXPECT_EQ(run.status, 1) << run.err;
  EXPECT_TRUE(one_line(run.err)) << run.err;
  EXPECT_NE(run.err.find("--json"), std::string::npos) << run.err;
  EXPECT_EQ(run.out, "") << "no summary before the output is safe: " << run.out;
  EXPECT_EQ(slurp(json), "old report\n");
  EXPECT_EQ(files_in(dir_), (std::vector<std::string>{"report.json", "stderr", "stdout", "tmp"})) << "no temporary file left";
}

TEST_F(CliReliability, OutputsThatAreNotRegularFilesAreRefused) {
  fs::create_directories(dir_ / "out_dir");
  fs::create_symlink("/dev/null", dir_ / "null_link");
  fs::create_symlink(dir_ / "out_dir", dir_ / "dir_link");
  for (const std::string target : {"/dev/full", "/dev/null", "/dev/stdout", "-"}) {
    expect_bad_input(cpkv({"replay", "traces/samples/tiny.jsonl", "--backend", "model", "--json", target}), "--json");
  }
  expect_bad_input(cpkv({"replay", "traces/samples/tiny.jsonl", "--backend", "model", "--json", (dir_ / "out_dir").string()}), "directory");
  expect_bad_input(cpkv({"replay", "traces/samples/tiny.jsonl", "--backend", "model", "--json", (dir_ / "dir_link").string()}), "symbolic link");
  expect_bad_input(cpkv({"replay", "traces/samples/tiny.jsonl", "--backend", "model", "--json", (dir_ / "no_such_dir" / "x.json").string()}), "--json");
  const fs::path log = write("log.jsonl", mooncake_log());
  expect_bad_input(cpkv({"import", "mooncake", log.string(), "-o", (dir_ / "out_dir").string()}), "directory");
  expect_bad_input(cpkv({"import", "mooncake", log.string(), "-o", (dir_ / "null_link").string()}), "symbolic link");
  EXPECT_TRUE(fs::is_directory(dir_ / "out_dir"));
  EXPECT_TRUE(fs::is_symlink(dir_ / "null_link"));
  EXPECT_EQ(files_in(dir_), (std::vector<std::string>{"dir_link", "log.jsonl", "null_link", "out_dir", "stderr", "stdout", "tmp"}))
      << "no .partial or temporary file left";
}

TEST_F(CliReliability, ImportNeverReplacesItsInput) {
  const fs::path log = write("log.jsonl", mooncake_log());
  expect_bad_input(cpkv({"import", "mooncake", log.string(), "-o", log.string()}), "same file");
  EXPECT_EQ(slurp(log), mooncake_log());
  // A good import replaces an existing trace through a temporary file and a link writes its target.
  const fs::path trace = write("trace.jsonl", "old\n");
  fs::create_symlink(trace, dir_ / "trace_link");
  const CliRun run = cpkv({"import", "mooncake", log.string(), "-o", (dir_ / "trace_link").string(), "--cp", "2", "--layers", "2"});
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_TRUE(fs::is_symlink(dir_ / "trace_link"));
  std::istringstream written(slurp(trace));
  std::string header;
  std::getline(written, header);
  EXPECT_EQ(nlohmann::json::parse(header).value("format", ""), "cpkv-batch-trace") << header;
  EXPECT_EQ(files_in(dir_), (std::vector<std::string>{"log.jsonl", "stderr", "stdout", "tmp", "trace.jsonl", "trace_link"}));
}

// --- 2. shell injection -----------------------------------------------------------------------

// A stand-in interpreter (a shell script) in the test's folder: `body` after the #! line.
fs::path stand_in(const fs::path& dir, const std::string& name, const std::string& body) {
  fs::create_directories(dir / "bin");
  std::ofstream(dir / "bin" / name) << "#!/bin/sh\n" << body;
  fs::permissions(dir / "bin" / name, fs::perms::owner_all);
  return dir / "bin" / name;
}

TEST_F(CliReliability, ChartFileNamesAreNeverRunAsShellCode) {
  // Where the configured interpreter lacks matplotlib, a stand-in (CPKV_PYTHON) "draws" by writing
  // its third argument, so the chart path is exercised either way.
  const bool have_matplotlib = std::system(fmt::format("'{}' -c 'import matplotlib' > /dev/null 2>&1", CPKV_CHART_PYTHON).c_str()) == 0;
  RunSetup setup;
  setup.cwd = dir_;
  if (!have_matplotlib) {
    setup.env.push_back("CPKV_PYTHON=" + stand_in(dir_, "python3", "if [ \"$1\" = -c ]; then exit 0; fi\nprintf 'PNG' > \"$3\"\n").string());
  }
  const std::string evil = "x';touch PWNED;'.jsonl";
  fs::copy_file(fs::path(CPKV_SOURCE_DIR) / "traces" / "samples" / "tiny.jsonl", dir_ / evil);
  const CliRun run = cpkv({"replay", evil, "--backend", "model", "--chart", "c';touch PWNED2;'.png"}, setup);
  EXPECT_FALSE(fs::exists(dir_ / "PWNED")) << "the trace name ran as shell code";
  EXPECT_FALSE(fs::exists(dir_ / "PWNED2")) << "the chart name ran as shell code";
  EXPECT_EQ(run.status, 0) << run.err;
  EXPECT_TRUE(fs::exists(dir_ / "c';touch PWNED2;'.png"));
}

// --- 6. every backend checks every option -------------------------------------------------------

TEST_F(CliReliability, ModelBackendChecksEveryOptionBeforeAnyWork) {
  const fs::path schedule = write("schedule.txt", "0 1 banana\n");
  fs::create_directories(dir_ / "ceilings_dir");
  const std::string trace = "traces/samples/tiny.jsonl";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--variant", "bogus"}, "--variant"},
      {{"--mutant", "bogus"}, "--mutant"},
      {{"--mutant", "no_barrier"}, "--mutant"},
      {{"--layers", "0"}, "--layers"},
      {{"--layers", "many"}, "--layers"},
      {{"--schedule", schedule.string()}, "--schedule"},
      {{"--peer-gbps", "inf"}, "--peer-gbps"},
      {{"--peer-gbps", "nan"}, "--peer-gbps"},
      {{"--barrier-us", "-1"}, "--barrier-us"},
      {{"--ceilings", (dir_ / "ceilings_dir").string()}, "--ceilings"},
      {{"--ranks-as", "fibers"}, "--ranks-as"},
      {{"--ipc-missing-rank", "9"}, "--ipc-missing-rank"},
  };
  for (const auto& [args, what] : cases) {
    std::vector<std::string> argv = {"replay", trace, "--backend", "model", "--json", (dir_ / "r.json").string()};
    argv.insert(argv.end(), args.begin(), args.end());
    SCOPED_TRACE(fmt::format("{}", fmt::join(args, " ")));
    expect_bad_input(cpkv(argv), what);
    EXPECT_FALSE(fs::exists(dir_ / "r.json"));
  }
}

// --- 7. numbers ----------------------------------------------------------------------------------

TEST_F(CliReliability, NanInfinityAndOutOfRangeNumbersAreRefused) {
  expect_bad_input(cpkv({"soak", "--minutes", "nan"}), "--minutes");
  expect_bad_input(cpkv({"soak", "--minutes", "inf"}), "--minutes");
  expect_bad_input(cpkv({"explore", "--seconds-max", "nan"}), "--seconds-max");
  expect_bad_input(cpkv({"replay", "traces/samples/tiny.jsonl", "--seed", "-1"}), "--seed");
  expect_bad_input(cpkv({"replay", "traces/samples/tiny.jsonl", "--seed", "18446744073709551616"}), "18446744073709551615");
  expect_bad_input(cpkv({"mutants", "--seed", "-1"}), "--seed");
  expect_bad_input(cpkv({"soak", "--seed", "99999999999999999999"}), "--seed");
  // A limit is printed as the limit, not as a 309-digit double.
  const CliRun wait = cpkv({"replay", "traces/samples/tiny.jsonl", "--wait-ms-max", "-1"});
  expect_bad_input(wait, "--wait-ms-max");
  EXPECT_EQ(wait.err.find("179769"), std::string::npos) << wait.err;
  EXPECT_LT(wait.err.size(), 200u) << wait.err;
}

TEST_F(CliReliability, ImportChecksLimitsBeforeAllocating) {
  // 512 MiB of address space: the old 2 GiB layer pattern could not even be allocated.
  RunSetup small;
  small.address_space_max_bytes = rlim_t{512} << 20;
  const CliRun run = cpkv({"import", "mooncake", "/nonexistent/log.jsonl", "-o", (dir_ / "o.jsonl").string(), "--layers", "2147483647"}, small);
  expect_bad_input(run, "--layers");
  EXPECT_NE(run.err.find("256"), std::string::npos) << "names the limit: " << run.err;
  // Refusals derived from the model's checks name the option, not an internal field.
  expect_bad_input(cpkv({"import", "mooncake", "/nonexistent/log.jsonl", "-o", (dir_ / "o.jsonl").string(), "--cp", "9"}), "--cp");
  expect_bad_input(cpkv({"import", "mooncake", "/nonexistent/log.jsonl", "-o", (dir_ / "o.jsonl").string(), "--page-size", "3"}), "--page-size");
  expect_bad_input(cpkv({"import", "mooncake", "/nonexistent/log.jsonl", "-o", (dir_ / "o.jsonl").string(), "--pool-pages", "3"}), "--pool-pages");
}

// --- 8. pipes ------------------------------------------------------------------------------------

TEST_F(CliReliability, TraceThroughAPipeReadsLikeTheFile) {
  const std::string tiny = (fs::path(CPKV_SOURCE_DIR) / "traces" / "samples" / "tiny.jsonl").string();
  const CliRun direct = cpkv({"plan", tiny});
  ASSERT_EQ(direct.status, 0) << direct.err;
  const CliRun piped = bash(fmt::format("cat '{}' | \"$1\" plan /dev/stdin", tiny));
  EXPECT_EQ(piped.status, 0) << piped.err;
  EXPECT_EQ(piped.out, direct.out);
  const CliRun substituted = bash(fmt::format("\"$1\" replay <(cat '{}') --variant staging_direct --ranks-as threads", tiny));
  EXPECT_EQ(substituted.status, 0) << substituted.err << substituted.out;
  EXPECT_NE(substituted.out.find("pass"), std::string::npos) << substituted.out;
  const CliRun model = bash(fmt::format("cat '{}' | \"$1\" replay /dev/stdin --backend model", tiny));
  EXPECT_EQ(model.status, 0) << model.err;
  EXPECT_NE(model.out.find("batches 3,"), std::string::npos) << model.out;
  // A bad trace through a pipe: the error names the pipe, and the spool is gone.
  const CliRun bad = bash("printf '{\"format\":\"nope\"}\\n' | \"$1\" plan /dev/stdin");
  EXPECT_EQ(bad.status, 2) << bad.err;
  EXPECT_TRUE(one_line(bad.err)) << bad.err;
  EXPECT_NE(bad.err.find("/dev/stdin"), std::string::npos) << bad.err;
  EXPECT_EQ(bad.err.find("spool"), std::string::npos) << bad.err;
  EXPECT_TRUE(files_in(dir_ / "tmp").empty()) << "spool files left: " << fmt::format("{}", fmt::join(files_in(dir_ / "tmp"), " "));
  // The same-file check still sees the original: stdin redirected from the trace itself.
  const fs::path trace = copy_sample("tiny.jsonl", "t.jsonl");
  const CliRun same = bash(fmt::format("\"$1\" replay /dev/stdin --backend model --json '{}' < '{}'", trace.string(), trace.string()));
  expect_bad_input(same, "same file");
  EXPECT_EQ(slurp(trace), slurp(tiny));
}

// The request check asks for the trace only once the options pass (harness::SourceFile): a bad
// option with a trace that is not one is refused for the option, and no spool of the pipe is left.
TEST_F(CliReliability, ABadOptionIsRefusedBeforeAPipedTraceIsRead) {
  for (const char* backend : {"sim", "model"}) {
    const CliRun run = bash(fmt::format("printf 'not a trace\\n' | \"$1\" replay /dev/stdin --backend {} --variant nope", backend));
    EXPECT_EQ(run.status, 2) << backend << ": " << run.err;
    EXPECT_TRUE(one_line(run.err)) << backend << ": " << run.err;
    EXPECT_NE(run.err.find("--variant"), std::string::npos) << backend << ": the option, not the trace, is named: " << run.err;
    EXPECT_EQ(run.err.find("/dev/stdin"), std::string::npos) << backend << ": the trace was read first: " << run.err;
    EXPECT_TRUE(files_in(dir_ / "tmp").empty()) << backend << ": spool files left: " << fmt::format("{}", fmt::join(files_in(dir_ / "tmp"), " "));
  }
}

// --- 10. messages ----------------------------------------------------------------------------------

TEST_F(CliReliability, MessagesAreOneBoundedLineNamingTheChoices) {
  RunSetup bad_rc;
  bad_rc.env.push_back("RC_PARAMS=seed=banana");
  expect_bad_input(cpkv({"mutants"}, bad_rc), "RC_PARAMS");
  expect_bad_input(cpkv({"soak", "--minutes", "0.01"}, bad_rc), "RC_PARAMS");
  const CliRun none = cpkv({});
  expect_bad_input(none, "A subcommand is required");
  for (const char* name : {"plan", "replay", "mutants", "explore", "soak", "import"}) EXPECT_NE(none.err.find(name), std::string::npos) << none.err;
  expect_bad_input(cpkv({"import"}), "mooncake");
  // A path of 3000 characters: the line is cut (at 480 characters, cli/main.cpp), not the terminal flooded.
  std::string long_path = "/nonexistent";
  for (int i = 0; i < 300; ++i) long_path += "/abcdefghi";
  const CliRun run = cpkv({"plan", long_path});
  expect_bad_input(run, "/nonexistent");
  EXPECT_LE(run.err.size(), 560u) << run.err.size();
}

// --- 12. rejected batches ------------------------------------------------------------------------

TEST_F(CliReliability, RejectedBatchesAreReportedByEveryBackend) {
  // tiny.jsonl batch 2 needs 4 + 4 = 8 current pages > 6 staging slots (its header says so).
  const std::string line = "batch 2 rejected: overflow: 8 current pages > 6 staging slots";
  for (const std::vector<std::string>& backend : {std::vector<std::string>{"--backend", "model"},
                                                 std::vector<std::string>{"--backend", "sim", "--variant", "staging_direct", "--ranks-as", "threads"},
                                                 std::vector<std::string>{"--backend", "sim", "--variant", "staging_direct", "--schedule", "random"}}) {
    std::vector<std::string> argv = {"replay", "traces/samples/tiny.jsonl", "--json", (dir_ / "r.json").string()};
    argv.insert(argv.end(), backend.begin(), backend.end());
    SCOPED_TRACE(fmt::format("{}", fmt::join(backend, " ")));
    const CliRun run = cpkv(argv);
    EXPECT_EQ(run.status, 0) << run.err;
    EXPECT_NE(run.err.find(line), std::string::npos) << run.err;
    const nlohmann::json report = nlohmann::json::parse(slurp(dir_ / "r.json"));
    ASSERT_TRUE(report.contains("rejected_batches")) << report.dump();
    ASSERT_EQ(report["rejected_batches"].size(), 1u);
    EXPECT_EQ(report["rejected_batches"][0]["batch"], 2);
    EXPECT_EQ(report["rejected_batches"][0]["current_pages_total"], 8);
    EXPECT_EQ(report["rejected_batches"][0]["staging_slots"], 6);
  }
}

TEST_F(CliReliability, ManyRejectedBatchesPrintAFewLinesAndACount) {
  // Nine copies of tiny.jsonl's overflowing batch: 5 lines, then "4 more"; all nine in the JSON.
  std::istringstream tiny(slurp(fs::path(CPKV_SOURCE_DIR) / "traces" / "samples" / "tiny.jsonl"));
  std::string header, overflow;
  std::getline(tiny, header);
  for (std::string l; std::getline(tiny, l);) overflow = l;
  std::string text = header + "\n";
  for (int b = 0; b < 9; ++b) {
    nlohmann::json batch = nlohmann::json::parse(overflow);
    batch["batch"] = b;
    text += batch.dump() + "\n";
  }
  const fs::path trace = write("many.jsonl", text);
  const CliRun run = cpkv({"replay", trace.string(), "--backend", "model", "--json", (dir_ / "r.json").string()});
  EXPECT_EQ(run.status, 0) << run.err;
  std::istringstream err(run.err);
  int lines = 0;
  for (std::string l; std::getline(err, l);) lines += l.find(" rejected: overflow") != std::string::npos ? 1 : 0;
  EXPECT_EQ(lines, 5) << run.err;
  EXPECT_NE(run.err.find("4 more rejected batches"), std::string::npos) << run.err;
  EXPECT_EQ(nlohmann::json::parse(slurp(dir_ / "r.json"))["rejected_batches"].size(), 9u);
}

// --- 13. temporary files (second audit, issue 22 item 1) ----------------------------------------

// Another local user who makes the old fixed folder $TMPDIR/cpkv-counterexamples first, full of
// links named as counterexamples are, made the next user (or root) overwrite every file the links
// pointed at (14 of 14, exit 0). Counterexamples now go to a private folder made for the run.
TEST_F(CliReliability, CounterexamplesNeverWriteThroughAnAttackersLinks) {
  const fs::path trap = dir_ / "tmp" / "cpkv-counterexamples";
  fs::create_directories(trap);
  fs::create_directories(dir_ / "victims");
  const std::vector<std::string> properties = {"1_page_writer_exclusivity", "2_parity_half_reuse_safety", "3_overflow_determinism",
                                               "4_barrier_phase_safety", "5_plan_invariance", "6_byte_exactness", "7_capability_agreement",
                                               "8_liveness"};
  const std::vector<std::string> mutants = {"token_split", "skip_zero", "unagreed_capability", "barrier_reset_race", "skip_idle_barrier",
                                            "barrier_passes_early", "plan_rebuilt_per_layer", "reversed_request_order", "unmatched_arrival",
                                            "address_keyed_plan_cache", "arrive_before_fill", "no_barrier", "rank_local_overflow", "single_half"};
  int victims = 0;
  for (const std::string& property : properties) {
    for (const std::string& mutant : mutants) {
      for (const char* extension : {".jsonl", ".schedule"}) {
        const fs::path victim = dir_ / "victims" / std::to_string(victims++);
        std::ofstream(victim) << "precious\n";
        fs::create_symlink(victim, trap / (property + "-" + mutant + extension));
      }
    }
  }
  const CliRun run = cpkv({"mutants", "--cases", "5"});
  EXPECT_EQ(run.status, 0) << run.err;
  for (int v = 0; v < victims; ++v) EXPECT_EQ(slurp(dir_ / "victims" / std::to_string(v)), "precious\n") << "written through a link: victim " << v;
  // The replay lines name the private folder, which holds the counterexamples as regular files.
  const std::string marker = "replay: cpkv replay ";
  const std::size_t at = run.out.find(marker);
  ASSERT_NE(at, std::string::npos) << run.out;
  const fs::path trace = run.out.substr(at + marker.size(), run.out.find(' ', at + marker.size()) - at - marker.size());
  EXPECT_EQ(trace.parent_path().parent_path(), dir_ / "tmp") << trace;
  EXPECT_NE(trace.parent_path(), trap);
  EXPECT_EQ(fs::status(trace.parent_path()).permissions() & (fs::perms::group_all | fs::perms::others_all), fs::perms::none);
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(trace))) << trace;
  EXPECT_GT(fs::file_size(trace), 0u);
}

// --- 14. standard streams, signals and limits (second audit, issue 22 items 3, 4, 5, 12, 23) ------

// With fd 0 closed the signal pipe became standard input, and `plan /dev/stdin` read its own signal
// pipe for up to 600 s (the `timeout` here bounds the old hang). Now standard input is /dev/null.
TEST_F(CliReliability, AClosedStandardInputIsNeverTheSignalPipe) {
  const CliRun run = bash("timeout 30 \"$1\" plan /dev/stdin <&-");
  EXPECT_EQ(run.status, 2) << run.err;
  EXPECT_TRUE(one_line(run.err)) << run.err;
  EXPECT_TRUE(files_in(dir_ / "tmp").empty()) << "spool files left";
}

// Output that cannot be written is exit 1 naming standard output; it was exit 0 with the report lost.
TEST_F(CliReliability, StandardOutputWriteErrorsAreExit1NamingIt) {
  for (const std::string command : {"plan traces/samples/tiny.jsonl", "--help", "replay traces/samples/tiny.jsonl --backend model",
                                    "import --help"}) {
    for (const std::string redirect : {"> /dev/full", ">&-"}) {
      SCOPED_TRACE(command + " " + redirect);
      const CliRun run = bash(fmt::format("cd '{}' && \"$1\" {} {}", CPKV_SOURCE_DIR, command, redirect));
      EXPECT_EQ(run.status, 1) << run.err;
      EXPECT_NE(run.err.find("cannot write standard output"), std::string::npos) << run.err;
      EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n') - static_cast<std::ptrdiff_t>(run.err.find("rejected") != std::string::npos), 1)
          << run.err;
    }
  }
}

// A reader that has gone (`cpkv replay ... | head -1`): SIGPIPE killed cpkv at once, leaving its
// region and partial outputs; now the write fails with EPIPE and is reported. The pipe's read end
// is closed before cpkv starts, so the write surely fails.
TEST_F(CliReliability, AClosedPipeIsAWriteErrorNotASignal) {
  int fds[2] = {-1, -1};
  ASSERT_EQ(::pipe(fds), 0);
  ::close(fds[0]);
  const fs::path err = dir_ / "stderr";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::signal(SIGPIPE, SIG_DFL);  // as a shell starts a pipeline
    ::dup2(fds[1], 1);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(e, 2);
    if (::chdir(CPKV_SOURCE_DIR) != 0) ::_exit(126);
    ::execl(cpkv_binary().c_str(), "cpkv", "plan", "traces/samples/tiny.jsonl", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(fds[1]);
  int raw = 0;
  ASSERT_EQ(::waitpid(pid, &raw, 0), pid);
  EXPECT_TRUE(WIFEXITED(raw)) << "ended by signal " << (WIFSIGNALED(raw) ? WTERMSIG(raw) : 0);
  EXPECT_EQ(WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, 1);
  EXPECT_NE(slurp(err).find("cannot write standard output: Broken pipe"), std::string::npos) << slurp(err);
}

// A spool or a hidden partial output left by a cpkv that was SIGKILLed (a 48 MB hidden import was
// seen) carries its creator's pid and goes when the next cpkv makes one there; a live one stays.
TEST_F(CliReliability, TemporariesOfDeadRunsAreSwept) {
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  const std::string spool = fmt::format("tmp/cpkv-spool-{}-abcdef.jsonl", dead);
  const std::string partial = fmt::format("out/.cpkv-{}-abcdef.json", dead);
  const std::string alive = fmt::format("out/.cpkv-{}-abcdef.json", ::getpid());
  fs::create_directories(dir_ / "out");
  for (const std::string& name : {spool, partial, alive}) write(name, "left over\n");
  const CliRun run = bash(fmt::format("cd '{}' && cat traces/samples/tiny.jsonl | \"$1\" replay /dev/stdin --backend model --json '{}'",
                                      CPKV_SOURCE_DIR, (dir_ / "out" / "r.json").string()));
  EXPECT_EQ(run.status, 0) << run.err;
  EXPECT_FALSE(fs::exists(dir_ / spool));
  EXPECT_FALSE(fs::exists(dir_ / partial));
  EXPECT_TRUE(fs::exists(dir_ / alive)) << "a live run's temporary was removed";
  EXPECT_TRUE(fs::exists(dir_ / "out" / "r.json"));
}

// Out of file descriptors: the interrupt setup threw outside main's try (SIGABRT), and a trace that
// could not be opened for EMFILE was blamed as bad input (exit 2). Now exit 1 naming the limit.
TEST_F(CliReliability, AFileDescriptorLimitIsExit1NamingIt) {
  for (const int limit : {4, 5}) {
    SCOPED_TRACE(limit);
    // The descriptors this test process left open are closed first: the limit is cpkv's alone.
    const CliRun run = bash(fmt::format("cd '{}' && exec 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&- && ulimit -n {} && exec \"$1\" plan traces/samples/tiny.jsonl",
                                        CPKV_SOURCE_DIR, limit));
    EXPECT_EQ(run.status, 1) << run.err;
    EXPECT_TRUE(one_line(run.err)) << run.err;
    EXPECT_NE(run.err.find("Too many open files"), std::string::npos) << run.err;
  }
}

// An unknown subcommand is named, and a byte no terminal should see is written as \xNN.
TEST_F(CliReliability, AnUnknownSubcommandIsNamedPrintably) {
  expect_bad_input(cpkv({"frobnicate"}), "'frobnicate'");
  const CliRun run = cpkv({"fr\xff\x1b[31m"});
  expect_bad_input(run, "'fr\\xFF\\x1B[31m'");
}

// --- 15. outputs, pipes, skipped lines and file names (second audit, issue 22 items 7, 15, 18, 20) --

// A target whose folder takes no new file passed the checks and failed at the rename, after the
// whole run; the check now makes (and removes) a file there first.
TEST_F(CliReliability, AnOutputThatCannotBeReplacedIsRefusedUpFront) {
  expect_bad_input(cpkv({"replay", "traces/samples/tiny.jsonl", "--backend", "model", "--json", "/proc/version"}), "--json");
  const fs::path log = write("log.jsonl", mooncake_log());
  expect_bad_input(cpkv({"import", "mooncake", log.string(), "-o", "/proc/version"}), "-o");
  EXPECT_EQ(files_in(dir_), (std::vector<std::string>{"log.jsonl", "stderr", "stdout", "tmp"}));
}

// A named pipe no process opens for writing blocked for 600 s; now it is refused after the stated
// limit, and a writer that comes a moment late is still read.
TEST_F(CliReliability, ANamedPipeWithNoWriterIsRefusedAndALateWriterIsRead) {
  ASSERT_EQ(::mkfifo((dir_ / "fifo").c_str(), 0600), 0);
  const CliRun alone = cpkv({"plan", (dir_ / "fifo").string()});
  expect_bad_input(alone, "no process wrote to the named pipe");
  const CliRun late = bash(fmt::format("(sleep 0.2; cat '{}' > '{}') & \"$1\" plan '{}'", sample("tiny.jsonl"), (dir_ / "fifo").string(),
                                       (dir_ / "fifo").string()));
  EXPECT_EQ(late.status, 0) << late.err;
  EXPECT_NE(late.out.find("batch 0"), std::string::npos) << late.out;
}

// --skip-bad on a file of garbage wrote an empty trace, exit 0, silent; skipped lines are now said,
// and a log with no usable line is refused.
TEST_F(CliReliability, SkipBadRefusesALogWithNoUsableLineAndSaysWhatItSkipped) {
  const fs::path garbage = write("garbage.jsonl", "not json\nnor this\n");
  expect_bad_input(cpkv({"import", "mooncake", garbage.string(), "-o", (dir_ / "o.jsonl").string(), "--skip-bad"}), "no line");
  EXPECT_FALSE(fs::exists(dir_ / "o.jsonl"));
  const fs::path mixed = write("mixed.jsonl", mooncake_log() + "junk\n");
  const CliRun run = cpkv({"import", "mooncake", mixed.string(), "-o", (dir_ / "o.jsonl").string(), "--skip-bad"});
  EXPECT_EQ(run.status, 0) << run.err;
  EXPECT_NE(run.err.find("skipped 1 bad line of 5"), std::string::npos) << run.err;
}

// A log whose name is not UTF-8 lost the import to nlohmann's "invalid UTF-8 byte"; the name is now
// kept with its odd byte written \xFF, and a note that is not UTF-8 is refused before any work.
TEST_F(CliReliability, AFileNameOfAnyBytesFitsTheTraceHeader) {
  const fs::path log = write("log\xff.jsonl", mooncake_log());
  const CliRun run = cpkv({"import", "mooncake", log.string(), "-o", (dir_ / "o.jsonl").string()});
  ASSERT_EQ(run.status, 0) << run.err;
  std::istringstream trace(slurp(dir_ / "o.jsonl"));
  std::string header;
  std::getline(trace, header);
  EXPECT_EQ(nlohmann::json::parse(header)["source"]["file"], (dir_ / "log\\xFF.jsonl").string()) << header;
  expect_bad_input(cpkv({"import", "mooncake", log.string(), "-o", (dir_ / "p.jsonl").string(), "--source-note", "\xff"}), "--source-note");
  EXPECT_FALSE(fs::exists(dir_ / "p.jsonl"));
}

// A trace whose name is not UTF-8: the replay ran every variant, then failed writing its --json
// ("invalid UTF-8 byte"), the results lost (issue 22, item 7). The name is escaped in the report,
// for the simulator and the model alike.
TEST_F(CliReliability, AReplayOfATraceNamedInAnyBytesWritesItsJson) {
  const fs::path trace = dir_ / "t\xff.jsonl";
  fs::copy_file(fs::path(CPKV_SOURCE_DIR) / "traces" / "samples" / "tiny.jsonl", trace);
  for (const char* backend : {"sim", "model"}) {
    SCOPED_TRACE(backend);
    const fs::path json = dir_ / fmt::format("{}.json", backend);
    const CliRun run = cpkv({"replay", trace.string(), "--backend", backend, "--variant", "staging_direct", "--json", json.string()});
    ASSERT_EQ(run.status, 0) << run.err;
    EXPECT_EQ(nlohmann::json::parse(slurp(json))["trace"], (dir_ / "t\\xFF.jsonl").string());
  }
}

// A positive quantity too small to compute with: 5e-324 GB/s printed "inf" and 1e-300 printed
// 300-digit figures, exit 0 (issue 22, item 19). The range now starts at option_limits::positive_min.
TEST_F(CliReliability, PositiveQuantitiesTooSmallToComputeWithAreRefused) {
  for (const std::vector<std::string> option : {std::vector<std::string>{"--peer-gbps", "5e-324"}, std::vector<std::string>{"--peer-gbps", "1e-300"},
                                                std::vector<std::string>{"--barrier-us", "1e-300"}}) {
    std::vector<std::string> argv = {"replay", "traces/samples/tiny.jsonl", "--backend", "model"};
    argv.insert(argv.end(), option.begin(), option.end());
    SCOPED_TRACE(option[0] + " " + option[1]);
    expect_bad_input(cpkv(argv), option[0]);
  }
  expect_bad_input(cpkv({"soak", "--minutes", "1e-300"}), "--minutes");
}

// A ceilings file's numbers had a range of their own, "positive": barrier_us 1e308 was accepted
// though --barrier-us caps at 1e6, and 5e-324 GB/s modelled infinite times (issue 22, item 19).
// Each now has its option's range: a bandwidth [1e-6, 1e12] GB/s, a latency [1e-6, 1e6] us.
TEST_F(CliReliability, ACeilingsFilesNumbersHaveTheRangesOfTheirOptions) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"peer_gbps": 350, "local_gbps": 2000, "barrier_us": 1e308})", "\"barrier_us\" must be a positive number in [1e-06, 1000000]"},
      {R"({"peer_gbps": 5e-324, "local_gbps": 2000, "barrier_us": 2})", "\"peer_gbps\" must be a positive number in [1e-06, 1000000000000]"},
      {R"({"peer_gbps": 350, "local_gbps": 2000, "barrier_us": 2, "launch_us": 1e7})", "\"launch_us\" must be a positive number in [1e-06, 1000000]"},
      {R"({"ceilings": {"ce_peer_gbps": 300, "local_copy_gbps": 2000, "barrier_us": 2, "barrier_us_graph": 3, "barrier_us_launch_free": 1.5,
          "allreduce_latency_us": 1e300}})", "\"allreduce_latency_us\" must be a number in [1e-06, 1000000] or 0"}};
  for (const auto& [text, words] : cases) {
    SCOPED_TRACE(text);
    const fs::path file = write("ceilings.json", text);
    expect_bad_input(cpkv({"replay", "traces/samples/tiny.jsonl", "--backend", "model", "--ceilings", file.string()}), words);
  }
  const fs::path edge = write("edge.json", R"({"peer_gbps": 1e12, "local_gbps": 1e-6, "barrier_us": 1e6})");  // the ends of the ranges
  EXPECT_EQ(cpkv({"replay", "traces/samples/tiny.jsonl", "--backend", "model", "--ceilings", edge.string()}).status, 0);
}

// An RC_PARAMS key RapidCheck does not know was ignored: `max_sucess=3` ran 100 cases, silently
// (issue 22, item 21). It is refused, with the keys that exist.
TEST_F(CliReliability, AnUnknownRcParamsKeyIsRefusedListingTheKnownOnes) {
  RunSetup typo;
  typo.env.push_back("RC_PARAMS=seed=3 max_sucess=3");
  for (const char* command : {"mutants", "soak"}) {
    const CliRun run = cpkv({command}, typo);
    expect_bad_input(run, "'max_sucess'");
    EXPECT_NE(run.err.find("max_success"), std::string::npos) << run.err;
  }
}

// Interrupting `--chart` left python3 running with ppid 1 (it recreated the hidden PNG after cpkv
// had exited), and the run limit killed only the direct child (issue 22, item 14). A stand-in
// python3 that starts a child of its own and waits: SIGTERM to cpkv must end both, and leave no
// stderr capture file in TMPDIR, nor the chart's own CSV and script (issue 25 item 6: they were
// left in a cpkv-chart-* folder).
TEST_F(CliReliability, AnInterruptedChartLeavesNoHelperProcessBehind) {
  stand_in(dir_, "python3", "if [ \"$1\" = -c ]; then exit 0; fi\nsleep 300 &\necho $! > \"$CPKV_TEST_DIR/grandchild.tmp\"\n"
                            "echo $$ > \"$CPKV_TEST_DIR/child\"\nmv \"$CPKV_TEST_DIR/grandchild.tmp\" \"$CPKV_TEST_DIR/grandchild\"\nwait\n");
  // Every wait bounded: the helper's start (10 s), cpkv's exit, the helpers' end (5 s each).
  const std::string script = fmt::format(
      "export CPKV_PYTHON='{0}/bin/python3' CPKV_TEST_DIR='{0}'; cd '{1}'\n"
      "\"$1\" replay traces/samples/tiny.jsonl --backend model --chart '{0}/c.png' > /dev/null 2>&1 & p=$!\n"
      "for i in $(seq 500); do [ -s '{0}/grandchild' ] && break; sleep 0.02; done\n"
      "kill -TERM $p; wait $p; echo \"exit $?\"\n"
      "gone() {{ s=$(cut -d' ' -f3 /proc/$1/stat 2>/dev/null); [ -z \"$s\" ] || [ \"$s\" = Z ]; }}\n"
      "for pid in $(cat '{0}/child') $(cat '{0}/grandchild'); do\n"
      "  for i in $(seq 250); do gone $pid && break; sleep 0.02; done; gone $pid || echo \"left $pid\"; done\n",
      dir_.string(), CPKV_SOURCE_DIR);
  const CliRun run = bash(script);
  EXPECT_NE(run.out.find("exit 143"), std::string::npos) << run.out << run.err;
  EXPECT_EQ(run.out.find("left"), std::string::npos) << run.out;
  // The helper's stderr capture and the chart's inputs (cli/model_replay.cpp: a folder of them was left) are removed.
  for (const std::string& name : files_in(dir_ / "tmp")) {
    EXPECT_NE(name.rfind("cpkv-child-", 0), 0u) << name;
    EXPECT_NE(name.rfind("cpkv-chart-", 0), 0u) << name;
  }
}

// --chart ran the first python3 on PATH, so under a pyenv shim without matplotlib the interpreter
// configure found (with it) was never used (issue 25 item 6). A python3 first on PATH that marks
// that it ran must not run: the configured interpreter does (it draws, or is named as lacking
// matplotlib in a one-line refusal).
TEST_F(CliReliability, TheChartRunsTheConfiguredInterpreterNotTheFirstOnPath) {
  stand_in(dir_, "python3", "touch \"$CPKV_TEST_DIR/path-python3-ran\"\nexit 0\n");
  RunSetup setup;
  setup.env = {fmt::format("PATH={}:{}", (dir_ / "bin").string(), std::getenv("PATH")), "CPKV_TEST_DIR=" + dir_.string(), "CPKV_PYTHON="};
  const CliRun run = cpkv({"replay", "traces/samples/tiny.jsonl", "--backend", "model", "--chart", (dir_ / "c.png").string()}, setup);
  EXPECT_FALSE(fs::exists(dir_ / "path-python3-ran")) << "the first python3 on PATH ran";
  const bool have_matplotlib = std::system(fmt::format("'{}' -c 'import matplotlib' > /dev/null 2>&1", CPKV_CHART_PYTHON).c_str()) == 0;
  if (have_matplotlib) {
    EXPECT_EQ(run.status, 0) << run.err;
    EXPECT_TRUE(fs::exists(dir_ / "c.png"));
  } else {
    expect_bad_input(run, CPKV_CHART_PYTHON);
    EXPECT_NE(run.err.find("cannot import matplotlib"), std::string::npos) << run.err;
  }
}

// CPKV_PYTHON overrides the configured interpreter. One without matplotlib, or one that does not
// exist, is named in one line (exit 2, nothing run); one that draws makes the chart and leaves
// nothing in TMPDIR.
TEST_F(CliReliability, CpkvPythonPicksTheChartInterpreterAndALackIsNamed) {
  const fs::path lacking = stand_in(dir_, "lacking", "echo \"ModuleNotFoundError: No module named 'matplotlib'\" >&2\nexit 1\n");
  const fs::path drawer = stand_in(dir_, "drawer", "if [ \"$1\" = -c ]; then exit 0; fi\nprintf 'PNG' > \"$3\"\n");
  const std::vector<std::string> args = {"replay", "traces/samples/tiny.jsonl", "--backend", "model", "--chart", (dir_ / "c.png").string()};
  RunSetup setup;
  setup.env = {"CPKV_PYTHON=" + lacking.string()};
  CliRun run = cpkv(args, setup);
  expect_bad_input(run, lacking.string() + " (from CPKV_PYTHON) cannot import matplotlib");
  EXPECT_NE(run.err.find("No module named 'matplotlib'"), std::string::npos) << run.err;
  setup.env = {"CPKV_PYTHON=" + (dir_ / "bin" / "missing").string()};
  expect_bad_input(cpkv(args, setup), (dir_ / "bin" / "missing").string() + " (from CPKV_PYTHON) cannot be started");
  EXPECT_FALSE(fs::exists(dir_ / "c.png"));
  setup.env = {"CPKV_PYTHON=" + drawer.string()};
  run = cpkv(args, setup);
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_EQ(slurp(dir_ / "c.png"), "PNG");
  EXPECT_TRUE(files_in(dir_ / "tmp").empty()) << fmt::format("{}", fmt::join(files_in(dir_ / "tmp"), " "));
}

// Root replacing a user's --json file left it root-owned (issue 22, item 16); the owner and group
// are now kept as the mode is. Giving a file away needs root: elsewhere the test is skipped.
TEST_F(CliReliability, AReplacedOutputKeepsItsOwnerAndGroup) {
  const fs::path json = write("report.json", "old report\n");
  if (::chown(json.c_str(), 4321, 4322) != 0) GTEST_SKIP() << "cannot give a file away here: " << std::strerror(errno);
  const CliRun run = cpkv({"replay", "traces/samples/tiny.jsonl", "--backend", "model", "--json", json.string()});
  ASSERT_EQ(run.status, 0) << run.err;
  struct stat st {};
  ASSERT_EQ(::stat(json.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 4321u);
  EXPECT_EQ(st.st_gid, 4322u);
  EXPECT_NE(slurp(json), "old report\n");
}

}  // namespace

// --- the third audit, the CLI's items (issue 34) ----------------------------------------------------

namespace {

// A `cpkv soak` shard file as docs/sharding.md describes it, with `rows` as given.
std::string soak_shard(const std::string& rows, const std::string& asked = R"({"cases":1})") {
  return fmt::format(R"({{"cpkv_shards":1,"command":"soak","asked":{},"units":2,"shard":{{"k":1,"n":1}},"rows":[{}]}})", asked, rows);
}
constexpr const char* kPassedRow0 = R"({"row":0,"section":"seeds","name":"seed 1","passed":true,"text":"seed 1: ok","seconds":0.5})";
constexpr const char* kPassedRow1 = R"({"row":1,"section":"seeds","name":"seed 2","passed":true,"text":"seed 2: ok","seconds":0.5})";

}  // namespace

// A full disk (the file size limit stands in) emptied the old timeline and event log and exited 0
// with nothing said: the appender's last flush dropped its error and the empty temporary was renamed
// over the old file. Now a failed write is one line naming the output, exit 1, and the old file is
// as it was, with no temporary left.
TEST_F(CliReliability, AFullDiskNeverReplacesAnOldTimelineOrEventLog) {
  // Above the report on stdout and the run's shared-memory region (a file too), below either output.
  constexpr rlim_t kFileBytesMax = rlim_t{1} << 20;
  std::ifstream tiny(fs::path(CPKV_SOURCE_DIR) / "traces" / "samples" / "tiny.jsonl");
  std::string header, batch;
  std::getline(tiny, header);
  std::getline(tiny, batch);
  std::ofstream trace(dir_ / "long.jsonl");
  trace << header << "\n";
  nlohmann::json b = nlohmann::json::parse(batch);
  for (int i = 0; i < 1000; ++i) {
    b["batch"] = i;
    trace << b.dump() << "\n";
  }
  trace.close();
  for (const std::string option : {"--timeline", "--event-log"}) {
    const fs::path target = dir_ / "out.json";
    const std::vector<std::string> args = {"replay", (dir_ / "long.jsonl").string(), "--schedule", "random", "--variant", "v2", option, target.string()};
    ASSERT_EQ(cpkv(args).status, 0);
    ASSERT_GT(fs::file_size(target), kFileBytesMax) << option << ": the output must not fit under the limit for this test to mean anything";
    write("out.json", "old\n");
    RunSetup full;
    full.file_size_max_bytes = kFileBytesMax;
    const CliRun run = cpkv(args, full);
    EXPECT_EQ(run.status, 1) << option << "\n" << run.out << run.err;
    EXPECT_TRUE(one_line(run.err)) << run.err;
    EXPECT_NE(run.err.find(std::strerror(EFBIG)), std::string::npos) << run.err;
    EXPECT_NE(run.err.find(target.string()), std::string::npos) << "names the output, not its temporary: " << run.err;
    EXPECT_EQ(slurp(target), "old\n") << option << ": the old output was replaced";
    EXPECT_EQ(files_in(dir_), (std::vector<std::string>{"long.jsonl", "out.json", "stderr", "stdout", "tmp"})) << option << ": a temporary was left";
    fs::remove(target);
  }
}

// `--per-batch` streams its records into its temporary file as the model makes them (issue 34,
// item 8: 5.1 GB held for a 500k-batch trace). Under an address-space limit that the records of
// this trace overrun when held (measured: 424 MB resident before, 15 MB streamed), the run ends
// and writes them all; a full disk leaves the old file.
TEST_F(CliReliability, PerBatchRecordsAreStreamedNotHeld) {
  constexpr int kBatches = 40000;
  std::ofstream trace(dir_ / "long.jsonl");
  std::ifstream tiny(fs::path(CPKV_SOURCE_DIR) / "traces" / "samples" / "tiny.jsonl");
  std::string header, batch;
  std::getline(tiny, header);
  std::getline(tiny, batch);
  trace << header << "\n";
  nlohmann::json b = nlohmann::json::parse(batch);
  for (int i = 0; i < kBatches; ++i) {
    b["batch"] = i;
    trace << b.dump() << "\n";
  }
  trace.close();
  RunSetup small;
  small.address_space_max_bytes = rlim_t{256} << 20;
  const fs::path csv = dir_ / "per_batch.csv";
  const CliRun run = cpkv({"replay", (dir_ / "long.jsonl").string(), "--backend", "model", "--per-batch", csv.string()}, small);
  ASSERT_EQ(run.status, 0) << run.err;
  std::ifstream in(csv);
  std::int64_t lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  EXPECT_EQ(lines, kBatches + 1) << "a header and a line a batch";
  write("old.jsonl", "old\n");
  RunSetup full;
  full.file_size_max_bytes = rlim_t{8} << 20;  // the trace is read, the records do not fit
  const CliRun failed = cpkv({"replay", (dir_ / "long.jsonl").string(), "--backend", "model", "--per-batch", (dir_ / "old.jsonl").string()}, full);
  EXPECT_EQ(failed.status, 1) << failed.err;
  EXPECT_TRUE(one_line(failed.err)) << failed.err;
  EXPECT_NE(failed.err.find("--per-batch"), std::string::npos) << failed.err;
  EXPECT_EQ(slurp(dir_ / "old.jsonl"), "old\n");
}

// `cpkv merge` reads a shard file with bounds and checks every field (issue 34, items 4, 10, 12,
// 13): nesting 200,000 deep crashed it (SIGSEGV), a FIFO blocked it for good, any size was read,
// row 1.5 was row 1, 2^64 was row 0, negative seconds were printed, a unit twice counted once, and
// a number where a string belongs was a raw json.exception after the table's first lines. Each is
// now one line naming the file (and the field), exit 2, before anything is printed.
TEST_F(CliReliability, MergeRefusesDeepOversizeNonRegularAndMalformedShardFiles) {
  const auto refused = [&](const std::string& name, const std::string& text, const std::string& says) {
    const fs::path file = write(name, text);
    const CliRun run = cpkv({"merge", file.string()});
    expect_bad_input(run, says);
    EXPECT_NE(run.err.find(name), std::string::npos) << "names the file: " << run.err;
  };
  ASSERT_EQ(cpkv({"merge", write("good.json", soak_shard(std::string(kPassedRow0) + "," + kPassedRow1)).string()}).status, 0);
  refused("deep.json", soak_shard(kPassedRow0, std::string(200000, '[') + std::string(200000, ']')), "nested deeper than");
  refused("row_float.json", soak_shard(R"({"row":1.5,"passed":true,"text":"x"})"), "\"row\" is the number 1.5");
  refused("row_huge.json", soak_shard(R"({"row":18446744073709551616,"passed":true,"text":"x"})"), "\"row\"");
  refused("seconds.json", soak_shard(R"({"row":0,"passed":true,"text":"x","seconds":-3})"), "\"seconds\"");
  refused("twice.json", soak_shard(std::string(kPassedRow0) + "," + R"({"row":0,"passed":false,"text":"x","failure":"f"})"), "unit 0 is in rows twice");
  refused("section.json", soak_shard(R"({"row":0,"passed":true,"text":"x","section":7})"), "\"section\" is the number 7, not a string");
  refused("key_twice.json", R"({"cpkv_shards":1,"cpkv_shards":1})", "given twice");
  // Past the size cap: refused by its size, never read (a sparse file: no disk is used).
  const fs::path big = dir_ / "big.json";
  std::ofstream(big) << "{";
  fs::resize_file(big, std::uintmax_t{65} << 20);
  expect_bad_input(cpkv({"merge", big.string()}), "more than the");
  // A FIFO with no writer: refused at once, not waited on (bounded here by timeout(1) should it block).
  ASSERT_EQ(::mkfifo((dir_ / "fifo.json").c_str(), 0600), 0);
  const CliRun fifo = cpkv::test::spawn({"/usr/bin/timeout", "60", cpkv_binary().string(), "merge", (dir_ / "fifo.json").string()}, dir_);
  expect_bad_input(fifo, "a pipe");
}

// A shard file's text reached the terminal raw (issue 34, item 11): an escape sequence cleared the
// screen, a newline forged a line of cpkv's own. Now control characters are written \xNN and a line
// of the file that starts at the margin is indented.
TEST_F(CliReliability, MergePrintsAShardFilesTextWithControlCharactersEscaped) {
  const std::string row = R"({"row":0,"section":"seeds\u001b[2J","name":"seed 1","passed":true,"text":"seed 1: ok\u001b[2J\nmerged: 9 units, 9 passed, 0 failed","seconds":0.5})";
  const CliRun run = cpkv({"merge", write("esc.json", soak_shard(row + "," + kPassedRow1)).string()});
  EXPECT_EQ(run.status, 0) << run.err;
  EXPECT_EQ(run.out.find('\x1b'), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("seed 1: ok\\x1b[2J"), std::string::npos) << run.out;
  EXPECT_EQ(run.out.find("\nmerged: 9 units"), std::string::npos) << "a forged line: " << run.out;
  EXPECT_NE(run.out.find("\nmerged: 2 units, 2 passed, 0 failed"), std::string::npos) << run.out;
}

// `--ceilings` took a key given twice (the last won, unsaid), called 1e400 "not one JSON object",
// and blocked for good on a FIFO (issue 34, items 12 and 14).
TEST_F(CliReliability, CeilingsRefuseADuplicatedKeyAnOutOfRangeNumberAndAFifo) {
  const auto replay = [&](const fs::path& ceilings) {
    return cpkv::test::spawn({"/usr/bin/timeout", "60", cpkv_binary().string(), "replay", "traces/samples/tiny.jsonl", "--backend", "model", "--ceilings",
                              ceilings.string()},
                             dir_);
  };
  expect_bad_input(replay(write("twice.json", R"({"peer_gbps":100,"local_gbps":500,"barrier_us":5,"peer_gbps":1})")), "\"peer_gbps\" is given twice");
  expect_bad_input(replay(write("huge.json", R"({"peer_gbps":1e400,"local_gbps":500,"barrier_us":5})")), "out of range");
  ASSERT_EQ(::mkfifo((dir_ / "fifo.json").c_str(), 0600), 0);
  expect_bad_input(replay(dir_ / "fifo.json"), "a pipe");
}

// `--out DIR` as `link/` or `link/.` wrote through the link (`link` was refused), and a name with
// a newline broke every replay line naming a counterexample (issue 34, item 20). Refused before
// any work.
TEST_F(CliReliability, OutFolderBehindALinkOrWithAControlCharacterIsRefused) {
  fs::create_directories(dir_ / "real");
  fs::create_directory_symlink(dir_ / "real", dir_ / "link");
  for (const std::string spelled : {"link", "link/", "link/."}) {
    expect_bad_input(cpkv({"explore", "--cp-max", "1", "--layers-max", "1", "--out", (dir_ / spelled).string()}), "a symbolic link");
  }
  expect_bad_input(cpkv({"explore", "--cp-max", "1", "--layers-max", "1", "--out", (dir_ / "new\nline").string()}), "control character");
  EXPECT_TRUE(fs::is_empty(dir_ / "real"));
  EXPECT_FALSE(fs::exists(dir_ / "new\nline"));
}

// The previous audit's open lines: --stuck-ms-max 1 was accepted (and raised unseen to the
// launcher's floor), `cpkv import vllm` did not name `vllm`, and pool_pages 2^64 was "a non-integer
// number".
TEST_F(CliReliability, StuckMsBelowTheFloorAnUnknownImporterAndAHugePoolAreNamed) {
  expect_bad_input(cpkv({"replay", "traces/samples/tiny.jsonl", "--ranks-as", "processes", "--stuck-ms-max", "1"}), "--stuck-ms-max");
  const CliRun floor = cpkv({"replay", "traces/samples/tiny.jsonl", "--ranks-as", "processes", "--stuck-ms-max", "99"});
  EXPECT_NE(floor.err.find("100"), std::string::npos) << "names the floor: " << floor.err;
  const CliRun vllm = cpkv({"import", "vllm", "x.log"});
  expect_bad_input(vllm, "'vllm'");
  EXPECT_NE(vllm.err.find("mooncake"), std::string::npos) << vllm.err;
  std::ifstream tiny(fs::path(CPKV_SOURCE_DIR) / "traces" / "samples" / "tiny.jsonl");
  std::string header, rest, line;
  std::getline(tiny, header);
  while (std::getline(tiny, line)) rest += line + "\n";
  nlohmann::json h = nlohmann::json::parse(header);
  const std::string text = h.dump();
  const std::string key = fmt::format("\"pool_pages\":{}", h.at("pool_pages").dump());
  ASSERT_NE(text.find(key), std::string::npos) << text;
  const std::string huge = text.substr(0, text.find(key)) + "\"pool_pages\":18446744073709551616" + text.substr(text.find(key) + key.size());
  const CliRun pool = cpkv({"replay", write("huge_pool.jsonl", huge + "\n" + rest).string(), "--backend", "model"});
  expect_bad_input(pool, "pool_pages");
  EXPECT_NE(pool.err.find("out of range"), std::string::npos) << pool.err;
  EXPECT_EQ(pool.err.find("non-integer"), std::string::npos) << pool.err;
}

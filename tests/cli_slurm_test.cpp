// scripts/slurm-soak.sh (issue 26, item 3; docs/sharding.md): the soak (or the mutation suite, or
// the explorer) as a Slurm array job, one shard per task, merged by a job that runs after it.
// Slurm is not installed here and no controller can run, so `submit` runs against a stand-in
// `sbatch` first on PATH, written by the test, that records its arguments and prints a job id as
// `sbatch --parsable` does; the commands it recorded are then run by hand with the variables Slurm
// sets in an array task (SLURM_ARRAY_TASK_ID, SLURM_ARRAY_TASK_COUNT, ..._MIN, ..._MAX), and the
// merged rows must be the unsharded run's. Bad arguments: one line, exit 2, nothing submitted.
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli_run.hpp"

namespace cpkv::test {
namespace {

using nlohmann::json;

fs::path script() { return fs::path(CPKV_SOURCE_DIR) / "scripts" / "slurm-soak.sh"; }

// A scratch folder with a stand-in sbatch in stub/: call n writes its arguments, one a line, to
// stub/sbatch-n.args and CPKV_ROOT to stub/sbatch-n.root; the first prints "1001;testcluster" (the
// id;cluster form of a federated --parsable), later ones 1002, 1003, ...
struct SlurmRun {
  fs::path dir;
  explicit SlurmRun(const std::string& stem) : dir(temp_dir(stem)) {
    fs::create_directories(dir / "stub");
    const fs::path stub = dir / "stub" / "sbatch";
    std::ofstream(stub) << fmt::format(
        "#!/bin/sh\n"
        "# A stand-in for Slurm's sbatch (cli_slurm_test.cpp): Slurm cannot run here.\n"
        "calls='{0}/calls'\n"
        "n=$(( $(cat \"$calls\" 2>/dev/null || echo 0) + 1 ))\n"
        "echo \"$n\" > \"$calls\"\n"
        ": > '{0}/sbatch-'$n.args\n"
        "for a in \"$@\"; do printf '%s\\n' \"$a\" >> '{0}/sbatch-'$n.args; done\n"
        "printf '%s' \"$CPKV_ROOT\" > '{0}/sbatch-'$n.root\n"
        "if [ \"$n\" = 1 ]; then echo '1001;testcluster'; else echo \"100$n\"; fi\n",
        (dir / "stub").string());
    fs::permissions(stub, fs::perms::owner_all);
  }
  ~SlurmRun() { fs::remove_all(dir); }
  std::string file(const std::string& name) const { return (dir / name).string(); }
  int sbatch_calls() const { return fs::exists(dir / "stub" / "calls") ? std::stoi(slurp(dir / "stub" / "calls")) : 0; }
  std::vector<std::string> sbatch_args(int n) const {
    std::vector<std::string> args;
    std::istringstream in(slurp(dir / "stub" / fmt::format("sbatch-{}.args", n)));
    for (std::string line; std::getline(in, line);) args.push_back(line);
    return args;
  }
  // The script with `args` (no shell), the stand-in sbatch first on PATH, `env` added.
  CliRun run(std::vector<std::string> args, std::vector<std::string> env = {}, const std::string& name = "script") const {
    args.insert(args.begin(), {"/bin/bash", script().string()});
    return run_argv(args, std::move(env), name);
  }
  CliRun run_argv(const std::vector<std::string>& argv, std::vector<std::string> env, const std::string& name) const {
    env.push_back(fmt::format("PATH={}:{}", (dir / "stub").string(), std::getenv("PATH") ? std::getenv("PATH") : "/usr/bin:/bin"));
    RunSetup setup;
    setup.env = std::move(env);
    setup.cwd = dir;
    return spawn(argv, dir / name, setup);
  }
};

bool has(const std::vector<std::string>& args, const std::string& arg) { return std::find(args.begin(), args.end(), arg) != args.end(); }

// An sbatch call's arguments split at the script: sbatch's own options, then the script's.
struct SbatchCall {
  std::vector<std::string> sbatch, script_args;
};
SbatchCall split_at_script(const std::vector<std::string>& args) {
  const auto at = std::find(args.begin(), args.end(), script().string());
  EXPECT_NE(at, args.end()) << "sbatch is given the script: " << fmt::format("{}", fmt::join(args, " "));
  if (at == args.end()) return {args, {}};
  return {std::vector<std::string>(args.begin(), at), std::vector<std::string>(at + 1, args.end())};
}

// The merge's rows: the lines between its header and its summary.
std::vector<std::string> merged_lines(const std::string& out) {
  std::vector<std::string> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("cpkv merge:", 0) == 0 || line.rfind("merged:", 0) == 0) continue;
    lines.push_back(line);
  }
  return lines;
}

// What a row says apart from its time and the folder its counterexample went to.
json key(json row) {
  row.erase("seconds");
  row.erase("replay");
  row.erase("text");
  return row;
}

// submit hands sbatch an array 0..N-1 whose tasks run `shard` with the soak's options, and a merge
// that waits for the whole array (afterany: a failed shard is reported, not waited on forever); the
// two recorded commands, run as Slurm would run them, give the unsharded soak's rows.
TEST(CliSlurm, SoakSubmittedAsAnArrayJobMergesToTheUnshardedRun) {
  const SlurmRun slurm("cpkv_cli_slurm_soak");
  const std::string soak = "--seed 5 --seeds 4 --cases 1 --minutes 10";
  const CliRun whole = run_cpkv(fmt::format("soak {} --json '{}'", soak, slurm.file("all.json")));
  ASSERT_EQ(whole.status, 0) << "the correct protocol passes the soak: " << whole.err << whole.out;
  const json all = json::parse(slurp(slurm.file("all.json")));
  ASSERT_EQ(all.at("rows").size(), 4u);

  const std::string results = slurm.file("results");
  const CliRun submit = slurm.run({"submit", "--shards", "2", "--seed", "5", "--seeds", "4", "--cases", "1", "--minutes", "10", "--out", results,
                                   "--cpkv", cpkv_binary().string(), "--", "--partition=cpu"});
  ASSERT_EQ(submit.status, 0) << submit.err << submit.out;
  ASSERT_EQ(slurm.sbatch_calls(), 2) << "the array, then the merge";
  EXPECT_NE(submit.out.find("1001;testcluster"), std::string::npos) << submit.out;
  EXPECT_NE(submit.out.find("1002"), std::string::npos) << submit.out;

  const SbatchCall array = split_at_script(slurm.sbatch_args(1));
  EXPECT_TRUE(has(array.sbatch, "--array=0-1")) << fmt::format("{}", fmt::join(array.sbatch, " "));
  EXPECT_TRUE(has(array.sbatch, "--partition=cpu")) << "the user's sbatch arguments are passed on";
  EXPECT_TRUE(has(array.sbatch, "--time=20")) << "a soak of 10 minutes asks for 10 more: " << fmt::format("{}", fmt::join(array.sbatch, " "));
  ASSERT_FALSE(array.script_args.empty());
  EXPECT_EQ(array.script_args.front(), "shard");
  for (const std::string& option : {"--seed", "--seeds", "--cases", "--minutes"}) {
    const auto at = std::find(array.script_args.begin(), array.script_args.end(), option);
    ASSERT_NE(at, array.script_args.end()) << option << " is passed to the shards";
  }
  const SbatchCall merge = split_at_script(slurm.sbatch_args(2));
  EXPECT_TRUE(has(merge.sbatch, "--dependency=afterany:1001")) << "the merge waits on the array's id: " << fmt::format("{}", fmt::join(merge.sbatch, " "));
  EXPECT_TRUE(std::none_of(merge.sbatch.begin(), merge.sbatch.end(), [](const std::string& a) { return a.rfind("--array", 0) == 0; }));
  ASSERT_FALSE(merge.script_args.empty());
  EXPECT_EQ(merge.script_args.front(), "merge");
  const std::string root = slurp(slurm.dir / "stub" / "sbatch-1.root");
  EXPECT_EQ(fs::canonical(root), fs::canonical(CPKV_SOURCE_DIR)) << "CPKV_ROOT names the checkout for the job's copy of the script";

  // The array's two tasks, as Slurm runs them.
  std::vector<json> rows;
  for (int task = 0; task < 2; ++task) {
    std::vector<std::string> argv = {"/bin/bash", script().string()};
    argv.insert(argv.end(), array.script_args.begin(), array.script_args.end());
    const CliRun shard = slurm.run_argv(argv, {fmt::format("SLURM_ARRAY_TASK_ID={}", task), "SLURM_ARRAY_TASK_COUNT=2", "SLURM_ARRAY_TASK_MIN=0",
                                               "SLURM_ARRAY_TASK_MAX=1", "SLURM_ARRAY_JOB_ID=1001", "CPKV_ROOT=" + root},
                                        fmt::format("task{}", task));
    ASSERT_EQ(shard.status, 0) << shard.err << shard.out;
    EXPECT_NE(shard.out.find(fmt::format("shard {}/2", task + 1)), std::string::npos) << shard.out;
    const json part = json::parse(slurp(fmt::format("{}/soak-{}-of-2.json", results, task + 1)));
    EXPECT_EQ(part.at("command"), "soak");
    EXPECT_EQ(part.at("shard"), (json{{"k", task + 1}, {"n", 2}}));
    for (const json& row : part.at("rows")) rows.push_back(key(row));
    EXPECT_TRUE(fs::exists(fmt::format("{}/soak-{}-of-2.xml", results, task + 1)));
  }
  struct stat st {};
  ASSERT_EQ(::stat((results + "/counterexamples").c_str(), &st), 0) << "the shards' --out folder";
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  std::sort(rows.begin(), rows.end(), [](const json& a, const json& b) { return a.at("row").get<std::size_t>() < b.at("row").get<std::size_t>(); });
  std::vector<json> unsharded;
  for (const json& row : all.at("rows")) unsharded.push_back(key(row));
  EXPECT_EQ(rows, unsharded) << "the union of the shards is the unsharded soak";

  std::vector<std::string> argv = {"/bin/bash", script().string()};
  argv.insert(argv.end(), merge.script_args.begin(), merge.script_args.end());
  const CliRun merged = slurm.run_argv(argv, {"SLURM_JOB_ID=1002", "CPKV_ROOT=" + root}, "merge");
  ASSERT_EQ(merged.status, 0) << merged.err << merged.out;
  std::vector<std::string> expected = {"seeds"};
  for (const json& row : all.at("rows")) expected.push_back(row.at("text").get<std::string>());
  EXPECT_EQ(merged_lines(merged.out), expected) << merged.out;
  EXPECT_NE(merged.out.find("merged: 4 units, 4 passed, 0 failed"), std::string::npos) << merged.out;
  const std::string xml = slurp(results + "/soak-merged.xml");
  EXPECT_NE(xml.find("tests=\"4\" failures=\"0\""), std::string::npos) << xml;
}

// The explorer through the script's shard and merge modes by hand (its options and --no-shapes passed
// on): the merged rows are the unsharded run's, and a found counterexample lands in DIR/counterexamples.
TEST(CliSlurm, ExploreShardsByHandMergeToTheUnshardedRun) {
  const SlurmRun slurm("cpkv_cli_slurm_explore");
  const std::vector<std::string> explore = {"--cp-max", "1", "--layers-max", "2", "--no-shapes"};
  const CliRun whole = run_cpkv(fmt::format("explore {} --json '{}'", fmt::join(explore, " "), slurm.file("all.json")));
  ASSERT_TRUE(whole.status == 0 || whole.status == 1) << whole.err << whole.out;
  int worst = 0;
  const json all = json::parse(slurp(slurm.file("all.json")));
  const std::string results = slurm.file("results");
  std::vector<json> rows;
  for (int task = 0; task < 2; ++task) {
    std::vector<std::string> args = {"shard", "--suite", "explore", "--out", results, "--cpkv", cpkv_binary().string()};
    args.insert(args.end(), explore.begin(), explore.end());
    const CliRun shard = slurm.run(args, {fmt::format("SLURM_ARRAY_TASK_ID={}", task), "SLURM_ARRAY_TASK_COUNT=2"}, fmt::format("task{}", task));
    ASSERT_TRUE(shard.status == 0 || shard.status == 1) << shard.err << shard.out;
    worst = std::max(worst, shard.status);
    const json part = json::parse(slurp(fmt::format("{}/explore-{}-of-2.json", results, task + 1)));
    for (const json& row : part.at("rows")) {
      if (row.at("found").get<bool>()) EXPECT_NE(row.at("replay").get<std::string>().find(results + "/counterexamples/"), std::string::npos) << row.dump();
      rows.push_back(key(row));
    }
  }
  std::sort(rows.begin(), rows.end(), [](const json& a, const json& b) { return a.at("row").get<std::size_t>() < b.at("row").get<std::size_t>(); });
  std::vector<json> unsharded;
  for (const json& row : all.at("rows")) unsharded.push_back(key(row));
  EXPECT_EQ(rows, unsharded);
  EXPECT_EQ(worst, whole.status) << "the shards fail where the whole run fails";
  const CliRun merged = slurm.run({"merge", "--suite", "explore", "--shards", "2", "--out", results, "--cpkv", cpkv_binary().string()}, {}, "merge");
  EXPECT_EQ(merged.status, whole.status) << merged.err << merged.out;
  EXPECT_NE(merged.out.find(fmt::format("merged: {} units", unsharded.size())), std::string::npos) << merged.out;
  EXPECT_TRUE(fs::exists(results + "/explore-merged.xml"));
}

// Bad arguments are one line on stderr, exit 2, nothing on stdout and nothing submitted.
TEST(CliSlurm, BadArgumentsAreOneLineExitTwoAndSubmitNothing) {
  const SlurmRun slurm("cpkv_cli_slurm_bad");
  std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"frobnicate"}, "the first argument is submit, shard or merge"},
      {{"submit", "--shards", "2", "--seeds", "4"}, "--suite soak needs --seed"},
      {{"submit", "--shards", "0", "--seed", "5"}, "--shards N"},
      {{"submit", "--shards"}, "--shards needs a value"},
      {{"submit", "--suite", "bogus", "--shards", "2"}, "--suite is soak, mutants or explore"},
      {{"submit", "--suite", "mutants", "--shards", "2", "--seeds", "3"}, "--seeds is not an option of --suite mutants"},
      {{"submit", "--shards", "5", "--seed", "1", "--seeds", "4"}, "more than --seeds 4"},
      {{"submit", "--shards", "2", "--seed", "1", "--minutes", "soon"}, "--minutes"},
      {{"shard", "--seed", "5", "--bogus", "1"}, "unknown argument '--bogus'"},
      {{"shard", "--seed", "5"}, "SLURM_ARRAY_TASK_ID"},
      {{"merge"}, "--shards N"},
  };
  const std::string cpkv = cpkv_binary().string();
  cases.push_back({{"submit", "--shards", "2", "--seed", "1", "--cases", "many", "--cpkv", cpkv}, "--cases: 'many'"});  // cpkv's own check, before submitting
  cases.push_back({{"submit", "--suite", "explore", "--shards", "2", "--cp-max", "9", "--cpkv", cpkv}, "--cp-max"});
  cases.push_back({{"submit", "--shards", "2", "--seed", "1", "--cpkv", slurm.file("no-such-cpkv")}, "no such executable"});
  for (const auto& [args, what] : cases) {
    SCOPED_TRACE(fmt::format("{}", fmt::join(args, " ")));
    expect_bad_input(slurm.run(args), what);
  }
  // --array=0-2:2 (a step): two tasks, ids 0 and 2.
  const CliRun stepped = slurm.run({"shard", "--seed", "5"}, {"SLURM_ARRAY_TASK_ID=0", "SLURM_ARRAY_TASK_COUNT=2", "SLURM_ARRAY_TASK_MIN=0",
                                                             "SLURM_ARRAY_TASK_MAX=2"});
  expect_bad_input(stepped, "without a step");
  EXPECT_EQ(slurm.sbatch_calls(), 0) << "nothing was submitted";
}

}  // namespace
}  // namespace cpkv::test

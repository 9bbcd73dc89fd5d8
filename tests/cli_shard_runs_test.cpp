// `cpkv soak` and `cpkv explore` as shards (issue 26, item 3; docs/sharding.md): unit i of a run
// (soak: the i-th seed the master seed draws; explore: the i-th exploration its tables print) is
// shard i % N + 1's (K 1-based, as `cpkv mutants --shard`), so the union of the N shards' rows is
// the unsharded run's rows and `cpkv merge` folds them back; `--out DIR` puts counterexamples in a
// folder the user owns (made 0700), refusing one that is a link, a file or writable by others.
#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "cli_run.hpp"

namespace cpkv::test {
namespace {

using nlohmann::json;

struct Runs {
  fs::path dir;
  explicit Runs(const std::string& stem) : dir(temp_dir(stem)) {}
  ~Runs() { fs::remove_all(dir); }
  std::string file(const std::string& name) const { return (dir / name).string(); }
  json read(const std::string& name) const { return json::parse(slurp(file(name))); }
};

// What a row says apart from how long it took: everything but seconds, and the replay line's
// folder (a per-run private folder).
json key(json row) {
  row.erase("seconds");
  row.erase("replay");
  row.erase("text");  // holds the seconds column
  return row;
}

// Runs `command` unsharded and as shards 1/N..N/N; checks each shard holds only its units, that
// the union of the shards' rows is the unsharded run's, and that `cpkv merge` of the shard files
// prints every row once, in order, and exits as the unsharded run did.
void expect_union_is_unsharded(const Runs& runs, const std::string& command, std::size_t n) {
  const CliRun whole = run_cpkv(fmt::format("{} --json '{}'", command, runs.file("all.json")));
  ASSERT_TRUE(whole.status == 0 || whole.status == 1) << whole.err << whole.out;
  const json all = runs.read("all.json");
  ASSERT_GE(all.at("rows").size(), n) << "every shard has a unit";
  EXPECT_EQ(all.at("shard"), (json{{"k", 1}, {"n", 1}}));
  std::vector<json> unsharded, merged;
  for (const json& row : all.at("rows")) unsharded.push_back(key(row));
  std::string files;
  int worst = 0;
  for (std::size_t k = 1; k <= n; ++k) {
    const std::string name = fmt::format("s{}.json", k);
    const CliRun shard = run_cpkv(fmt::format("{} --shard {}/{} --json '{}' --junit '{}'", command, k, n, runs.file(name), runs.file(name + ".xml")));
    ASSERT_TRUE(shard.status == 0 || shard.status == 1) << shard.err << shard.out;
    worst = std::max(worst, shard.status);
    EXPECT_NE(shard.out.find(fmt::format("shard {}/{}", k, n)), std::string::npos) << "the header names the shard: " << shard.out;
    const json part = runs.read(name);
    EXPECT_EQ(part.at("shard"), (json{{"k", k}, {"n", n}}));
    for (const json& row : part.at("rows")) {
      EXPECT_EQ(row.at("row").get<std::size_t>() % n, k - 1) << row.dump();
      merged.push_back(key(row));
    }
    EXPECT_NE(slurp(runs.file(name + ".xml")).find(fmt::format("tests=\"{}\"", part.at("rows").size())), std::string::npos);
    files += fmt::format(" '{}'", runs.file(name));
  }
  EXPECT_EQ(worst, whole.status) << "the shards fail where the whole run fails";
  const auto by_row = [](const json& a, const json& b) { return a.at("row").get<std::size_t>() < b.at("row").get<std::size_t>(); };
  std::sort(merged.begin(), merged.end(), by_row);
  EXPECT_EQ(merged, unsharded);
  const CliRun merge = run_cpkv(fmt::format("merge{} --junit '{}'", files, runs.file("merged.xml")));
  EXPECT_EQ(merge.status, whole.status) << merge.err << merge.out;
  std::size_t at = 0;
  for (const json& row : all.at("rows")) {  // every row's name, in the unsharded order
    const std::string name = row.at("name").get<std::string>();
    const std::string first_word = name.substr(0, name.find(' '));
    at = merge.out.find(first_word, at);
    ASSERT_NE(at, std::string::npos) << name << " in order in " << merge.out;
  }
  EXPECT_NE(merge.out.find(fmt::format("merged: {} units", all.at("rows").size())), std::string::npos) << merge.out;
  EXPECT_NE(slurp(runs.file("merged.xml")).find(fmt::format("tests=\"{}\"", all.at("rows").size())), std::string::npos);
}

TEST(CliShardRuns, SoakUnionOfShardsIsTheUnshardedRun) {
  const Runs runs("cpkv_cli_shard_soak");
  expect_union_is_unsharded(runs, "soak --seed 11 --seeds 5 --cases 2 --minutes 10", 3);
  const json all = runs.read("all.json");
  ASSERT_EQ(all.at("rows").size(), 5u);
  std::set<std::uint64_t> seeds;
  for (const json& row : all.at("rows")) seeds.insert(row.at("seed").get<std::uint64_t>());
  EXPECT_EQ(seeds.size(), 5u) << "five different seeds";
  // Every shard must draw the same seeds: --shard without --seed is refused.
  expect_bad_input(run_cpkv("soak --shard 1/2 --seeds 2"), "--seed");
  expect_bad_input(run_cpkv("soak --seed 3 --seeds 2 --shard 3/2"), "--shard 3/2");
}

TEST(CliShardRuns, ExploreUnionOfShardsIsTheUnshardedRun) {
  const Runs runs("cpkv_cli_shard_explore");
  expect_union_is_unsharded(runs, "explore --cp-max 2 --layers-max 2 --shape-layers 2", 4);
  const json all = runs.read("all.json");
  // The grid (2 x 2), the three planted bugs, the shapes of cp 1 and 2, one hunt per planted bug.
  EXPECT_EQ(all.at("units"), all.at("rows").size());
  expect_bad_input(run_cpkv(fmt::format("explore --cp-max 1 --layers-max 1 --no-shapes --shard 1/{}", all.at("rows").size())), "N is outside");
}

// The smallest grid still shows every planted bug found: single_half needs a second layer to reuse a
// half, so its row runs at 2 layers under --layers-max 1 (it ran at 1, was proved, and the run exited 1).
TEST(CliShardRuns, ExploreFindsEveryPlantedBugUnderTheSmallestGrid) {
  const CliRun run = run_cpkv("explore --cp-max 1 --layers-max 1 --no-shapes");
  EXPECT_EQ(run.status, 0) << run.out << run.err;
  for (const char* bug : {"single_half", "no_barrier", "arrive_before_fill"}) {
    EXPECT_NE(run.out.find(fmt::format("  2       2 {}", bug)), std::string::npos) << bug << " at cp 2, 2 layers:\n" << run.out;
  }
  EXPECT_EQ(run.out.find("proved: no violation in any interleaving\n", run.out.find("single_half")), std::string::npos) << run.out;
}

// Merge takes one run's shards only: the same command, options and N, every shard once.
TEST(CliShardRuns, MergeRefusesMixedMissingAndForeignShards) {
  const Runs runs("cpkv_cli_shard_refusals");
  const std::string explore = "explore --cp-max 1 --layers-max 2 --no-shapes";
  for (int k = 1; k <= 2; ++k) ASSERT_LE(run_cpkv(fmt::format("{} --shard {}/2 --json '{}'", explore, k, runs.file(fmt::format("e{}.json", k)))).status, 1);
  ASSERT_EQ(run_cpkv(fmt::format("soak --seed 3 --seeds 2 --cases 1 --shard 2/2 --json '{}'", runs.file("s2.json"))).status, 0);
  ASSERT_EQ(run_cpkv(fmt::format("explore --cp-max 1 --layers-max 1 --no-shapes --shard 2/2 --json '{}'", runs.file("o2.json"))).status, 0);
  const std::string e1 = runs.file("e1.json"), e2 = runs.file("e2.json");
  expect_bad_input(run_cpkv(fmt::format("merge '{}'", e1)), "shard 2 of 2 missing");
  expect_bad_input(run_cpkv(fmt::format("merge '{}' '{}'", e1, e1)), "is also");
  expect_bad_input(run_cpkv(fmt::format("merge '{}' '{}'", e1, runs.file("s2.json"))), "command soak");
  expect_bad_input(run_cpkv(fmt::format("merge '{}' '{}'", e1, runs.file("o2.json"))), "options");
  json moved = runs.read("e2.json");
  moved["rows"][0]["row"] = 0;  // shard 2 of 2 holds odd units only
  expect_bad_input(run_cpkv(fmt::format("merge '{}' '{}'", e1, write_temp("cpkv_cli_shard_refusals", "moved.json", moved.dump()))), "is not shard 2/2's");
  json dropped = runs.read("e2.json");
  dropped["rows"].erase(dropped["rows"].begin());
  expect_bad_input(run_cpkv(fmt::format("merge '{}' '{}'", e1, write_temp("cpkv_cli_shard_refusals", "dropped.json", dropped.dump()))), "is in no file");
  // A failed row fails the merge.
  json failed = runs.read("e2.json");
  failed["rows"][0]["passed"] = false;
  const CliRun bad = run_cpkv(fmt::format("merge '{}' '{}'", e1, write_temp("cpkv_cli_shard_refusals", "failed.json", failed.dump())));
  EXPECT_EQ(bad.status, 1) << bad.err << bad.out;
  EXPECT_NE(bad.out.find("1 failed"), std::string::npos) << bad.out;
}

// --out DIR: counterexamples (trace and schedule, named by the replay line) go there, in a folder
// made 0700; a replay line from it reproduces the planted bug. The default stays the private
// per-run folder in $TMPDIR. A DIR that is a link, a file, writable by others or under a missing
// parent is one line, exit 2, before any work.
TEST(CliShardRuns, OutPutsCounterexamplesInAFolderTheUserOwns) {
  const Runs runs("cpkv_cli_shard_out");
  const std::string out = runs.file("found");
  const CliRun explore = run_cpkv(fmt::format("explore --cp-max 2 --layers-max 2 --no-shapes --out '{}' --json '{}'", out, runs.file("e.json")));
  ASSERT_EQ(explore.status, 0) << explore.err << explore.out;
  struct stat st {};
  ASSERT_EQ(::stat(out.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  std::string replay;
  const json rows = runs.read("e.json").at("rows");
  for (const json& row : rows) {
    if (!row.at("found").get<bool>()) continue;
    replay = row.at("replay").get<std::string>();
    EXPECT_NE(replay.find(out + "/"), std::string::npos) << replay;
  }
  ASSERT_EQ(replay.rfind("cpkv replay ", 0), 0u) << replay;
  std::size_t files = 0;
  std::size_t timelines = 0;
  for (const auto& entry : fs::directory_iterator(out)) {
    if (!entry.is_regular_file()) continue;
    const std::string name = entry.path().filename().string();
    const bool timeline = name.size() > 14 && name.compare(name.size() - 14, 14, ".timeline.json") == 0;
    (timeline ? timelines : files) += 1;
  }
  EXPECT_EQ(files, 6u) << "a trace and a schedule for each of the three planted bugs found";
  EXPECT_EQ(timelines, 3u) << "a timeline beside each of the three counterexamples (issue 26 item 1)";
  const CliRun again = run_cpkv(replay.substr(5));
  EXPECT_EQ(again.status, 1) << "the counterexample reproduces: " << again.out << again.err;
  // An existing folder of ours is used as it is; mutants' counterexamples land there too.
  const CliRun mutants = run_cpkv(fmt::format("mutants --cases 5 --seed 3 --shard 2/5 --out '{}'", out));
  EXPECT_EQ(mutants.status, 0) << mutants.err << mutants.out;
  EXPECT_NE(mutants.out.find("replay: cpkv replay " + out + "/"), std::string::npos) << mutants.out;
  fs::create_directory_symlink(out, runs.file("link"));
  expect_bad_input(run_cpkv(fmt::format("explore --cp-max 1 --layers-max 1 --no-shapes --out '{}'", runs.file("link"))), "symbolic link");
  expect_bad_input(run_cpkv(fmt::format("mutants --out '{}'", runs.file("e.json"))), "not a folder");
  expect_bad_input(run_cpkv(fmt::format("soak --seeds 1 --out '{}'", runs.file("no/such/folder"))), "cannot create it");
  fs::create_directory(runs.file("open"));
  fs::permissions(runs.file("open"), fs::perms::all);
  expect_bad_input(run_cpkv(fmt::format("soak --seeds 1 --out '{}'", runs.file("open"))), "writable by others");
  expect_bad_input(run_cpkv(fmt::format("mutants --backend cuda --out '{}'", out)), "--out");
}

// A counterexample's replay and its timeline are written each on its own: a timeline that cannot be
// written (here its name is taken by a folder) leaves the replay that was written, named on the row
// and printed, and the row says the timeline is missing instead of naming a file that is not there
// (or one an earlier run left).
TEST(CliShardRuns, ExploreKeepsTheReplayWhenTheTimelineCannotBeWritten) {
  const Runs runs("cpkv_cli_shard_timeline");
  const std::string out = runs.file("found");
  fs::create_directory(out);
  fs::permissions(out, fs::perms::owner_all, fs::perm_options::replace);
  const std::string stem = out + "/explore-cp2-layers2-single_half";  // the grid's planted bugs run at cp 2, min(3, layers max) layers
  fs::create_directory(stem + ".timeline.json");
  const CliRun explore = run_cpkv(fmt::format("explore --cp-max 2 --layers-max 2 --no-shapes --out '{}' --json '{}'", out, runs.file("e.json")));
  ASSERT_EQ(explore.status, 0) << explore.err << explore.out;
  std::size_t checked = 0;
  const json rows = runs.read("e.json").at("rows");
  for (const json& row : rows) {
    if (row.at("name") != "cp 2 layers 2 single_half") continue;
    ++checked;
    const std::string replay = row.at("replay").get<std::string>();
    EXPECT_EQ(replay.rfind("cpkv replay ", 0), 0u) << "the replay was written: " << replay;
    EXPECT_TRUE(fs::is_regular_file(stem + ".jsonl"));
    EXPECT_TRUE(fs::is_regular_file(stem + ".schedule"));
    EXPECT_NE(explore.out.find("    replay: " + replay + "\n"), std::string::npos) << explore.out;
  }
  EXPECT_EQ(checked, 1u) << "the row of single_half at cp 2, 2 layers";
  EXPECT_EQ(explore.out.find("    timeline: " + stem + ".timeline.json"), std::string::npos) << "the folder is no timeline: " << explore.out;
  EXPECT_NE(explore.out.find("    timeline: none (not written: "), std::string::npos) << explore.out;
  // The other two planted bugs' timelines were written and are named.
  EXPECT_NE(explore.out.find("    timeline: " + out + "/explore-cp2-layers2-no_barrier.timeline.json\n"), std::string::npos) << explore.out;
}

}  // namespace
}  // namespace cpkv::test

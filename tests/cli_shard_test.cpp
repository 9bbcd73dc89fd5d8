// `cpkv mutants --shard K/N --json FILE` and `cpkv merge` (issue 26, item 3): the suite's rows (none,
// then every planted bug the simulator holds) split into N shards, row i to shard i % N + 1 (K is
// 1-based); the union of the shards is the unsharded run, and merge folds the shard files into the
// table `cpkv mutants` prints, refusing files of another run, overlapping rows and missing shards.
#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "cli_run.hpp"

namespace cpkv::test {
namespace {

using nlohmann::json;

// What a row says, for comparing runs: mutant, caught, first property, invariant.
using RowKey = std::tuple<std::string, bool, json, json>;
RowKey key(const json& row) { return {row.at("mutant").get<std::string>(), row.at("caught").get<bool>(), row.at("first_property"), row.at("invariant")}; }

// The table's row lines (mutant, verdict, first property, invariant), without times and replay paths.
std::vector<std::string> table_rows(const std::string& out) {
  std::vector<std::string> rows;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string mutant, verdict, by, invariant;
    words >> mutant >> verdict >> by >> invariant;
    if (mutant == "none" || verdict == "yes" || verdict == "NO") rows.push_back(fmt::format("{} {} {} {}", mutant, verdict, by, invariant));
  }
  return rows;
}

struct ShardRuns {
  fs::path dir = temp_dir("cpkv_cli_shard");
  std::string file(const std::string& name) const { return (dir / name).string(); }
  // `cpkv mutants --cases 5 --seed 3` with `extra`, its JSON written to `name`.
  CliRun mutants(const std::string& extra, const std::string& name) const {
    return run_cpkv(fmt::format("mutants --cases 5 --seed 3 {} --json '{}'", extra, file(name)));
  }
  json read(const std::string& name) const { return json::parse(slurp(file(name))); }
};

TEST(CliShard, UnionOfThreeShardsIsTheUnshardedRun) {
  const ShardRuns runs;
  const CliRun whole = runs.mutants("", "all.json");
  ASSERT_EQ(whole.status, 0) << whole.err << whole.out;
  const json all = runs.read("all.json");
  ASSERT_GE(all.at("rows").size(), 3u);
  EXPECT_EQ(all.at("rows").at(0).at("mutant"), "none");  // row 0 is the correct protocol
  std::map<std::string, std::size_t> index;              // each mutant's row in the unsharded run
  for (const json& row : all.at("rows")) index[row.at("mutant").get<std::string>()] = row.at("row").get<std::size_t>();
  EXPECT_EQ(index.size(), all.at("rows").size()) << "a row per mutant";
  std::set<RowKey> unsharded, merged;
  for (const json& row : all.at("rows")) unsharded.insert(key(row));
  std::vector<std::string> files;
  for (int k = 1; k <= 3; ++k) {
    const std::string name = fmt::format("s{}.json", k);
    const CliRun shard = runs.mutants(fmt::format("--shard {}/3 --junit '{}'", k, runs.file(fmt::format("s{}.xml", k))), name);
    ASSERT_EQ(shard.status, 0) << shard.err << shard.out;
    EXPECT_NE(shard.out.find(fmt::format("shard {}/3", k)), std::string::npos) << "the header names the shard: " << shard.out;
    const json part = runs.read(name);
    EXPECT_EQ(part.at("shard"), (json{{"k", k}, {"n", 3}}));
    for (const json& row : part.at("rows")) {
      EXPECT_EQ(index.at(row.at("mutant").get<std::string>()) % 3, static_cast<std::size_t>(k - 1)) << row.dump();
      EXPECT_TRUE(merged.insert(key(row)).second) << "in one shard only: " << row.dump();
    }
    // JUnit: one testcase per row of the shard.
    const std::string xml = slurp(runs.file(fmt::format("s{}.xml", k)));
    EXPECT_NE(xml.find(fmt::format("tests=\"{}\"", part.at("rows").size())), std::string::npos) << xml;
    files.push_back(runs.file(name));
  }
  EXPECT_EQ(merged, unsharded);
  const CliRun merge = run_cpkv(fmt::format("merge '{}' '{}' '{}'", files[0], files[1], files[2]));
  EXPECT_EQ(merge.status, 0) << merge.err << merge.out;
  EXPECT_EQ(table_rows(merge.out), table_rows(whole.out)) << merge.out;
  EXPECT_EQ(table_rows(merge.out).size(), all.at("rows").size());
  // A merged row that failed fails the merge (exit 1) and shows NO in its row.
  json tampered = runs.read("s2.json");
  tampered["rows"][0]["caught"] = false;
  const std::string failed = write_temp("cpkv_cli_shard", "s2-failed.json", tampered.dump());
  const CliRun bad = run_cpkv(fmt::format("merge '{}' '{}' '{}' --junit '{}'", files[0], failed, files[2], runs.file("m.xml")));
  EXPECT_EQ(bad.status, 1) << bad.err << bad.out;
  const std::vector<std::string> bad_rows = table_rows(bad.out);
  const std::string no_row = fmt::format("{} NO - -", tampered["rows"][0]["mutant"].get<std::string>());
  EXPECT_NE(std::find(bad_rows.begin(), bad_rows.end(), no_row), bad_rows.end()) << bad.out;
  EXPECT_NE(slurp(runs.file("m.xml")).find("failures=\"1\""), std::string::npos);
  fs::remove_all(runs.dir);
}

TEST(CliShard, MergeRefusesOtherRunsOverlapsAndMissingShards) {
  const ShardRuns runs;
  // Shards of N = 5 and 4: three rows each at most, so the runs are short.
  ASSERT_EQ(runs.mutants("--shard 2/5", "a.json").status, 0);
  ASSERT_EQ(runs.mutants("--shard 3/5", "b.json").status, 0);
  ASSERT_EQ(runs.mutants("--shard 3/4", "c.json").status, 0);
  json other_seed = runs.read("b.json");
  other_seed["seed"] = 4;
  const std::string seed4 = write_temp("cpkv_cli_shard", "b-seed4.json", other_seed.dump());
  const std::string a = runs.file("a.json"), b = runs.file("b.json"), c = runs.file("c.json");
  expect_bad_input(run_cpkv(fmt::format("merge '{}' '{}'", a, b)), "shard 1, 4, 5 of 5 missing");
  expect_bad_input(run_cpkv(fmt::format("merge '{}' '{}'", a, a)), "overlapping");
  expect_bad_input(run_cpkv(fmt::format("merge '{}' '{}'", a, seed4)), "seed 4, but");
  expect_bad_input(run_cpkv(fmt::format("merge '{}' '{}'", a, c)), "N 4, but");
  expect_bad_input(run_cpkv(fmt::format("merge '{}'", write_temp("cpkv_cli_shard", "not.json", "{"))), "not JSON");
  expect_bad_input(run_cpkv(fmt::format("merge '{}'", runs.file("absent.json"))), "absent.json");
  expect_bad_input(run_cpkv(fmt::format("merge '{}' --junit '{}'", a, a)), "--junit");  // an output over an input
  fs::remove_all(runs.dir);
}

TEST(CliShard, ShardOutOfRangeIsRefusedBeforeAnyWork) {
  expect_bad_input(run_cpkv("mutants --shard 0/3"), "--shard 0/3");  // K is 1-based
  expect_bad_input(run_cpkv("mutants --shard 4/3"), "--shard 4/3");
  expect_bad_input(run_cpkv("mutants --shard 1/0"), "--shard 1/0");
  expect_bad_input(run_cpkv("mutants --shard 1/100000"), "N is outside");
  expect_bad_input(run_cpkv("mutants --shard 3"), "--shard");
  expect_bad_input(run_cpkv("mutants --shard 1/2/3"), "--shard");
  expect_bad_input(run_cpkv("mutants --backend cuda --shard 1/2"), "--shard");
  // The outputs follow cli/files.hpp's rules, checked before any work.
  expect_bad_input(run_cpkv("mutants --shard 1/2 --json /nonexistent-folder/s.json"), "--json");
  expect_bad_input(run_cpkv("mutants --shard 1/2 --json /tmp"), "--json");
  const std::string same = (temp_dir("cpkv_cli_shard") / "same.json").string();
  expect_bad_input(run_cpkv(fmt::format("mutants --shard 1/2 --json '{}' --junit '{}'", same, same)), "--junit");
  expect_bad_input(run_cpkv("merge"), "FILE");
  fs::remove_all(temp_dir("cpkv_cli_shard"));
}

}  // namespace
}  // namespace cpkv::test

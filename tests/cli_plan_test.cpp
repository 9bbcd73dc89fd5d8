// cpkv plan, end to end: the numbers it prints for the tiny sample equal a hand calculation from
// PROTOCOL.md, and every kind of bad input ends with one line on stderr and exit status 2.
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_run.hpp"

namespace {

namespace fs = std::filesystem;
using namespace cpkv::test;  // NOLINT: the CLI tests' one runner (cli_run.hpp)

std::vector<nlohmann::json> json_lines(const std::string& text) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

std::string write_temp(const std::string& name, const std::string& text) {
  const fs::path path = fs::temp_directory_path() / fmt::format("cpkv_{}_{}.jsonl", name, ::getpid());
  std::ofstream(path) << text;
  return path.string();
}

// Hand calculation for traces/samples/tiny.jsonl (cp 2, P 4, kv_fp8 656 B + indexer_k 132 B,
// layers "FS", caps 16 tokens / 2 requests):
//   staging_slots = ceil(16 / 4) + 2 = 6.
//   batch 0: request 0 has prefix pages [5, 2] and ceil(6/4) = 2 current pages; request 1 has
//   ceil(9/4) = 3. Zigzag cuts C pages into 4 blocks, rank k takes blocks k and 3-k:
//   C = 2 -> blocks 1,1,0,0 -> writers [0 1]; C = 3 -> blocks 1,1,1,0 -> writers [0 1 1].
//   Slots: p5 p2 | c0 c1 | c2 c3 c4 -> 7 slots, 5 current pages.
//   staging_direct gathers all 7 slots on every rank: from rank 0: page 2 (2 % 2 = 0), c0, c2 =
//   3 pages; from rank 1: page 5, c1, c3, c4 = 4 pages. A page is 4 rows: 4 * (656 + 132) = 3152 B on
//   the F layer and 4 * 656 = 2624 B on the S layer, 5776 B per batch.
//   -> bytes_pulled_from = [3 * 5776, 4 * 5776] = [17328, 23104] on both ranks.
//   batch 1: prefix page [7] (rank 1) + 1 current page (C = 1 -> writer 0): [5776, 5776].
//   batch 2: ceil(16/4) + ceil(13/4) = 8 current pages > 6 staging slots -> overflow.
TEST(CliPlan, TinySampleJsonMatchesHandCalculation) {
  const CliRun run = run_cpkv(fmt::format("plan '{}' --json", sample("tiny.jsonl")));
  ASSERT_EQ(run.status, 0) << run.err;
  const auto batches = json_lines(run.out);
  ASSERT_EQ(batches.size(), 3u);

  const auto& b0 = batches[0];
  EXPECT_EQ(b0["batch"], 0);
  EXPECT_EQ(b0["current_pages_total"], 5);
  EXPECT_EQ(b0["slot_count"], 7);
  EXPECT_EQ(b0["staging_slots"], 6);
  EXPECT_EQ(b0["verdict"], "ok");
  EXPECT_EQ(b0["writers"], nlohmann::json::parse("[[0,1],[0,1,1]]"));
  ASSERT_EQ(b0["ranks"].size(), 2u);
  for (const auto& rank : b0["ranks"]) {
    EXPECT_EQ(rank["bytes_pulled_from"], nlohmann::json::parse("[17328, 23104]")) << rank.dump();
  }

  const auto& b1 = batches[1];
  EXPECT_EQ(b1["current_pages_total"], 1);
  EXPECT_EQ(b1["slot_count"], 2);
  EXPECT_EQ(b1["writers"], nlohmann::json::parse("[[0]]"));
  EXPECT_EQ(b1["ranks"][1]["bytes_pulled_from"], nlohmann::json::parse("[5776, 5776]"));

  const auto& b2 = batches[2];
  EXPECT_EQ(b2["verdict"], "overflow");
  EXPECT_EQ(b2["current_pages_total"], 8);
  EXPECT_EQ(b2["verdict_detail"], "overflow: 8 current pages > 6 staging slots");
  EXPECT_EQ(b2["writers"], nlohmann::json::parse("[[0,1,1,0],[0,1,1,0]]"));
  EXPECT_TRUE(b2["ranks"][0]["bytes_pulled_from"].is_null()) << "a rejected batch moves no bytes";
}

TEST(CliPlan, BatchAndRankOptionsSelectOneBatchAndOneRank) {
  const CliRun run = run_cpkv(fmt::format("plan '{}' --json --batch 1 --rank 0", sample("tiny.jsonl")));
  ASSERT_EQ(run.status, 0) << run.err;
  const auto batches = json_lines(run.out);
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_EQ(batches[0]["batch"], 1);
  ASSERT_EQ(batches[0]["ranks"].size(), 1u);
  EXPECT_EQ(batches[0]["ranks"][0]["rank"], 0);
}

TEST(CliPlan, TextOutputNamesTheVerdictAndWriters) {
  const CliRun run = run_cpkv(fmt::format("plan '{}'", sample("tiny.jsonl")));
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_NE(run.out.find("verdict ok"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("overflow: 8 current pages > 6 staging slots"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("[0 1 1]"), std::string::npos) << run.out;
}

TEST(CliPlan, SeedsShapedSamplePlansWithoutOverflow) {
  const CliRun run = run_cpkv(fmt::format("plan '{}' --json", sample("seeds_batch.jsonl")));
  ASSERT_EQ(run.status, 0) << run.err;
  const auto batches = json_lines(run.out);
  ASSERT_GE(batches.size(), 1u);
  EXPECT_EQ(batches[0]["requests"], 12);
  EXPECT_EQ(batches[0]["verdict"], "ok");
  EXPECT_EQ(batches[0]["ranks"].size(), 8u);
}

TEST(CliPlan, MalformedLineLateInTheTraceLeavesNoPartialOutput) {
  std::string text = slurp(sample("tiny.jsonl"));
  text += "{\"batch\": 3, \"requests\": [{\"prefix_len\": 3, \"extend_len\": 1, \"prefix_pages\": []}]}\n";
  const std::string path = write_temp("late_bad", text);
  const CliRun run = run_cpkv(fmt::format("plan '{}'", path));
  expect_bad_input(run, "prefix_len");
  EXPECT_NE(run.err.find(":5:"), std::string::npos) << "names line 5: " << run.err;
  fs::remove(path);
}

TEST(CliPlan, MissingTraceFileIsBadInput) {
  expect_bad_input(run_cpkv("plan /nonexistent/trace.jsonl"), "/nonexistent/trace.jsonl");
}

TEST(CliPlan, BadJsonIsBadInput) {
  const std::string path = write_temp("bad_json", "{not json\n");
  expect_bad_input(run_cpkv(fmt::format("plan '{}'", path)), ":1:");
  fs::remove(path);
}

TEST(CliPlan, BatchOutOfRangeIsBadInput) {
  expect_bad_input(run_cpkv(fmt::format("plan '{}' --batch 9", sample("tiny.jsonl"))), "--batch");
}

TEST(CliPlan, RankOutsideTheGroupIsBadInput) {
  expect_bad_input(run_cpkv(fmt::format("plan '{}' --rank 2", sample("tiny.jsonl"))), "--rank");
}

TEST(CliPlan, UnknownVariantIsBadInput) {
  expect_bad_input(run_cpkv(fmt::format("plan '{}' --variant nope", sample("tiny.jsonl"))), "nope");
}

TEST(CliPlan, HelpExplainsEverySubcommand) {
  const CliRun top = run_cpkv("--help");
  EXPECT_EQ(top.status, 0);
  EXPECT_NE(top.out.find("plan"), std::string::npos);
  const CliRun plan = run_cpkv("plan --help");
  EXPECT_EQ(plan.status, 0);
  EXPECT_NE(plan.out.find("--json"), std::string::npos);
}

}  // namespace

namespace {

// cpkv replay --swarm: the knobs are drawn from --seed and printed before the run, the same for the
// same seed; a failing run's replay line carries --swarm so it draws them again.
TEST(CliReplay, SwarmPrintsTheKnobsItDrewFromTheSeed) {
  const std::string args = fmt::format("replay '{}' --backend sim --variant staging_direct --swarm", sample("tiny.jsonl"));
  const CliRun first = run_cpkv(args + " --seed 7");
  const CliRun again = run_cpkv(args + " --seed 7");
  const CliRun other = run_cpkv(args + " --seed 8");
  ASSERT_EQ(first.status, 0) << first.out << first.err;
  const auto knobs = [](const std::string& out) {
    const std::size_t at = out.find("swarm knobs: fault seed");
    return at == std::string::npos ? std::string() : out.substr(at, out.find('\n', at) - at);
  };
  EXPECT_NE(knobs(first.out), "") << first.out;
  EXPECT_EQ(knobs(first.out), knobs(again.out));
  EXPECT_NE(knobs(first.out), knobs(other.out));
}

TEST(CliReplay, FailingSwarmRunPrintsAReplayLineWithSwarm) {
  const CliRun run = run_cpkv(fmt::format("replay '{}' --backend sim --variant staging_direct --seed 3 --swarm --mutant single_half", sample("tiny.jsonl")));
  EXPECT_EQ(run.status, 1) << run.out << run.err;
  const std::size_t at = run.out.find("replay: cpkv replay");
  ASSERT_NE(at, std::string::npos) << run.out;
  EXPECT_NE(run.out.find("--swarm", at), std::string::npos) << run.out;
}

TEST(CliReplay, SwarmWithAScheduleIsBadInput) {
  expect_bad_input(run_cpkv(fmt::format("replay '{}' --backend sim --schedule random --swarm", sample("tiny.jsonl"))), "--swarm");
}

}  // namespace

namespace {

// One row of `cpkv mutants`: the planted bug, the invariant that fired in the property that caught
// it, and the replay line printed under it ("" if none).
struct MutantRowText {
  std::string mutant;
  std::string invariant;
  std::string replay;
};

std::vector<MutantRowText> caught_rows(const std::string& table) {
  std::vector<MutantRowText> rows;
  std::istringstream in(table);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string first, caught, property, invariant;
    words >> first >> caught >> property >> invariant;
    if (caught == "yes") rows.push_back({first, invariant, ""});
    const std::string prefix = "    replay: cpkv ";
    if (line.rfind(prefix, 0) == 0 && !rows.empty()) rows.back().replay = line.substr(prefix.size());
  }
  return rows;
}

std::vector<std::string> words_of(const std::string& text) {
  std::vector<std::string> words{cpkv_binary().string()};
  std::istringstream in(text);
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

}  // namespace

// PROTOCOL.md section 9: every planted bug is caught "shrunk to a small counterexample with a replay
// line". Each printed line must reproduce ITS bug: run it, and it names that mutant, fails (exit 1)
// and reports the invariant the table credits. And the report is cpkv's alone: one seed, printed
// once, and none of RapidCheck's own banners ("Using configuration", "Some of your RapidCheck
// properties had failures ... RC_PARAMS=reproduce") after a table whose planted bugs fail on purpose.
TEST(CliMutants, EveryPrintedReplayLineReproducesItsOwnBugAndTheSeedIsPrintedOnce) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("cpkv_mutants_replay_{}", ::getpid());
  const CliRun run = spawn({cpkv_binary().string(), "mutants"}, dir);  // TMPDIR: dir/tmp, where the counterexamples go
  ASSERT_EQ(run.status, 0) << run.out << run.err;
  const std::string all = run.out + run.err;
  EXPECT_EQ(all.find("Using configuration"), std::string::npos) << all;
  EXPECT_EQ(all.find("RapidCheck"), std::string::npos) << all;
  EXPECT_EQ(all.find("RC_PARAMS"), std::string::npos) << all;
  std::size_t seeds = 0;
  for (std::size_t at = all.find("| seed "); at != std::string::npos; at = all.find("| seed ", at + 1)) ++seeds;
  EXPECT_EQ(seeds, 1u) << all;
  const std::vector<MutantRowText> rows = caught_rows(run.out);
  EXPECT_NE(run.out.find(fmt::format("caught {} of {} planted bugs", rows.size(), rows.size())), std::string::npos) << run.out;
  for (const MutantRowText& row : rows) {
    ASSERT_FALSE(row.replay.empty()) << row.mutant << " has no replay line";
    EXPECT_NE(row.replay.find("--mutant " + row.mutant), std::string::npos) << row.mutant << ": " << row.replay;
    const CliRun replay = spawn(words_of(row.replay), dir / row.mutant);
    EXPECT_EQ(replay.status, 1) << row.mutant << ": " << row.replay << "\n" << replay.out << replay.err;
    EXPECT_NE(replay.out.find("MUTANT ACTIVE: " + row.mutant + " "), std::string::npos) << row.mutant << ": " << replay.out;
    EXPECT_NE(replay.out.find("invariant " + row.invariant + " ("), std::string::npos)
        << row.mutant << " was credited to invariant " << row.invariant << ", its replay says:\n" << replay.out;
  }
  fs::remove_all(dir);
}

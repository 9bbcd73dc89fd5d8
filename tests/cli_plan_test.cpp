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

// `cpkv plan TRACE --json FILE ARGS`: the JSON Lines of FILE (the run must succeed).
std::vector<nlohmann::json> plan_json(const std::string& trace, const std::string& args = "") {
  const fs::path json = temp_dir("cli_plan") / "plan.json";
  fs::remove(json);
  const CliRun run = run_cpkv(fmt::format("plan '{}' --json '{}' {}", trace, json.string(), args));
  EXPECT_EQ(run.status, 0) << run.err;
  return json_lines(slurp(json));
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
  const auto batches = plan_json(sample("tiny.jsonl"));
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
  // A rank's own entry is local (its own memory), the other one pulled (issue 25 item 4).
  EXPECT_EQ(b0["ranks"][0]["local_bytes"], 17328);
  EXPECT_EQ(b0["ranks"][0]["peer_bytes"], 23104);
  EXPECT_EQ(b0["ranks"][1]["local_bytes"], 23104);
  EXPECT_EQ(b0["ranks"][1]["peer_bytes"], 17328);

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
  EXPECT_TRUE(b2["ranks"][0]["peer_bytes"].is_null()) << "a rejected batch moves no bytes";
}

// Each rank's attention plan (PROTOCOL.md section 11), by hand for batch 0 (r0: prefix 8, extend 6;
// r1: extend 9; P = 4): r0's span is 8 + 2 * 4 = 16 rows, so r1's keys begin at row 16. Rank 0
// computes r0's page 0 (tokens 0..3, kv_len 8 + 0 + 4 = 12) and r1's page 0 (0..3, kv_len 4); rank 1
// r0's page 1 (4..5, kv_len 8 + 4 + 2 = 14) and r1's pages 1-2 (4..8, kv_len 9).
TEST(CliPlan, EveryRanksAttentionPlanIsPrintedAndWrittenAsSection11Says) {
  const auto batches = plan_json(sample("tiny.jsonl"));
  ASSERT_EQ(batches.size(), 3u);
  const auto segment = [](std::int64_t r, std::int64_t q_base, std::int64_t q_len, std::int64_t kv_len, std::int64_t k_base) {
    return nlohmann::json{{"request", r}, {"q_base", q_base}, {"q_len", q_len}, {"kv_len", kv_len}, {"k_base", k_base}};
  };
  EXPECT_EQ(batches[0]["ranks"][0]["attention"], nlohmann::json::array({segment(0, 0, 4, 12, 0), segment(1, 0, 4, 4, 16)}));
  EXPECT_EQ(batches[0]["ranks"][1]["attention"], nlohmann::json::array({segment(0, 4, 2, 14, 0), segment(1, 4, 5, 9, 16)}));
  EXPECT_TRUE(batches[2]["ranks"][0]["attention"].is_null()) << "a rejected batch runs no attention";
  const CliRun run = run_cpkv(fmt::format("plan '{}' --batch 0", sample("tiny.jsonl")));
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_NE(run.out.find("rank 0: (0, 0, 4, 12, 0) (1, 0, 4, 4, 16)"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("rank 1: (0, 4, 2, 14, 0) (1, 4, 5, 9, 16)"), std::string::npos) << run.out;
}

// Section 12's token-split variants, by hand for tiny batch 0 (cp 2, P 4; r0: prefix 8 (pages 5, 2),
// extend 6; r1: no prefix, extend 9; kv_fp8 656 B + indexer_k 132 B on the F layer, 656 B on S).
// Zigzag cuts each request's tokens into 2 * cp = 4 blocks (section 2's rule on tokens): r0's 6 ->
// 2,2,1,1 (0..1 | 2..3 | 4 | 5), r1's 9 -> 3,2,2,2 (0..2 | 3..4 | 5..6 | 7..8); rank 0 takes blocks 0
// and 3, rank 1 blocks 1 and 2. Continuous: token t to rank t % 2. Either way rank 0 computes 3 + 5 =
// 8 tokens and rank 1 3 + 4 = 7: max_rank_tokens 8, each all-gather 2 x 8 = 16 rows, padding
// 16 - 15 = 1 (rank 1's). A row is 788 B on F and 656 B on S: the gathered buffer is 16 x 1444 =
// 23104 B per batch, the peer's block half of it (11552 B), in 3 all-gathers (2 kinds on F, 1 on S).
// Prefix: page 5 lives on rank 1, page 2 on rank 0, 4 x 1444 = 5776 B each, on every rank. The model's
// row of bytes counts the ring all-gather's receive from the predecessor: rank 0 [5776, 5776 + 11552].
// Attention (section 11, kv_len = prefix + q_base + q_len, r1's keys from row (2 + 2) x 4 = 16): zigzag
// rank 0 (0,0,2,10,0) (0,5,1,14,0) (1,0,3,3,16) (1,7,2,9,16), rank 1 (0,2,3,13,0) (1,3,4,7,16).
TEST(CliPlan, TokenSplitVariantsPrintTheirSplitAllGatherAndPrefixPullsAsSection12Says) {
  const auto run = [](const nlohmann::json& r, std::int64_t first, std::int64_t count, std::int64_t step) {
    return nlohmann::json{{"request", r}, {"first", first}, {"count", count}, {"step", step}};
  };
  const auto segment = [](std::int64_t r, std::int64_t q_base, std::int64_t q_len, std::int64_t kv_len, std::int64_t k_base) {
    return nlohmann::json{{"request", r}, {"q_base", q_base}, {"q_len", q_len}, {"kv_len", kv_len}, {"k_base", k_base}};
  };
  for (const std::string variant : {"allgather_zigzag", "allgather_continuous"}) {
    const auto batches = plan_json(sample("tiny.jsonl"), "--batch 0 --variant " + variant);
    ASSERT_EQ(batches.size(), 1u) << variant;
    const auto& b = batches[0];
    EXPECT_EQ(b["variant"], variant);
    EXPECT_EQ(b["token_split"], variant == "allgather_zigzag" ? "zigzag_tokens" : "continuous_tokens");
    EXPECT_TRUE(b["staging_slots"].is_null()) << "section 12: no staging";
    EXPECT_EQ(b["verdict"], "no_staging");
    EXPECT_NE(b["verdict_detail"].get<std::string>().find("invariant 3) does not apply"), std::string::npos) << b["verdict_detail"];
    EXPECT_EQ(b["tokens_total"], 15);
    EXPECT_EQ(b["max_rank_tokens"], 8);
    EXPECT_EQ(b["allgather_rows"], 16);
    EXPECT_EQ(b["padding_rows"], 1);
    EXPECT_EQ(b["allgathers"], 3);
    ASSERT_EQ(b["ranks"].size(), 2u);
    for (int k = 0; k < 2; ++k) {
      const auto& r = b["ranks"][k];
      EXPECT_EQ(r["token_count"], k == 0 ? 8 : 7) << variant << " rank " << k;
      EXPECT_EQ(r["padding_rows"], k == 0 ? 0 : 1) << variant << " rank " << k;
      EXPECT_EQ(r["allgather_bytes"], 23104) << variant << " rank " << k;
      EXPECT_EQ(r["allgather_peer_bytes"], 11552) << variant << " rank " << k;
      EXPECT_EQ(r["prefix_pages_from"], nlohmann::json::parse("[1, 1]")) << variant << " rank " << k;
      EXPECT_EQ(r["prefix_bytes_from"], nlohmann::json::parse("[5776, 5776]")) << variant << " rank " << k;
    }
    EXPECT_EQ(b["ranks"][0]["bytes_pulled_from"], nlohmann::json::parse("[5776, 17328]")) << variant;
    EXPECT_EQ(b["ranks"][1]["bytes_pulled_from"], nlohmann::json::parse("[17328, 5776]")) << variant;
  }
  const auto zigzag = plan_json(sample("tiny.jsonl"), "--batch 0 --variant allgather_zigzag")[0]["ranks"];
  EXPECT_EQ(zigzag[0]["tokens"], nlohmann::json::array({run(0, 0, 2, 1), run(0, 5, 1, 1), run(1, 0, 3, 1), run(1, 7, 2, 1)}));
  EXPECT_EQ(zigzag[1]["tokens"], nlohmann::json::array({run(0, 2, 3, 1), run(1, 3, 4, 1)}));
  EXPECT_EQ(zigzag[0]["attention"], nlohmann::json::array({segment(0, 0, 2, 10, 0), segment(0, 5, 1, 14, 0), segment(1, 0, 3, 3, 16), segment(1, 7, 2, 9, 16)}));
  EXPECT_EQ(zigzag[1]["attention"], nlohmann::json::array({segment(0, 2, 3, 13, 0), segment(1, 3, 4, 7, 16)}));
  const auto continuous = plan_json(sample("tiny.jsonl"), "--batch 0 --variant allgather_continuous")[0]["ranks"];
  EXPECT_EQ(continuous[0]["tokens"], nlohmann::json::array({run(0, 0, 3, 2), run(1, 0, 5, 2)}));
  EXPECT_EQ(continuous[1]["tokens"], nlohmann::json::array({run(0, 1, 3, 2), run(1, 1, 4, 2)}));
  // One segment per token: rank 1's r0 tokens 1, 3, 5 see 8 + t + 1 keys.
  EXPECT_EQ(continuous[1]["attention"].size(), 7u);
  EXPECT_EQ(continuous[1]["attention"][2], segment(0, 5, 1, 14, 0));
}

// The text says the same: no staging verdict, the split per rank, the all-gather's rows and padding.
TEST(CliPlan, TokenSplitTextSaysNoStagingAndPrintsEachRanksTokens) {
  const CliRun run = run_cpkv(fmt::format("plan '{}' --batch 0 --variant allgather_zigzag", sample("tiny.jsonl")));
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_EQ(run.out.find("staging_slots"), std::string::npos) << run.out;
  EXPECT_EQ(run.out.find("writers"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("no staging"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("max_rank_tokens 8; each all-gather moves cp 2 x 8 = 16 rows, 1 of them padding"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("rank 0: 8 tokens, 0 padding rows: request 0: 0..1 5; request 1: 0..2 7..8"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("rank 1: 7 tokens, 1 padding rows: request 0: 2..4; request 1: 3..6"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("rank 0: all-gather 23104, from peers 11552; prefix pages [1 1], bytes [5776 5776]"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("rank 0: (0, 0, 2, 10, 0) (0, 5, 1, 14, 0) (1, 0, 3, 3, 16) (1, 7, 2, 9, 16)"), std::string::npos) << run.out;
  const CliRun continuous = run_cpkv(fmt::format("plan '{}' --batch 0 --variant allgather_continuous", sample("tiny.jsonl")));
  ASSERT_EQ(continuous.status, 0) << continuous.err;
  EXPECT_NE(continuous.out.find("rank 1: 7 tokens, 1 padding rows: request 0: 1..5 step 2; request 1: 1..7 step 2"), std::string::npos)
      << continuous.out;
}

TEST(CliPlan, BatchAndRankOptionsSelectOneBatchAndOneRank) {
  const auto batches = plan_json(sample("tiny.jsonl"), "--batch 1 --rank 0");
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

// The hand calculation above, as text: every rank of tiny batch 0 reads [17328 23104] by holder
// (staging_direct), which is 17328 local and 23104 pulled for rank 0 but 23104 local and 17328
// pulled for rank 1. The old text called the whole row "pulled from ranks 0..1" and printed it
// twice (issue 25 item 4).
TEST(CliPlan, TextSaysWhichBytesAreLocalAndWhichArePulled) {
  const CliRun run = run_cpkv(fmt::format("plan '{}' --batch 0", sample("tiny.jsonl")));
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_EQ(run.out.find("pulled per batch"), std::string::npos) << "the row is not all pulled: " << run.out;
  EXPECT_NE(run.out.find("every rank reads [17328 23104] from ranks 0..1"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("rank 0: local 17328, pulled from peers 23104\n"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("rank 1: local 23104, pulled from peers 17328\n"), std::string::npos) << run.out;
  // Rows that differ (v2's all-reduce share goes to one neighbour) are printed per rank, every peer named.
  const CliRun v2 = run_cpkv(fmt::format("plan '{}' --batch 0 --variant v2", sample("tiny.jsonl")));
  ASSERT_EQ(v2.status, 0) << v2.err;
  const auto rows = plan_json(sample("tiny.jsonl"), "--batch 0 --variant v2");
  ASSERT_EQ(rows.size(), 1u);
  ASSERT_NE(rows[0]["ranks"][0]["bytes_pulled_from"], rows[0]["ranks"][1]["bytes_pulled_from"]) << "this case needs rows that differ";
  EXPECT_EQ(v2.out.find("every rank reads"), std::string::npos) << v2.out;
  for (int rank = 0; rank < 2; ++rank) {
    const auto& row = rows[0]["ranks"][rank]["bytes_pulled_from"];
    const std::string line = fmt::format("rank {}: local {}, pulled from peers {} ({} from rank {})\n", rank, row[rank].get<std::uint64_t>(),
                                         row[1 - rank].get<std::uint64_t>(), row[1 - rank].get<std::uint64_t>(), 1 - rank);
    EXPECT_NE(v2.out.find(line), std::string::npos) << line << v2.out;
  }
}

// plan --json was a flag writing to stdout while every other --json takes a file (issue 25 item
// 5): it takes FILE under the README's output rules, and stdout keeps the report.
TEST(CliPlan, JsonIsAnOutputFileLikeEveryOtherOutput) {
  const fs::path dir = temp_dir("cli_plan_json");
  const fs::path json = dir / "plan.json";
  fs::remove(json);
  const CliRun run = run_cpkv(fmt::format("plan '{}' --json '{}'", sample("tiny.jsonl"), json.string()));
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_EQ(json_lines(slurp(json)).size(), 3u) << "one JSON object per batch";
  EXPECT_NE(run.out.find("batch 2: 2 requests"), std::string::npos) << "stdout carries the report: " << run.out;
  expect_bad_input(run_cpkv(fmt::format("plan '{}' --json", sample("tiny.jsonl"))), "--json");
  expect_bad_input(run_cpkv(fmt::format("plan '{}' --json /dev/stdout", sample("tiny.jsonl"))), "--json");
  expect_bad_input(run_cpkv(fmt::format("plan '{}' --json -", sample("tiny.jsonl"))), "--json");
  const std::string trace = write_temp("plan_self", slurp(sample("tiny.jsonl")));
  expect_bad_input(run_cpkv(fmt::format("plan '{}' --json '{}'", trace, trace)), "same file");
  EXPECT_EQ(slurp(trace), slurp(sample("tiny.jsonl"))) << "the trace is untouched";
  fs::remove(trace);
  // A bad option after the output leaves the old file as it was.
  std::ofstream(json) << "old\n";
  expect_bad_input(run_cpkv(fmt::format("plan '{}' --json '{}' --rank 5", sample("tiny.jsonl"), json.string())), "--rank");
  EXPECT_EQ(slurp(json), "old\n");
}

TEST(CliPlan, SeedsShapedSamplePlansWithoutOverflow) {
  const auto batches = plan_json(sample("seeds_batch.jsonl"));
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

// The progress bar counted batches, so a one-batch trace sat at 0/1 until it ended (issue 25 item
// 4). On a terminal (script(1) gives cpkv one) a scheduled replay of tiny batch 0 over its 2 layers
// shows 1 of 2 layers before the end.
TEST(CliReplay, TheProgressBarMovesPerLayer) {
  if (std::system("command -v script > /dev/null 2>&1") != 0) GTEST_SKIP() << "script(1) is not installed: no terminal to give cpkv";
  const std::string command = fmt::format("exec '{}' replay '{}' --batch 0 --variant staging_direct --schedule round-robin", cpkv_binary().string(),
                                          sample("tiny.jsonl"));
  // Bounded: timeout(1) ends script(1) and the run if either hangs.
  const CliRun run = spawn({"/bin/sh", "-c", "exec timeout 20 script -qefc \"$0\" /dev/null < /dev/null", command}, temp_dir("cli_progress"));
  ASSERT_EQ(run.status, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("] 1/2 layers"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("] 2/2 layers"), std::string::npos) << run.out;
  EXPECT_EQ(run.out.find("batches\r"), std::string::npos) << run.out;
}

// The byte column was rank 0's figure under the header "peer_bytes/rank" (issue 25 item 4). From
// the hand calculation of tiny batch 0 above (staging_direct, both layers): rank 0 pulls 23104 B
// (rank 1's share), rank 1 pulls 17328 B (rank 0's): the most is 23104, the least 17328.
TEST(CliReplay, PeerBytesAreTheMostAndTheLeastOverRanks) {
  const CliRun run = run_cpkv(fmt::format("replay '{}' --backend sim --ranks-as threads --variant staging_direct --batch 0 --layers all",
                                          sample("tiny.jsonl")));
  ASSERT_EQ(run.status, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("peer_bytes max peer_bytes min"), std::string::npos) << run.out;
  const std::size_t row = run.out.find("\nstaging_direct ");
  ASSERT_NE(row, std::string::npos) << run.out;
  std::istringstream fields(run.out.substr(row + 1));
  std::string variant;
  std::int64_t batches = 0, layers = 0;
  std::uint64_t peer_max = 0, peer_min = 0;
  fields >> variant >> batches >> layers >> peer_max >> peer_min;
  EXPECT_EQ(batches, 1);
  EXPECT_EQ(layers, 2);
  EXPECT_EQ(peer_max, 23104u) << run.out;
  EXPECT_EQ(peer_min, 17328u) << run.out;
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

// The replay line is a shell command: a trace path with a space (and a quote) is one quoted word of
// it. Run as printed through bash, the line replays the same trace: the same planted bug fails the
// same way (exit 1) and prints the same line again. Unquoted, bash split the path in two.
TEST(CliReplay, AReplayLineForATracePathWithASpaceRunsAsPrinted) {
  const fs::path dir = temp_dir("cli_replay_space") / "my traces";
  fs::create_directories(dir);
  const fs::path trace = dir / "tiny 'copy'.jsonl";
  fs::copy_file(sample("tiny.jsonl"), trace, fs::copy_options::overwrite_existing);
  const auto line_of = [](const CliRun& run) {
    const std::size_t at = run.out.find("replay: cpkv replay ");
    return at == std::string::npos ? std::string() : run.out.substr(at + 8, run.out.find('\n', at) - at - 8);
  };
  const CliRun first = spawn({cpkv_binary().string(), "replay", trace.string(), "--backend", "sim", "--variant", "staging_direct", "--schedule",
                              "round-robin", "--mutant", "skip_zero"},
                             dir.parent_path() / "first");
  ASSERT_EQ(first.status, 1) << first.out << first.err;
  const std::string line = line_of(first);
  ASSERT_NE(line, "") << first.out;
  // `cpkv` in the line is the binary under test: its folder first on PATH.
  const CliRun again = spawn({"/bin/bash", "-c", fmt::format("PATH='{}':\"$PATH\" {}", cpkv_binary().parent_path().string(), line)},
                             dir.parent_path() / "again");
  EXPECT_EQ(again.status, 1) << line << "\n" << again.out << again.err;
  EXPECT_NE(again.out.find("MUTANT ACTIVE: skip_zero "), std::string::npos) << again.out;
  EXPECT_EQ(line_of(again), line) << again.out;
  fs::remove_all(dir.parent_path());
}

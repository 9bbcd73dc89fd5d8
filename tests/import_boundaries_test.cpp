// The Mooncake importer at its boundaries (issue 25, item 11). Each test is written from a sentence
// of traces/README.md ("Imported traces") and sits exactly on the edge that sentence draws, where an
// off-by-one (`<=` become `<`, a floor become a ceiling, a missed touch) changes the outcome: bugs
// patched in from outside at these edges passed the rest of the CPU suite.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_run.hpp"
#include "cpkv/model/batch.hpp"
#include "cpkv/traces/mooncake.hpp"

namespace {

namespace fs = std::filesystem;
namespace mc = cpkv::traces::mooncake;
using cpkv::model::Batch;
using cpkv::test::CliRun;

// One request of a Mooncake log (traces/README.md, "The log").
std::string request_line(std::int64_t timestamp_ms, std::int64_t input_length, const std::vector<std::int64_t>& hash_ids) {
  const nlohmann::json line{{"timestamp", timestamp_ms}, {"input_length", input_length}, {"output_length", 1}, {"hash_ids", hash_ids}};
  return line.dump() + "\n";
}

// P 4, blocks of 8 tokens (2 pages), one kv_fp8 layer on cp 2; caps and pool as the test needs.
mc::ImportOptions options(std::int64_t cap_tokens, std::int64_t cap_requests, std::int64_t pool_pages) {
  mc::ImportOptions o;
  o.setting.cp = 2;
  o.setting.page_size = 4;
  o.setting.kinds = {*cpkv::model::find_buffer_kind("kv_fp8")};
  o.setting.layer_pattern = "F";
  o.setting.pool_pages = pool_pages;
  o.setting.caps.max_total_extend_tokens = cap_tokens;
  o.setting.caps.max_batch_requests = cap_requests;
  o.block_tokens = 8;
  return o;
}

// Every batch the scheduler forms from `log` under `o`, and its statistics.
struct Scheduled {
  std::vector<Batch> batches;
  mc::ImportStats stats;
};
Scheduled schedule(const std::string& log, const mc::ImportOptions& o) {
  mc::MooncakeReader reader(std::make_unique<std::istringstream>(log), "log.jsonl", o.block_tokens, false);
  mc::BatchScheduler scheduler(reader, o);
  Scheduled out;
  while (auto batch = scheduler.next_batch()) out.batches.push_back(*batch);
  out.stats = scheduler.stats();
  return out;
}

// (prefix_len, extend_len) of every request of a batch, for one-line comparisons.
std::vector<std::pair<std::int64_t, std::int64_t>> shape(const Batch& batch) {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  for (const cpkv::model::Request& r : batch.requests) out.emplace_back(r.prefix_len, r.extend_len);
  return out;
}

using Shape = std::vector<std::pair<std::int64_t, std::int64_t>>;

// What mc::validate says of the options: "accepted" or "FIELD: REASON".
std::string verdict(const mc::ImportOptions& o) {
  const std::optional<cpkv::model::Problem> problem = mc::validate(o);
  return problem ? problem->field + ": " + problem->reason : "accepted";
}

// "A request whose uncached part exceeds the remaining token budget is cut": one whose uncached part
// EQUALS the remaining budget is not, even when the budget is not a whole number of pages. Caps 12
// tokens: R0 takes 3, R1's 9 tokens are exactly the 9 left (a cut would give 8, then 1).
TEST(ImportBoundaries, ARequestThatExactlyFillsTheRemainingBudgetIsNotChunked) {
  const Scheduled s = schedule(request_line(0, 3, {1}) + request_line(1, 9, {2, 3}), options(12, 4, 16));
  ASSERT_EQ(s.batches.size(), 1u);
  EXPECT_EQ(shape(s.batches[0]), (Shape{{0, 3}, {0, 9}}));
  EXPECT_EQ(s.stats.chunked_requests, 0);
  // The same edge for a request alone in its batch: 10 tokens under a cap of 10, one batch.
  const Scheduled alone = schedule(request_line(0, 10, {4, 5}), options(10, 4, 16));
  ASSERT_EQ(alone.batches.size(), 1u);
  EXPECT_EQ(shape(alone.batches[0]), (Shape{{0, 10}}));
}

// "Only full blocks are cached (a partial last block's hash never matches a longer prompt)" and "a
// request's prefix is the longest run of leading full blocks already cached", from both sides.
// Cached: R0 has 12 tokens, block 1 (hash 1) full, block 2 (hash 2) 4 of 8 tokens. R1 (20 tokens)
// starts with the same two hashes; only block 1 may hit, so its prefix is 8 tokens, not 16.
// Matched: B (14 tokens) has a partial block 2 whose hash A cached as a full block; B's hit is its
// one full block (prefix 8), not 12 (two blocks, capped at whole pages below B's last token).
TEST(ImportBoundaries, APartialLastBlockIsNeverCachedNorMatched) {
  const Scheduled s = schedule(request_line(0, 12, {1, 2}) + request_line(1, 20, {1, 2, 3}), options(12, 1, 16));
  ASSERT_EQ(s.batches.size(), 2u);
  EXPECT_EQ(shape(s.batches[0]), (Shape{{0, 12}}));
  EXPECT_EQ(shape(s.batches[1]), (Shape{{8, 12}}));
  EXPECT_EQ(s.batches[1].requests[0].prefix_pages, (std::vector<std::int64_t>{0, 1}));
  EXPECT_EQ(s.stats.cache_hit_tokens, 8);
  EXPECT_EQ(s.stats.chunked_requests, 0);
  const Scheduled matched = schedule(request_line(0, 16, {1, 2}) + request_line(1, 14, {1, 2}), options(16, 1, 16));
  ASSERT_EQ(matched.batches.size(), 2u);
  EXPECT_EQ(shape(matched.batches[1]), (Shape{{8, 6}}));
  EXPECT_EQ(matched.stats.cache_hit_tokens, 8);
}

// "--max-total-extend-tokens below the page size" is refused (a chunk is whole pages): a cap of
// exactly one page is the smallest that works, and the import chunks under it page by page.
TEST(ImportBoundaries, ATokenCapOfExactlyOnePageIsAccepted) {
  EXPECT_EQ(verdict(options(4, 1, 16)), "accepted");
  EXPECT_EQ(verdict(options(3, 1, 16)).rfind("max_total_extend_tokens: ", 0), 0u) << verdict(options(3, 1, 16));
  const Scheduled s = schedule(request_line(0, 10, {1, 2}), options(4, 1, 16));
  ASSERT_EQ(s.batches.size(), 3u);
  EXPECT_EQ(shape(s.batches[0]), (Shape{{0, 4}}));
  EXPECT_EQ(shape(s.batches[1]), (Shape{{4, 4}}));
  EXPECT_EQ(shape(s.batches[2]), (Shape{{8, 2}}));
}

// "a pool that cannot hold one full batch (ceil(tokens / P) + requests pages)" is refused: a pool
// of exactly that many pages holds one and is accepted (caps 12 tokens / 2 requests: 3 + 2 = 5).
TEST(ImportBoundaries, APoolThatExactlyHoldsTheLargestBatchIsAccepted) {
  EXPECT_EQ(verdict(options(12, 2, 5)), "accepted");
  EXPECT_EQ(verdict(options(12, 2, 4)).rfind("pool_pages: ", 0), 0u) << verdict(options(12, 2, 4));
  const Scheduled s = schedule(request_line(0, 5, {1}) + request_line(1, 7, {2}), options(12, 2, 5));
  ASSERT_EQ(s.batches.size(), 1u);
  EXPECT_EQ(shape(s.batches[0]), (Shape{{0, 5}, {0, 7}}));
}

// "Unlocked blocks are in an LRU list; a finishing request touches its chain": a block hit again
// while unlocked becomes the most recent, whether the hit is a finishing request caching it again
// (insert of a cached block: "nothing changes but its recency") or a match that locks and unlocks it.
TEST(ImportBoundaries, ABlockHitAgainWhileUnlockedBecomesTheMostRecent) {
  mc::PageAllocator pool(3);
  for (int k = 0; k < 3; ++k) ASSERT_TRUE(pool.allocate().has_value());
  mc::PrefixCache cache(/*pages_per_block=*/1, std::nullopt);
  EXPECT_TRUE(cache.insert(10, std::vector<std::int64_t>{0}));
  EXPECT_TRUE(cache.insert(20, std::vector<std::int64_t>{1}));
  EXPECT_TRUE(cache.insert(30, std::vector<std::int64_t>{2}));  // least recent first: 10, 20, 30
  EXPECT_FALSE(cache.insert(10, std::vector<std::int64_t>{0}));  // 10 hit again: 20, 30, 10
  ASSERT_TRUE(cache.evict_one(pool));
  EXPECT_FALSE(cache.contains(20));
  EXPECT_TRUE(cache.contains(10));
  std::vector<std::int64_t> pages;
  const std::vector<std::int64_t> chain{30};
  EXPECT_EQ(cache.match_and_lock(chain, 1, pages), 1);  // 30 hit by a request: 10, 30 once unlocked
  cache.unlock(chain, 1);
  ASSERT_TRUE(cache.evict_one(pool));
  EXPECT_FALSE(cache.contains(10));
  EXPECT_TRUE(cache.contains(30));
}

// "writes the trace only when the whole import succeeds" and never over its input: an output that
// is the input under another name (a hard link, a symbolic link, a path through `..`) is the same
// file by device and inode, and is refused with the log left as it was.
TEST(ImportBoundaries, AnOutputThatIsTheInputUnderAnotherNameIsRefused) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("cpkv_import_boundaries_{}", ::getpid());
  fs::create_directories(dir / "sub");
  const fs::path log = dir / "log.jsonl";
  const std::string text = request_line(0, 100, {1}) + request_line(1, 30, {2});
  std::ofstream(log, std::ios::binary) << text;
  fs::create_hard_link(log, dir / "hard.jsonl");
  fs::create_symlink(log, dir / "soft.jsonl");
  for (const fs::path& out : {dir / "hard.jsonl", dir / "soft.jsonl", dir / "sub" / ".." / "log.jsonl"}) {
    const CliRun run = cpkv::test::run_cpkv(fmt::format("import mooncake '{}' -o '{}' --cp 2 --layers 1", log.string(), out.string()));
    cpkv::test::expect_bad_input(run, "same file");
    EXPECT_EQ(cpkv::test::slurp(log), text) << out;
  }
  fs::remove_all(dir);
}

}  // namespace

namespace {

// traces/README.md, "Overflow": under the caps alone no imported batch can overflow (the scheduler
// admits at most ceil(T / P) + R current pages, what the caps size staging for); the summary says
// so and names a --staging-mib that makes this import's fullest batch overflow, and it does.
TEST(ImportBoundaries, TheSummarySaysNoBatchCanOverflowAndHowToImportOneThatDoes) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("cpkv_import_overflow_{}", ::getpid());
  fs::create_directories(dir);
  std::string text;
  for (std::int64_t i = 0; i < 20; ++i) text += request_line(i, 1500, {3 * i, 3 * i + 1, 3 * i + 2});
  std::ofstream(dir / "log.jsonl", std::ios::binary) << text;
  const std::string base = fmt::format("import mooncake '{}' -o '{}'", (dir / "log.jsonl").string(), (dir / "trace.jsonl").string());
  const CliRun plain = cpkv::test::run_cpkv(base);
  ASSERT_EQ(plain.status, 0) << plain.err;
  EXPECT_NE(plain.out.find("overflow batches 0 (staging_slots 272 from caps): no batch can overflow: the caps admit at most "
                           "ceil(16384 / 64) + 16 = 272 current pages a batch"),
            std::string::npos)
      << plain.out;
  const std::string option = "--staging-mib ";
  const std::size_t at = plain.out.find(option);
  ASSERT_NE(at, std::string::npos) << plain.out;
  const std::int64_t mib = std::stoll(plain.out.substr(at + option.size()));
  const CliRun smaller = cpkv::test::run_cpkv(fmt::format("{} --staging-mib {}", base, mib));
  ASSERT_EQ(smaller.status, 0) << smaller.err;
  const std::size_t count_at = smaller.out.find("overflow batches ");
  ASSERT_NE(count_at, std::string::npos) << smaller.out;
  EXPECT_GE(std::stoll(smaller.out.substr(count_at + std::string("overflow batches ").size())), 1) << smaller.out;
  fs::remove_all(dir);
}

}  // namespace

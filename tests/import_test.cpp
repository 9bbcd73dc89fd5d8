// Import of Mooncake request logs and the model replay (issue 7). The importer must batch requests
// the way a paged serving system would (prefix cache on block hashes, a FIFO free list of pages,
// admission caps with chunked prefill), refuse bad input with file, line and reason, and be
// reproducible byte for byte; the model replay's closed-form byte counts must equal the model's own
// plans on every field, and its summary must equal a hand calculation.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cpkv/model/batch.hpp"
#include "cpkv/model/plan.hpp"
#include "cpkv/traces/mooncake.hpp"
#include "cli_run.hpp"
#include "cpkv/traces/trace.hpp"
#include "model_costs.hpp"

namespace {

namespace fs = std::filesystem;
namespace mc = cpkv::traces::mooncake;
using cpkv::model::Batch;
using cpkv::model::Request;
using namespace cpkv::test;  // NOLINT: the CLI tests' one runner (cli_run.hpp)

// ---------------------------------------------------------------------------------------------
// Helpers

fs::path temp_dir() {
  const fs::path dir = fs::temp_directory_path() / fmt::format("cpkv_import_test_{}", ::getpid());
  fs::create_directories(dir);
  return dir;
}

std::string write_temp(const std::string& name, const std::string& text) {
  const fs::path path = temp_dir() / name;
  std::ofstream(path, std::ios::binary) << text;
  return path.string();
}

std::string log_line(std::int64_t timestamp, std::int64_t input, std::vector<std::int64_t> hashes) {
  return nlohmann::json{{"timestamp", timestamp}, {"input_length", input}, {"output_length", 1}, {"hash_ids", hashes}}.dump() + "\n";
}

mc::MooncakeReader reader_of(const std::string& text, std::int64_t block_tokens, bool skip_bad = false) {
  return mc::MooncakeReader(std::make_unique<std::istringstream>(text), "log.jsonl", block_tokens, skip_bad);
}

std::string error_of(const std::string& text, std::int64_t block_tokens = 8) {
  auto reader = reader_of(text, block_tokens);
  try {
    while (reader.next()) {
    }
  } catch (const cpkv::traces::TraceError& e) {
    return e.what();
  }
  return "(no error)";
}

// ---------------------------------------------------------------------------------------------
// Page allocator

// A paged pool hands out never-used pages in order, then freed pages in the order they were freed:
// that is what scatters a recomputed prefix over the pool.
TEST(ImportAllocator, FreshPagesInOrderThenFreedPagesFirstInFirstOut) {
  mc::PageAllocator pool(4);
  EXPECT_EQ(pool.allocate(), 0);
  EXPECT_EQ(pool.allocate(), 1);
  EXPECT_EQ(pool.allocate(), 2);
  pool.release(2);
  pool.release(0);
  EXPECT_EQ(pool.free_pages(), 3);
  EXPECT_EQ(pool.allocate(), 3);  // fresh before freed
  EXPECT_EQ(pool.allocate(), 2);  // then freed, oldest first
  EXPECT_EQ(pool.allocate(), 0);
  EXPECT_EQ(pool.allocate(), std::nullopt);
  EXPECT_EQ(pool.used_pages(), 4);
}

// ---------------------------------------------------------------------------------------------
// Prefix cache

// The match is the longest run of LEADING cached blocks: a cached block after a miss does not count.
TEST(ImportPrefixCache, MatchIsTheLongestRunOfLeadingCachedBlocks) {
  mc::PageAllocator pool(16);
  mc::PrefixCache cache(/*pages_per_block=*/2, std::nullopt);
  EXPECT_TRUE(cache.insert(11, std::vector<std::int64_t>{0, 1}));
  EXPECT_TRUE(cache.insert(12, std::vector<std::int64_t>{2, 3}));
  EXPECT_TRUE(cache.insert(14, std::vector<std::int64_t>{4, 5}));
  EXPECT_FALSE(cache.insert(11, std::vector<std::int64_t>{6, 7}));  // already cached: caller keeps its pages
  EXPECT_EQ(cache.cached_pages(), 6);
  const std::vector<std::int64_t> hashes{11, 12, 13, 14};
  EXPECT_EQ(cache.peek(hashes), 2);  // 13 misses, so 14 does not count
  std::vector<std::int64_t> pages;
  EXPECT_EQ(cache.match_and_lock(hashes, /*max_blocks=*/4, pages), 2);
  EXPECT_EQ(pages, (std::vector<std::int64_t>{0, 1, 2, 3}));
  cache.unlock(hashes, 2);
  pages.clear();
  EXPECT_EQ(cache.match_and_lock(hashes, /*max_blocks=*/1, pages), 1);  // capped by the caller
  cache.unlock(hashes, 1);
  EXPECT_EQ(cache.peek(std::vector<std::int64_t>{99, 11}), 0);
}

// LRU eviction takes leaves first (a parent is touched after its children), never a locked block,
// and gives the pages back to the pool.
TEST(ImportPrefixCache, LruEvictsLeavesFirstAndNeverLockedBlocks) {
  mc::PageAllocator pool(3);
  for (int k = 0; k < 3; ++k) (void)pool.allocate();  // pages 0, 1, 2 hold the blocks below: the pool is full
  mc::PrefixCache cache(/*pages_per_block=*/1, /*capacity_pages=*/2);
  // A request with chain A(1) -> B(2) finishes: deepest first, so A is the more recent.
  cache.insert(2, std::vector<std::int64_t>{1});
  cache.insert(1, std::vector<std::int64_t>{0});
  cache.insert(3, std::vector<std::int64_t>{2});  // another request's one-block chain
  cache.enforce_capacity(pool);                  // 3 pages > 2: evict the LRU block, leaf B
  EXPECT_FALSE(cache.contains(2));
  EXPECT_TRUE(cache.contains(1));
  EXPECT_TRUE(cache.contains(3));
  EXPECT_EQ(cache.evicted_blocks(), 1);
  EXPECT_EQ(pool.allocate(), 1);  // B's page is free again
  // Lock A (an in-flight request matched it): eviction passes it over.
  std::vector<std::int64_t> pages;
  const std::vector<std::int64_t> chain{1, 2};
  EXPECT_EQ(cache.match_and_lock(chain, 2, pages), 1);
  EXPECT_TRUE(cache.evict_one(pool));  // 3
  EXPECT_FALSE(cache.contains(3));
  EXPECT_FALSE(cache.evict_one(pool));  // only A is left, and it is locked
  cache.unlock(chain, 1);
  EXPECT_TRUE(cache.evict_one(pool));
  EXPECT_EQ(cache.cached_blocks(), 0);
}

// ---------------------------------------------------------------------------------------------
// Scheduler

mc::ImportOptions small_options() {
  mc::ImportOptions o;
  o.setting.cp = 2;
  o.setting.page_size = 4;
  o.setting.kinds = {*cpkv::model::find_buffer_kind("kv_fp8")};
  o.setting.layer_pattern = "F";
  o.setting.pool_pages = 9;
  o.setting.caps.max_total_extend_tokens = 12;
  o.setting.caps.max_batch_requests = 2;
  o.block_tokens = 8;  // 2 pages per block
  return o;
}

void expect_request(const Request& r, std::int64_t prefix, std::int64_t extend, std::vector<std::int64_t> pages) {
  EXPECT_EQ(r.prefix_len, prefix);
  EXPECT_EQ(r.extend_len, extend);
  EXPECT_EQ(r.prefix_pages, pages);
}

// Hand calculation (P 4, blocks of 8 tokens = 2 pages, caps 12 tokens / 2 requests, pool 9 pages):
//  R0 20 tokens [1 2 3], R1 9 tokens [1 9], R2 4 tokens [7], R3 17 tokens [1 2 5].
//  batch 0: R0 misses; 20 > 12, so a chunk of 12 tokens (pages 0 1 2) ends the batch.
//  batch 1: R0's last 8 tokens lead (prefix = its chunk, pages 3 4); 4 tokens of budget left: R1
//           misses (R0 is not cached until its batch has run) and gets a 4-token chunk (page 5).
//  batch 2: R0 finished: blocks 1 (pages 0 1) and 2 (pages 2 3) enter the cache, page 4 (the
//           partial block) is freed. R1's last 5 tokens (fresh pages 6 7), then R2 (fresh page 8).
//  batch 3: R1's block 1 is already cached, so its pages 5 6 are freed with page 7; R2 frees 8.
//           R3 hits blocks 1 and 2: prefix 16 tokens on pages 0 1 2 3, 1 token computed on page 4
//           (the pool's fresh pages are spent: the oldest freed page comes back).
TEST(ImportScheduler, CapsChunksAndCacheHitsMatchAHandCalculation) {
  const std::string log = log_line(0, 20, {1, 2, 3}) + log_line(1, 9, {1, 9}) + log_line(1, 4, {7}) + log_line(5, 17, {1, 2, 5});
  auto reader = reader_of(log, 8);
  mc::BatchScheduler scheduler(reader, small_options());
  std::vector<Batch> batches;
  while (auto batch = scheduler.next_batch()) batches.push_back(*batch);
  ASSERT_EQ(batches.size(), 4u);
  ASSERT_EQ(batches[0].requests.size(), 1u);
  expect_request(batches[0].requests[0], 0, 12, {});
  ASSERT_EQ(batches[1].requests.size(), 2u);
  expect_request(batches[1].requests[0], 12, 8, {0, 1, 2});
  expect_request(batches[1].requests[1], 0, 4, {});
  ASSERT_EQ(batches[2].requests.size(), 2u);
  expect_request(batches[2].requests[0], 4, 5, {5});
  expect_request(batches[2].requests[1], 0, 4, {});
  ASSERT_EQ(batches[3].requests.size(), 1u);
  expect_request(batches[3].requests[0], 16, 1, {0, 1, 2, 3});
  const mc::ImportStats& stats = scheduler.stats();
  EXPECT_EQ(stats.requests, 4);
  EXPECT_EQ(stats.input_tokens, 20 + 9 + 4 + 17);
  EXPECT_EQ(stats.cache_hit_tokens, 16);
  EXPECT_EQ(stats.chunked_requests, 2);
  EXPECT_EQ(stats.chunk_prefix_tokens, 12 + 4);
  EXPECT_EQ(stats.extend_tokens, 12 + 8 + 4 + 5 + 4 + 1);
  // The call that found no more input first finished R3: only the cached blocks' pages 0-3 remain.
  EXPECT_EQ(scheduler.pool().used_pages(), 4);
  EXPECT_EQ(scheduler.cache().cached_pages(), 4);
}

// Every batch stays within both caps, every chunk but a request's last ends on a page boundary,
// and every prefix is whole pages: checked over a slice of the bundled Mooncake sample.
TEST(ImportScheduler, EveryBatchRespectsTheCapsOnTheBundledSample) {
  const fs::path data = fs::path(CPKV_SOURCE_DIR) / "traces" / "data" / "mooncake" / "synthetic_trace.jsonl";
  if (!fs::exists(data)) GTEST_SKIP() << "SKIPPED: " << data << " is not here";
  mc::MooncakeReader reader(data.string(), 512, false);
  mc::ImportOptions o = small_options();
  o.setting.cp = 8;
  o.setting.page_size = 64;
  o.setting.pool_pages = 4096;  // small: the cache must evict and pages get recycled
  o.setting.caps.max_total_extend_tokens = 4000;
  o.setting.caps.max_batch_requests = 5;
  o.block_tokens = 512;
  o.max_requests = 400;
  mc::BatchScheduler scheduler(reader, o);
  std::int64_t batches = 0;
  while (auto batch = scheduler.next_batch()) {
    ++batches;
    std::int64_t tokens = 0;
    EXPECT_LE(batch->requests.size(), 5u);
    for (const Request& r : batch->requests) {
      tokens += r.extend_len;
      EXPECT_EQ(r.prefix_len % 64, 0);
      EXPECT_EQ(cpkv::model::validate(o.setting, *batch), std::nullopt);
    }
    EXPECT_LE(tokens, 4000);
    EXPECT_LE(scheduler.pool().used_pages(), 4096);
  }
  EXPECT_GT(batches, 100);
  EXPECT_GT(scheduler.cache().evicted_blocks(), 0);
  EXPECT_GT(scheduler.stats().cache_hit_tokens, 0);
  EXPECT_EQ(scheduler.stats().requests, 400);
}

// ---------------------------------------------------------------------------------------------
// Bad input

TEST(ImportReader, MalformedLinesAreRefusedWithFileLineAndReason) {
  const std::string good = log_line(0, 10, {1, 2});
  EXPECT_EQ(error_of(good + "{\"timestamp\": 1, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\n"),
            "log.jsonl:2: hash_ids: 1 ids for input_length 10 (expected ceil(10 / 8) = 2)");
  EXPECT_EQ(error_of(good + "{not json\n"),
            "log.jsonl:2: json: invalid JSON at byte 3: syntax error while parsing object key - invalid literal; last read: '{no'; expected string literal");
  EXPECT_EQ(error_of(good + "\n"), "log.jsonl:2: json: blank line (every line must hold one request object)");
  EXPECT_EQ(error_of("[1, 2]\n"), "log.jsonl:1: json: expected one JSON object per line");
  EXPECT_EQ(error_of("{\"timestamp\": 0, \"output_length\": 1, \"hash_ids\": []}\n"), "log.jsonl:1: input_length: missing");
  EXPECT_EQ(error_of("{\"timestamp\": 0.5, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n"),
            "log.jsonl:1: timestamp: expected an integer, got 0.5");
  EXPECT_EQ(error_of("{\"timestamp\": 0, \"input_length\": 0, \"output_length\": 1, \"hash_ids\": []}\n"),
            "log.jsonl:1: input_length: 0 is less than 1");
  EXPECT_EQ(error_of("{\"timestamp\": 0, \"input_length\": 3, \"output_length\": 1, \"hash_ids\": [-4]}\n"),
            "log.jsonl:1: hash_ids[0]: expected a non-negative integer, got -4");
  EXPECT_EQ(error_of(log_line(7, 3, {1}) + log_line(5, 3, {1})),
            "log.jsonl:2: timestamp: 5 is earlier than the previous request's 7 (requests must be in arrival order)");
}

// The reader's limits (issue items 4a and 10) hold for Mooncake logs too, ignored keys included:
// nesting is capped with a located error, a key given twice is refused by name, and a huge key or
// value is cut in the error line.
TEST(ImportReader, DeepDuplicateAndHugeInputIsRefusedInOneShortLine) {
  const std::string fields = R"("timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [1])";
  const std::string deep = "{" + fields + R"(, "note": )" + std::string(70000, '[') + std::string(70000, ']') + "}\n";
  const std::string deep_error = error_of(deep);
  EXPECT_EQ(deep_error.rfind("log.jsonl:1: note[0][0][0]", 0), 0u) << deep_error.substr(0, 300);
  EXPECT_NE(deep_error.find(": nesting deeper than 64 levels (the reader's limit)"), std::string::npos) << deep_error.substr(0, 300);
  EXPECT_EQ(error_of("{" + fields + R"(, "input_length": 4})" + "\n"), "log.jsonl:1: input_length: duplicate key");
  EXPECT_EQ(error_of("{" + fields + R"(, "meta": {"a": [{"b": 1, "b": 2}]}})" + "\n"), "log.jsonl:1: meta.a[0].b: duplicate key");
  const std::string big(10'000'000, 'x');
  EXPECT_EQ(error_of(R"({"timestamp": ")" + big + R"(", "input_length": 3, "output_length": 1, "hash_ids": [1]})" "\n"),
            "log.jsonl:1: timestamp: expected an integer, got \"" + std::string(39, 'x') + "... (10000002 bytes)");
  EXPECT_EQ(error_of("{" + fields + ", \"" + big + "\": 1, \"" + big + "\": 2}\n"),
            "log.jsonl:1: " + std::string(64, 'x') + "... (10000000 bytes): duplicate key");
  EXPECT_LT(error_of("{\"timestamp\": \"" + big + "\n").size(), 320u);
  EXPECT_EQ(error_of("{" + fields + R"(, "hash_ids": {"a": 1}})" + "\n"), "log.jsonl:1: hash_ids: duplicate key");
  EXPECT_EQ(error_of(R"({"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": {"a": [1, 2]}})" "\n"),
            "log.jsonl:1: hash_ids: expected an array, got an object");
}

// --skip-bad never skips silently: every skipped line is counted and the first reason kept.
TEST(ImportReader, SkipBadCountsEverySkippedLine) {
  const std::string log = log_line(0, 10, {1, 2}) + "{oops\n" + log_line(1, 3, {1, 2}) + "\n" + log_line(2, 3, {5});
  auto reader = reader_of(log, 8, /*skip_bad=*/true);
  std::vector<std::int64_t> lines;
  while (auto request = reader.next()) lines.push_back(request->line);
  EXPECT_EQ(lines, (std::vector<std::int64_t>{1, 5}));
  EXPECT_EQ(reader.lines_read(), 5);
  EXPECT_EQ(reader.lines_skipped(), 3);
  EXPECT_EQ(reader.first_skip_reason(),
            "log.jsonl:2: json: invalid JSON at byte 2: syntax error while parsing object key - invalid literal; last read: '{o'; expected string literal");
}

TEST(ImportCli, MalformedLogExitsTwoWithOneLineAndWritesNothing) {
  const std::string log = write_temp("bad.jsonl", log_line(0, 600, {1, 2}) + "{\"timestamp\": 1}\n");
  const std::string out = (temp_dir() / "bad_out.jsonl").string();
  const CliRun run = run_cpkv(fmt::format("import mooncake '{}' -o '{}'", log, out));
  EXPECT_EQ(run.status, 2);
  EXPECT_TRUE(one_line(run.err)) << run.err;
  EXPECT_NE(run.err.find(log + ":2: input_length: missing"), std::string::npos) << run.err;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".partial"));
  const CliRun skipping = run_cpkv(fmt::format("import mooncake '{}' -o '{}' --skip-bad", log, out));
  EXPECT_EQ(skipping.status, 0) << skipping.err;
  EXPECT_NE(skipping.out.find("skipped as bad: 1"), std::string::npos) << skipping.out;
  EXPECT_TRUE(fs::exists(out));
}

// Impossible options are refused before any input is read: the input here does not even exist.
TEST(ImportCli, ImpossibleOptionsAreRefusedBeforeAnyWork) {
  const std::string out = (temp_dir() / "never.jsonl").string();
  const struct {
    const char* args;
    const char* message;
  } cases[] = {
      // Each refusal names the option the user typed (not the setting's internal field).
      {"--block-tokens 100", "--page-size: 64 does not divide the prefix block size 100"},
      {"--max-batch-requests 0", "--max-batch-requests: 0 is outside 1..65536"},
      {"--max-total-extend-tokens 0", "--max-total-extend-tokens: 0 is outside 1.."},
      {"--max-total-extend-tokens 32", "--max-total-extend-tokens: 32 is less than page_size 64"},
      {"--pool-pages 100", "--pool-pages: 100 pages cannot hold one full batch"},
      {"--page-size 48", "--page-size: 48 is not a power of two"},
      {"--cp 9", "--cp: 9 is outside 1..8"},
      {"--buffer-kinds kv_fp16", "--buffer-kinds: unknown buffer kind 'kv_fp16'"},
      {"--cache-pages 10 --cache-unbounded", "exclude each other"},
  };
  for (const auto& c : cases) {
    const CliRun run = run_cpkv(fmt::format("import mooncake /nonexistent/log.jsonl -o '{}' {}", out, c.args));
    EXPECT_EQ(run.status, 2) << c.args;
    EXPECT_TRUE(one_line(run.err)) << c.args << ": " << run.err;
    EXPECT_NE(run.err.find(c.message), std::string::npos) << c.args << ": " << run.err;
    EXPECT_EQ(run.err.find("/nonexistent"), std::string::npos) << "refused only after opening the input: " << run.err;
    EXPECT_FALSE(fs::exists(out));
  }
}

// ---------------------------------------------------------------------------------------------
// The bundled sample reproduces from the command traces/README.md documents.

std::string documented_import_command() {
  std::ifstream readme(fs::path(CPKV_SOURCE_DIR) / "traces" / "README.md");
  for (std::string line; std::getline(readme, line);) {
    if (line.rfind("cpkv import mooncake ", 0) == 0 && line.find("traces/samples/mooncake_slice.jsonl") != std::string::npos) {
      return line.substr(std::string("cpkv ").size());
    }
  }
  return {};
}

TEST(ImportSample, MooncakeSliceReproducesByteForByteFromItsDocumentedCommand) {
  if (!fs::exists(fs::path(CPKV_SOURCE_DIR) / "traces" / "data" / "mooncake" / "synthetic_trace.jsonl")) {
    GTEST_SKIP() << "SKIPPED: traces/data/mooncake/synthetic_trace.jsonl is missing";
  }
  std::string command = documented_import_command();
  ASSERT_FALSE(command.empty()) << "traces/README.md documents no `cpkv import mooncake` line";
  const std::string target = "-o traces/samples/mooncake_slice.jsonl";
  const std::size_t at = command.find(target);
  ASSERT_NE(at, std::string::npos) << command;
  for (const char* name : {"again_1.jsonl", "again_2.jsonl"}) {
    const std::string out = (temp_dir() / name).string();
    std::string args = command;
    args.replace(at, target.size(), fmt::format("-o '{}'", out));
    const CliRun run = run_cpkv(args);
    ASSERT_EQ(run.status, 0) << args << "\n" << run.err;
    EXPECT_EQ(slurp(out), slurp(fs::path(CPKV_SOURCE_DIR) / "traces" / "samples" / "mooncake_slice.jsonl")) << args;
  }
}

// ---------------------------------------------------------------------------------------------
// Model replay

// The closed form must be the model: compare every field of model::layer_bytes(variant_plan(...))
// for random batches under every split policy, cp 1..8, every rank, variant and layer.
TEST(ModelReplayCosts, ClosedFormEqualsTheModelOnEveryField) {
  std::mt19937_64 rng(7);  // fixed seed: the same batches on every run
  const auto draw = [&](std::int64_t lo, std::int64_t hi) { return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng); };
  for (int trial = 0; trial < 300; ++trial) {
    cpkv::model::Setting s;
    s.cp = static_cast<std::int32_t>(draw(1, 8));
    s.page_size = 1 << draw(0, 4);
    s.kinds = {*cpkv::model::find_buffer_kind(draw(0, 1) ? "kv_fp8" : "kv_bf16")};
    if (draw(0, 1)) s.kinds.push_back(*cpkv::model::find_buffer_kind("indexer_k"));
    s.layer_pattern = draw(0, 1) ? "FS" : "SF";
    s.pool_pages = 200;
    s.split = static_cast<cpkv::model::SplitPolicy>(draw(0, 2));
    Batch batch;
    for (std::int64_t r = draw(1, 6); r > 0; --r) {
      Request request;
      request.extend_len = draw(1, 90);
      for (std::int64_t k = draw(0, 5); k > 0; --k) request.prefix_pages.push_back(draw(0, 199));
      request.prefix_len = static_cast<std::int64_t>(request.prefix_pages.size()) * s.page_size;
      batch.requests.push_back(request);
    }
    cpkv::cli::BatchCounts counts;
    cpkv::cli::count_batch(s, batch, counts);
    const cpkv::model::BatchLayout layout = cpkv::model::layout_batch(s, batch);
    EXPECT_EQ(counts.slot_count, layout.slot_count);
    EXPECT_EQ(counts.current_pages_total, layout.current_pages_total);
    for (cpkv::model::Variant variant : cpkv::model::kAllVariants) {
      for (std::int32_t rank = 0; rank < s.cp; ++rank) {
        const cpkv::model::VariantPlan plan = cpkv::model::variant_plan(layout, variant, rank);
        for (std::int32_t layer = 0; layer < s.layer_count(); ++layer) {
          const auto want = cpkv::model::layer_bytes(s, plan, layer);
          const auto got = cpkv::cli::layer_bytes_from_counts(s, counts, variant, rank, layer);
          const std::string where = fmt::format("trial {} variant {} rank {} layer {}", trial, cpkv::model::to_string(variant), rank, layer);
          EXPECT_EQ(got.pulled_from, want.pulled_from) << where;
          EXPECT_EQ(got.allreduce_bytes, want.allreduce_bytes) << where;
          EXPECT_EQ(got.local_copy_bytes, want.local_copy_bytes) << where;
          EXPECT_EQ(got.allreduces, want.allreduces) << where;
          EXPECT_EQ(got.barriers, want.barriers) << where;
          EXPECT_EQ(got.gathers, want.gathers) << where;
          EXPECT_EQ(got.own_rank, want.own_rank) << where;
        }
      }
    }
  }
}

// The summary of traces/samples/tiny.jsonl by hand (cp 2, P 4, kv_fp8 656 B + indexer_k 132 B,
// layers FS: a page is 3152 B on F and 2624 B on S; see tests/cli_plan_test.cpp for the writers):
//   batches 3, requests 2 + 1 + 2 = 5, extend 6+9 + 1 + 16+13 = 45, prefix 8 + 4 = 12 tokens,
//   hit rate 12 / 57; current pages 5, 1, 8 (batch 2 overflows 6 staging slots: left out below).
//   staging_direct bytes pulled from the peer per layer: batch 0 rank 0 reads 4 pages from rank 1
//   (page 5, c1 c3 c4), rank 1 reads 3 from rank 0 (page 2, c0 c2): 4 * (3152 + 2624) / 2 = 11552
//   and 3 * 5776 / 2 = 8664; batch 1: one page each way, 2888. Samples {2888 2888 8664 11552}.
//   Time of batch 1 with peer 1 GB/s (1000 B/us), barrier 5 us, local copies made free and a gather
//   launch's fixed part 2 us (one compose launch per layer):
//   F layer 2 + 3152 / 1000 + 5 = 10.152 us, S layer 2 + 2624 / 1000 + 5 = 9.624 us -> 0.019776 ms.
TEST(ModelReplayCli, TinySummaryMatchesHandCalculation) {
  const std::string json_path = (temp_dir() / "tiny_summary.json").string();
  const CliRun run = run_cpkv(fmt::format(
      "replay traces/samples/tiny.jsonl --backend model --json '{}' --peer-gbps 1 --local-gbps 1e12 --barrier-us 5 --gather-fixed-us 2 --exact-model",
      json_path));
  ASSERT_EQ(run.status, 0) << run.err;
  const nlohmann::json s = nlohmann::json::parse(slurp(json_path));
  EXPECT_EQ(s["batches"], 3);
  EXPECT_EQ(s["requests"], 5);
  EXPECT_EQ(s["extend_tokens"], 45);
  EXPECT_EQ(s["prefix_tokens"], 12);
  EXPECT_DOUBLE_EQ(s["prefix_hit_rate"].get<double>(), 12.0 / 57.0);
  EXPECT_EQ(s["overflow_batches"], 1);
  EXPECT_EQ(s["staging_slots"], 6);
  EXPECT_EQ(s["current_pages_total"]["min"], 1);
  EXPECT_EQ(s["current_pages_total"]["p50"], 5);
  EXPECT_EQ(s["current_pages_total"]["max"], 8);
  const nlohmann::json& direct = s["variants"][6];
  ASSERT_EQ(direct["variant"], "staging_direct");
  const nlohmann::json& bytes = direct["bytes_pulled_from_peers_per_rank_per_layer"];
  EXPECT_EQ(bytes["count"], 4);
  EXPECT_DOUBLE_EQ(bytes["min"].get<double>(), 2888);
  EXPECT_DOUBLE_EQ(bytes["p50"].get<double>(), 2888);
  EXPECT_DOUBLE_EQ(bytes["max"].get<double>(), 11552);
  EXPECT_NEAR(direct["modelled_ms_per_batch"]["min"].get<double>(), 0.019776, 1e-9);
  EXPECT_EQ(s["ceilings"]["peer_gbps"], 1.0);
}

TEST(ModelReplayCli, CeilingsFileIsReadAndBadOnesRefused) {
  const std::string good = write_temp("ceilings.json", R"({"peer_gbps": 1, "local_gbps": 1e12, "barrier_us": 5, "allreduce_busbw_gbps": 100, "device": "x"})");
  const std::string json_path = (temp_dir() / "tiny_ceilings.json").string();
  const CliRun run = run_cpkv(fmt::format("replay traces/samples/tiny.jsonl --backend model --ceilings '{}' --json '{}'", good, json_path));
  ASSERT_EQ(run.status, 0) << run.err;
  const nlohmann::json s = nlohmann::json::parse(slurp(json_path));
  // As in TinySummaryMatchesHandCalculation, with the file's barrier and the nominal gather fixed part 9 us: + 2 x (9 - 2) us.
  EXPECT_NEAR(s["variants"][6]["modelled_ms_per_batch"]["min"].get<double>(), 0.019776 + 0.014, 1e-9);
  EXPECT_EQ(s["ceilings"]["allreduce_busbw_gbps"], 100.0);
  EXPECT_EQ(s["ceilings"]["gather_fixed_us"], 9.0);
  const std::string bad = write_temp("ceilings_bad.json", R"({"peer_gbps": 0, "local_gbps": 1, "barrier_us": 5})");
  const CliRun refused = run_cpkv(fmt::format("replay traces/samples/tiny.jsonl --backend model --ceilings '{}'", bad));
  EXPECT_EQ(refused.status, 2);
  EXPECT_TRUE(one_line(refused.err)) << refused.err;
  EXPECT_NE(refused.err.find("\"peer_gbps\" must be a positive number"), std::string::npos) << refused.err;
  const CliRun wrong_backend = run_cpkv("replay traces/samples/tiny.jsonl --backend sim --peer-gbps 3");
  EXPECT_EQ(wrong_backend.status, 2);
  EXPECT_TRUE(one_line(wrong_backend.err)) << wrong_backend.err;
}

// A cpkv bench JSON as the ceilings file: the model's ceilings derived from what the bench measured
// (cpkv bench prints the same). By hand: launch = graph barrier 3 - launch-free 1.5 = 1.5 us; barrier
// = launch-free 1.5 us; gather fixed part from the sweep point with the fewest pages of the largest
// page (64 x 41,984 B = 2,686,976 B at 268.6976 GB/s = 10 us), less those bytes at the copy-engine
// rate (2686.976 GB/s: 1 us), less the launch a graph saves (barrier 5 - graph barrier 3 = 2 us): 7 us.
TEST(ModelReplayCli, BenchJsonCeilingsAreDerivedFromTheMeasurements) {
  const std::string bench = write_temp("bench.json", R"({"peer_gbps": 99, "local_gbps": 99, "barrier_us": 99, "rows": [], "ceilings": {
      "ce_peer_gbps": 2686.976, "local_copy_gbps": 2000, "barrier_us": 5, "barrier_us_graph": 3, "barrier_us_launch_free": 1.5,
      "allreduce_busbw_gbps": 250, "allreduce_latency_us": 11,
      "allreduce_curve": [{"bytes": 4096, "us": 6}, {"bytes": 1048576, "us": 15}],
      "gather": [{"page_bytes": 41984, "pages": 256, "gbps": 1}, {"page_bytes": 8448, "pages": 64, "gbps": 1},
                 {"page_bytes": 41984, "pages": 64, "gbps": 268.6976}]}})");
  const std::string json_path = (temp_dir() / "tiny_bench_ceilings.json").string();
  const CliRun run = run_cpkv(fmt::format("replay traces/samples/tiny.jsonl --backend model --ceilings '{}' --json '{}'", bench, json_path));
  ASSERT_EQ(run.status, 0) << run.err;
  const nlohmann::json c = nlohmann::json::parse(slurp(json_path))["ceilings"];
  EXPECT_DOUBLE_EQ(c["peer_gbps"].get<double>(), 2686.976);
  EXPECT_DOUBLE_EQ(c["local_gbps"].get<double>(), 2000.0);
  EXPECT_DOUBLE_EQ(c["barrier_us"].get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(c["launch_us"].get<double>(), 1.5);
  EXPECT_NEAR(c["gather_fixed_us"].get<double>(), 7.0, 1e-9);
  EXPECT_DOUBLE_EQ(c["allreduce_busbw_gbps"].get<double>(), 250.0);
  EXPECT_DOUBLE_EQ(c["allreduce_latency_us"].get<double>(), 11.0);
  const auto curve = c["allreduce_curve"].get<std::vector<std::pair<double, double>>>();
  EXPECT_EQ(curve, (std::vector<std::pair<double, double>>{{4096.0, 6.0}, {1048576.0, 15.0}}));
}

// A bench run without NCCL (cp 1) writes its all-reduce ceilings as 0: not measured. Such a file is
// read, the nominal all-reduce ceilings stay, and a negative value is still refused.
TEST(ModelReplayCli, BenchJsonWithoutAllreduceMeasurementsIsRead) {
  const char* ceilings = R"("ce_peer_gbps": 370, "local_copy_gbps": 2000, "barrier_us": 5, "barrier_us_graph": 3, "barrier_us_launch_free": 1.5)";
  const std::string bench = write_temp("bench_cp1.json", fmt::format(R"({{"ceilings": {{{}, "allreduce_busbw_gbps": 0, "allreduce_latency_us": 0}}}})", ceilings));
  const std::string json_path = (temp_dir() / "tiny_cp1_ceilings.json").string();
  const CliRun run = run_cpkv(fmt::format("replay traces/samples/tiny.jsonl --backend model --ceilings '{}' --json '{}'", bench, json_path));
  ASSERT_EQ(run.status, 0) << run.err;
  const nlohmann::json c = nlohmann::json::parse(slurp(json_path))["ceilings"];
  EXPECT_DOUBLE_EQ(c["allreduce_busbw_gbps"].get<double>(), cpkv::cli::Ceilings{}.allreduce_busbw_gbps);
  EXPECT_DOUBLE_EQ(c["allreduce_latency_us"].get<double>(), cpkv::cli::Ceilings{}.allreduce_latency_us);
  const std::string negative = write_temp("bench_negative.json", fmt::format(R"({{"ceilings": {{{}, "allreduce_busbw_gbps": -1}}}})", ceilings));
  const CliRun refused = run_cpkv(fmt::format("replay traces/samples/tiny.jsonl --backend model --ceilings '{}'", negative));
  EXPECT_EQ(refused.status, 2);
  EXPECT_TRUE(one_line(refused.err)) << refused.err;
  EXPECT_NE(refused.err.find("allreduce_busbw_gbps"), std::string::npos) << refused.err;
}

TEST(ModelReplayCli, BenchJsonAllreduceCurveMustIncrease) {
  const std::string bench = write_temp("bench_bad_curve.json", R"({"ceilings": {
      "ce_peer_gbps": 370, "local_copy_gbps": 2000, "barrier_us": 5, "barrier_us_graph": 3, "barrier_us_launch_free": 1.5,
      "allreduce_curve": [{"bytes": 65536, "us": 6}, {"bytes": 4096, "us": 15}]}})");
  const CliRun run = run_cpkv(fmt::format("replay traces/samples/tiny.jsonl --backend model --ceilings '{}'", bench));
  EXPECT_EQ(run.status, 2);
  EXPECT_TRUE(one_line(run.err)) << run.err;
  EXPECT_NE(run.err.find("allreduce_curve"), std::string::npos) << run.err;
  EXPECT_TRUE(run.out.empty()) << run.out;
}

// One all-reduce call from the measured curve, by hand: points (1000 B, 10 us), (5000 B, 30 us);
// bus bandwidth 1000 B/us; cp 2 (2(cp-1)/cp = 1).
TEST(CostModel, AllreduceCallFollowsTheMeasuredCurve) {
  cpkv::cli::Ceilings c;
  c.allreduce_busbw_gbps = 1.0;
  c.allreduce_latency_us = 7.0;
  EXPECT_NEAR(cpkv::cli::allreduce_call_us(c, 3000, 2), 7 + 3, 1e-9);  // no curve: latency + bytes / busbw
  c.allreduce_curve = {{1000, 10}, {5000, 30}};
  EXPECT_NEAR(cpkv::cli::allreduce_call_us(c, 500, 2), 10, 1e-9);   // below the curve: its first point
  EXPECT_NEAR(cpkv::cli::allreduce_call_us(c, 3000, 2), 20, 1e-9);  // halfway between the points
  EXPECT_NEAR(cpkv::cli::allreduce_call_us(c, 5000, 2), 30, 1e-9);
  EXPECT_NEAR(cpkv::cli::allreduce_call_us(c, 7000, 2), 32, 1e-9);  // past it: 2000 more bytes at 1000 B/us
  EXPECT_NEAR(cpkv::cli::allreduce_call_us(c, 7000, 4), 33, 1e-9);  // cp 4: 2(cp-1)/cp = 1.5
}

// layer_time_us term by term (PROTOCOL.md section 7's steps as gpu/executor.cpp runs them), by hand:
// cp 2, page size 1, kv_fp8 only (a page is 656 B), F layer; rank 0 owns 3 prefix pages and writes 2
// current ones, rank 1 owns 5 and writes 4; 14 slots, 6 current pages. Ceilings: peer 1000 B/us,
// local 500 B/us, barrier 3 us, all-reduce 1000 B/us bus + 7 us per call, launch 11 us, gather fixed 13 us.
cpkv::model::Setting hand_setting(std::vector<cpkv::model::BufferKind> kinds, const std::string& pattern) {
  cpkv::model::Setting s;
  s.cp = 2;
  s.page_size = 1;
  s.kinds = std::move(kinds);
  s.layer_pattern = pattern;
  s.pool_pages = 100;
  s.split = cpkv::model::SplitPolicy::zigzag;
  return s;
}

cpkv::cli::BatchCounts hand_counts() {
  cpkv::cli::BatchCounts c;
  c.requests = 1;
  c.slot_count = 14;
  c.current_pages_total = 6;
  c.prefix_pages_by_owner = {3, 5};
  c.current_pages_by_writer = {2, 4};
  return c;
}

cpkv::cli::Ceilings hand_ceilings() {
  cpkv::cli::Ceilings ceilings;
  ceilings.peer_gbps = 1.0;
  ceilings.local_gbps = 0.5;
  ceilings.barrier_us = 3.0;
  ceilings.allreduce_busbw_gbps = 1.0;
  ceilings.allreduce_latency_us = 7.0;
  ceilings.launch_us = 11.0;
  ceilings.gather_fixed_us = 13.0;
  return ceilings;
}

TEST(CostModel, LayerTimeTermsByHand) {
  const cpkv::model::Setting s = hand_setting({*cpkv::model::find_buffer_kind("kv_fp8")}, "F");
  cpkv::cli::BatchCounts c = hand_counts();
  const cpkv::cli::Ceilings ceilings = hand_ceilings();
  const auto time_us = [&](cpkv::model::Variant v, std::int64_t dense_slots) {
    return cpkv::cli::layer_time_us(s, c, v, cpkv::cli::layer_bytes_from_counts(s, c, v, 0, 0), ceilings, 656, 0, dense_slots);
  };
  using cpkv::model::Variant;
  // symm_dense: launch 13 + barrier 3 + the longer of 9 peer pages (5904 B / 1000) and 3 own prefix
  // pages (1968 B / 500): pulls and own-memory copies run at once on the launch's warps.
  EXPECT_NEAR(time_us(Variant::symm_dense, 0), 13 + 3 + std::max(5.904, 3.936), 1e-9);
  // staging_direct: the own current pages are read from own staging after the barrier: 5 local pages
  // (6.56 us), now longer than the pulls.
  EXPECT_NEAR(time_us(Variant::staging_direct, 0), 13 + 3 + std::max(5.904, 6.56), 1e-9);
  // staging_publish: the publish (2 pages, 1312 B / 500) is serial before the signal, with its own fixed part.
  EXPECT_NEAR(time_us(Variant::staging_publish, 0), 13 + (13 + 2.624) + 3 + std::max(5.904, 3.936), 1e-9);
  // fused_ar: memset of the dense buffer (launch 11 + 20 slots x 656 B / 500), the compose launch
  // (13 + own prefix 3.936), one all-reduce (7 + 14 x 656 B x 2(cp-1)/cp / 1000).
  EXPECT_NEAR(time_us(Variant::fused_ar, 20), (11 + 26.24) + (13 + 3.936) + (7 + 9.184), 1e-9);
  // ... a dense buffer smaller than the batch is the batch's 14 slots.
  EXPECT_NEAR(time_us(Variant::fused_ar, 0), (11 + 18.368) + (13 + 3.936) + (7 + 9.184), 1e-9);
  // v2: compose launch 13 with the pack serial before the rest (13 + 2.624), the longer of prefix from
  // the peer (5 pages, 3.28) and own (3.936); the compact all-reduce (7 + 6 x 656 B / 1000); the unpack
  // launch (13 + 6 pages 3936 B / 500).
  EXPECT_NEAR(time_us(Variant::v2, 0), 13 + (13 + 2.624) + std::max(3.28, 3.936) + (7 + 3.936) + (13 + 7.872), 1e-9);
  // legacy_span_ar, two requests' spans: 8 prefix pages, none current; none prefix, 6 current. The
  // memset and the compose launch as fused_ar's, then one call per non-empty span (an empty one
  // enqueues nothing): (7 + 8 x 656 B / 1000) + (7 + 6 x 656 B / 1000).
  c.requests = 2;
  c.span_pages = {8, 0, 0, 6};
  EXPECT_NEAR(time_us(Variant::legacy_span_ar, 0), (11 + 18.368) + (13 + 3.936) + (7 + 5.248) + (7 + 3.936), 1e-9);
}

// The dense all-reduce variants' memset clears the dense half of every kind, also a kind that is
// not active on the layer (gpu/executor.cpp run_layer): on a shared (S) layer of kv_fp8 (656 B,
// every layer) + indexer_k (132 B, full layers only), 20 slots x 788 B at 500 B/us, while the
// compose launch and the all-reduce move kv_fp8 only. Counts and ceilings as above.
TEST(CostModel, DenseZeroCoversEveryKindOnASharedLayer) {
  const cpkv::model::Setting s = hand_setting({*cpkv::model::find_buffer_kind("kv_fp8"), *cpkv::model::find_buffer_kind("indexer_k")}, "S");
  const cpkv::cli::BatchCounts c = hand_counts();
  const cpkv::cli::Ceilings ceilings = hand_ceilings();
  const cpkv::model::Variant v = cpkv::model::Variant::fused_ar;
  const double us = cpkv::cli::layer_time_us(s, c, v, cpkv::cli::layer_bytes_from_counts(s, c, v, 0, 0), ceilings, 656, 0, 20);
  EXPECT_NEAR(us, (11 + 31.52) + (13 + 3.936) + (7 + 9.184), 1e-9);
}

// The chart needs python3 + matplotlib; without them the command says so in one line and exits 2.
TEST(ModelReplayCli, ChartIsDrawnOrRefusedInOneLine) {
  const std::string png = (temp_dir() / "tiny.png").string();
  const bool have_matplotlib = std::system("python3 -c 'import matplotlib' > /dev/null 2>&1") == 0;
  const CliRun run = run_cpkv(fmt::format("replay traces/samples/tiny.jsonl --backend model --chart '{}'", png));
  if (have_matplotlib) {
    EXPECT_EQ(run.status, 0) << run.err;
    EXPECT_TRUE(fs::exists(png));
  } else {
    EXPECT_EQ(run.status, 2);
    EXPECT_TRUE(one_line(run.err)) << run.err;
    EXPECT_NE(run.err.find("matplotlib"), std::string::npos) << run.err;
    EXPECT_TRUE(run.out.empty()) << "refused before any work: " << run.out;
  }
}

}  // namespace

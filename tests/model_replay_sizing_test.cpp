// The model replay's sizing answers (issue 26, item 2): an overflow rejects only the variants that
// read peers' current pages from staging (kVariantTable's peer_pages; PROTOCOL.md section 4: the
// verdict is about staging slots), --ceilings from another setting, --per-batch, --staging-mib.
// Every expectation is worked out from traces/samples/tiny.jsonl's header and batches by hand:
// cp 2, P 4, kinds kv_fp8 (656 B) + indexer_k (132 B), layers FS, staging_slots ceil(16/4)+2 = 6;
// batch 0: 2 requests, 15 extend and 8 prefix tokens, 2 + 3 current pages, 2 prefix pages: 7 slots;
// batch 1: 1 request, 1 extend and 4 prefix tokens, 1 current page, 1 prefix page: 2 slots;
// batch 2: 2 requests, 29 extend tokens, 4 + 4 = 8 current pages > 6 staging slots: overflow.
#include <algorithm>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_run.hpp"
#include "cpkv/model/variants.hpp"

namespace {

namespace fs = std::filesystem;
using namespace cpkv::test;  // NOLINT: the CLI tests' one runner (cli_run.hpp)

fs::path dir() { return cpkv::test::temp_dir("cpkv_sizing_test"); }
std::string at(const std::string& name) { return (dir() / name).string(); }

// From the table, not from a list of names: the variants whose peers' current pages live in staging.
bool reads_staging(cpkv::model::Variant v) { return cpkv::model::info(v).peer_pages == cpkv::model::PeerPages::staging; }

nlohmann::json replay_json(const std::string& options) {
  const std::string json = at("summary.json");
  const CliRun run = run_cpkv(fmt::format("replay traces/samples/tiny.jsonl --backend model --json '{}' {}", json, options));
  EXPECT_EQ(run.status, 0) << run.err;
  return nlohmann::json::parse(slurp(json));
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::vector<std::string> cells_of(const std::string& line) {
  std::vector<std::string> cells;
  std::istringstream in(line);
  for (std::string cell; std::getline(in, cell, ',');) cells.push_back(cell);
  if (!line.empty() && line.back() == ',') cells.emplace_back();
  return cells;
}

TEST(ModelReplaySizing, OverflowRejectsOnlyTheStagingVariants) {
  const nlohmann::json s = replay_json("");
  EXPECT_EQ(s["overflow_batches"], 1);
  ASSERT_EQ(s["variants"].size(), cpkv::model::kVariantCount);
  int staging = 0;
  for (std::size_t v = 0; v < cpkv::model::kVariantCount; ++v) {
    const nlohmann::json& row = s["variants"][v];
    const bool uses = reads_staging(cpkv::model::kAllVariants[v]);
    staging += uses ? 1 : 0;
    SCOPED_TRACE(row["variant"].get<std::string>());
    EXPECT_EQ(row["batches_rejected"], uses ? 1 : 0);
    EXPECT_EQ(row["batches_counted"], uses ? 2 : 3);
    EXPECT_EQ(row["modelled_ms_per_batch"]["count"], uses ? 2 : 3);
  }
  EXPECT_EQ(staging, 2);  // staging_publish and staging_direct (the table's rows say so)
  // The overflowing batch alone: the others run it and it costs them time; the staging variants none.
  const nlohmann::json only = replay_json("--batch 2");
  for (std::size_t v = 0; v < cpkv::model::kVariantCount; ++v) {
    SCOPED_TRACE(only["variants"][v]["variant"].get<std::string>());
    const bool uses = reads_staging(cpkv::model::kAllVariants[v]);
    EXPECT_EQ(only["variants"][v]["batches_counted"], uses ? 0 : 1);
    if (uses) {
      EXPECT_EQ(only["variants"][v]["modelled_ms_total"], 0.0);
    } else {
      EXPECT_GT(only["variants"][v]["modelled_ms_total"].get<double>(), 0.0);
    }
  }
}

TEST(ModelReplaySizing, CeilingsFromAnotherSettingAreRefusedUnlessAsked) {
  const std::string ceilings = R"("peer_gbps": 1, "local_gbps": 1e12, "barrier_us": 5)";
  const std::string other_cp = write_temp("cpkv_sizing_test", "cp8.json", "{" + ceilings + R"(, "cp": 8})");
  const std::string base = "replay traces/samples/tiny.jsonl --backend model --ceilings ";
  const CliRun refused = run_cpkv(base + other_cp);
  EXPECT_EQ(refused.status, 2) << refused.err;
  EXPECT_TRUE(one_line(refused.err)) << refused.err;
  EXPECT_NE(refused.err.find("cp 8"), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find("cp 2"), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find("tiny.jsonl"), std::string::npos) << refused.err;
  EXPECT_TRUE(refused.out.empty()) << refused.out;
  EXPECT_EQ(run_cpkv(base + other_cp + " --ceilings-any").status, 0);
  const std::string other_page = write_temp("cpkv_sizing_test", "p16.json", "{" + ceilings + R"(, "cp": 2, "page_size": 16})");
  const CliRun page_refused = run_cpkv(base + other_page);
  EXPECT_EQ(page_refused.status, 2) << page_refused.err;
  EXPECT_TRUE(one_line(page_refused.err)) << page_refused.err;
  EXPECT_NE(page_refused.err.find("page size 16"), std::string::npos) << page_refused.err;
  EXPECT_NE(page_refused.err.find("page size 4"), std::string::npos) << page_refused.err;
  const std::string same = write_temp("cpkv_sizing_test", "same.json", "{" + ceilings + R"(, "cp": 2, "page_size": 4})");
  EXPECT_EQ(run_cpkv(base + same).status, 0);
}

// With peer 1 GB/s, barrier 5 us, local copies free and a gather launch's fixed part 2 us, batch 1's
// staging_direct time is 0.019776 ms (tests/model_costs_test.cpp works it out), of it one barrier a
// layer: 2 x 5 us; staging_direct issues no all-reduce.
TEST(ModelReplaySizing, PerBatchCsvHasOneRowPerBatchWithComponents) {
  const std::string ceilings = "--peer-gbps 1 --local-gbps 1e12 --barrier-us 5 --gather-fixed-us 2";
  const nlohmann::json totals = replay_json(ceilings);  // without --per-batch: the cost model's own totals
  const CliRun run = run_cpkv(fmt::format("replay traces/samples/tiny.jsonl --backend model {} --per-batch '{}'", ceilings, at("b.csv")));
  ASSERT_EQ(run.status, 0) << run.err;
  const std::vector<std::string> lines = lines_of(slurp(at("b.csv")));
  ASSERT_EQ(lines.size(), 4u);
  const std::vector<std::string> header = cells_of(lines[0]);
  const auto column = [&](const std::string& name) {
    const auto it = std::find(header.begin(), header.end(), name);
    EXPECT_NE(it, header.end()) << name;
    return static_cast<std::size_t>(it - header.begin());
  };
  const std::vector<std::vector<std::string>> want = {{"0", "2", "15", "8", "5", "7", "ok"}, {"1", "1", "1", "4", "1", "2", "ok"},
                                                      {"2", "2", "29", "0", "8", "8", "overflow"}};
  const char* keys[] = {"batch", "requests", "extend_tokens", "prefix_tokens", "current_pages", "slots", "verdict"};
  std::vector<double> direct_ms;
  for (std::size_t b = 0; b < 3; ++b) {
    const std::vector<std::string> row = cells_of(lines[b + 1]);
    ASSERT_EQ(row.size(), header.size()) << lines[b + 1];
    for (std::size_t k = 0; k < 7; ++k) EXPECT_EQ(row[column(keys[k])], want[b][k]) << keys[k] << " of batch " << b;
    for (cpkv::model::Variant v : cpkv::model::kAllVariants) {
      const std::string name(cpkv::model::to_string(v));
      const std::string ms = row[column(name + "_ms")];
      if (b == 2 && reads_staging(v)) {
        EXPECT_TRUE(ms.empty()) << name;
        continue;
      }
      ASSERT_FALSE(ms.empty()) << name << " batch " << b;
      const double parts = std::stod(row[column(name + "_copies_ms")]) + std::stod(row[column(name + "_barrier_ms")]) +
                           std::stod(row[column(name + "_allreduce_ms")]) + std::stod(row[column(name + "_allgather_ms")]);
      EXPECT_NEAR(parts, std::stod(ms), 1e-9) << name << " batch " << b;
      double components = 0;  // zeroing, fill, launch, local copies, peer pulls, barrier, all-reduce, all-gather
      for (const char* part : {"_zero_ms", "_fill_ms", "_launch_ms", "_local_ms", "_peer_ms", "_barrier_ms", "_allreduce_ms", "_allgather_ms"}) {
        components += std::stod(row[column(name + part)]);
      }
      EXPECT_NEAR(components, std::stod(ms), 1e-9) << name << " batch " << b;
    }
    direct_ms.push_back(row[column("staging_direct_ms")].empty() ? 0.0 : std::stod(row[column("staging_direct_ms")]));
    if (b == 1) {
      EXPECT_NEAR(std::stod(row[column("staging_direct_ms")]), 0.019776, 1e-9);
      EXPECT_NEAR(std::stod(row[column("staging_direct_barrier_ms")]), 0.010, 1e-12);
      EXPECT_EQ(std::stod(row[column("staging_direct_allreduce_ms")]), 0.0);
      EXPECT_EQ(std::stod(row[column("staging_direct_allgather_ms")]), 0.0);
    }
    // Section 12: no staging, so the overflowing batch 2 is run by the all-gather variants too.
    for (const char* name : {"allgather_zigzag", "allgather_continuous"}) {
      EXPECT_GT(std::stod(row[column(std::string(name) + "_allgather_ms")]), 0.0) << name << " batch " << b;
    }
  }
  EXPECT_NEAR(direct_ms[0] + direct_ms[1], totals["variants"][6]["modelled_ms_total"].get<double>(), 1e-9);
}

TEST(ModelReplaySizing, PerBatchJsonLinesAndItsFileRules) {
  const CliRun run = run_cpkv(fmt::format("replay traces/samples/tiny.jsonl --backend model --per-batch '{}'", at("b.jsonl")));
  ASSERT_EQ(run.status, 0) << run.err;
  const std::vector<std::string> lines = lines_of(slurp(at("b.jsonl")));
  ASSERT_EQ(lines.size(), 3u);
  for (std::size_t b = 0; b < 3; ++b) {
    const nlohmann::json record = nlohmann::json::parse(lines[b]);
    EXPECT_EQ(record["batch"], b);
    for (cpkv::model::Variant v : cpkv::model::kAllVariants) {
      const nlohmann::json& costs = record["variants"][std::string(cpkv::model::to_string(v))];
      EXPECT_EQ(costs.is_null(), b == 2 && reads_staging(v)) << cpkv::model::to_string(v) << " batch " << b;
    }
  }
  const CliRun to_folder = run_cpkv(fmt::format("replay traces/samples/tiny.jsonl --backend model --per-batch '{}'", dir().string()));
  EXPECT_EQ(to_folder.status, 2);
  EXPECT_TRUE(one_line(to_folder.err)) << to_folder.err;
  EXPECT_NE(to_folder.err.find("--per-batch"), std::string::npos) << to_folder.err;
  const CliRun same = run_cpkv(fmt::format("replay traces/samples/tiny.jsonl --backend model --per-batch '{0}' --json '{0}'", at("x.json")));
  EXPECT_EQ(same.status, 2);
  EXPECT_TRUE(one_line(same.err)) << same.err;
  const CliRun sim = run_cpkv(fmt::format("replay traces/samples/tiny.jsonl --backend sim --per-batch '{}'", at("y.jsonl")));
  EXPECT_EQ(sim.status, 2);
  EXPECT_FALSE(fs::exists(at("y.jsonl")));
}

// PROTOCOL.md section 4: an explicit MiB override wins over the caps; slots = bytes / (2 x P x sum
// row_bytes) = 2^20 / (2 x 4 x 788) = 166, so batch 2's 8 current pages fit and nothing is rejected.
TEST(ModelReplaySizing, StagingMibOverridesTheCaps) {
  const nlohmann::json s = replay_json("--staging-mib 1");
  EXPECT_EQ(s["staging_slots"], 166);
  EXPECT_EQ(s["staging_source"], "mib_override");
  EXPECT_EQ(s["overflow_batches"], 0);
  for (const nlohmann::json& row : s["variants"]) EXPECT_EQ(row["batches_counted"], 3) << row["variant"];
  const CliRun zero = run_cpkv("replay traces/samples/tiny.jsonl --backend model --staging-mib 0");
  EXPECT_EQ(zero.status, 2);
  EXPECT_TRUE(one_line(zero.err)) << zero.err;
}

// --staging-sweep on the Mooncake slice (cp 8, P 64, kv_fp8 656 B + indexer_k 132 B): PROTOCOL.md
// section 4's staging slots of S MiB are S x 2^20 / (2 x P x sum row_bytes) = S x 2^20 / 100864, and
// a batch overflows when its current pages exceed them. Each size's count, the smallest size of the
// sweep with none and the smallest whole MiB with none are worked out here from the per-batch pages;
// the two sizes around the smallest are checked again with --staging-mib.
TEST(ModelReplaySizing, StagingSweepCountsOverflowsPerSizeAndNamesTheSmallestThatAdmitsAll) {
  const std::string trace = "traces/samples/mooncake_slice.jsonl";
  const CliRun run = run_cpkv(fmt::format("replay {} --backend model --staging-sweep 1:40:3 --json '{}' --per-batch '{}'", trace, at("sweep.json"), at("sweep.jsonl")));
  ASSERT_EQ(run.status, 0) << run.err;
  std::vector<std::int64_t> pages;
  for (const std::string& line : lines_of(slurp(at("sweep.jsonl")))) pages.push_back(nlohmann::json::parse(line)["current_pages"].get<std::int64_t>());
  ASSERT_FALSE(pages.empty());
  const std::int64_t most = *std::max_element(pages.begin(), pages.end());
  const auto slots = [](std::int64_t mib) { return (mib << 20) / (2 * 64 * (656 + 132)); };
  const auto overflows = [&](std::int64_t mib) { return std::count_if(pages.begin(), pages.end(), [&](std::int64_t p) { return p > slots(mib); }); };
  const nlohmann::json sweep = nlohmann::json::parse(slurp(at("sweep.json")))["staging_sweep"];
  ASSERT_EQ(sweep["sizes"].size(), 14u);  // 1, 4, ..., 40
  nlohmann::json first_clean = nullptr;
  for (std::size_t i = 0; i < 14; ++i) {
    const std::int64_t mib = 1 + 3 * static_cast<std::int64_t>(i);
    const nlohmann::json& size = sweep["sizes"][i];
    EXPECT_EQ(size["mib"], mib);
    EXPECT_EQ(size["staging_slots"], slots(mib)) << mib;
    EXPECT_EQ(size["overflow_batches"], overflows(mib)) << mib;
    if (overflows(mib) == 0 && first_clean.is_null()) first_clean = mib;
  }
  EXPECT_GT(overflows(1), 0) << "the sweep starts where some batch overflows";
  EXPECT_EQ(sweep["smallest_admitting_mib_in_sweep"], first_clean);
  std::int64_t smallest = 1;
  while (slots(smallest) < most) ++smallest;
  EXPECT_EQ(sweep["smallest_admitting_mib"], smallest);
  EXPECT_EQ(sweep["current_pages_total_max"], most);
  EXPECT_NE(run.out.find(fmt::format("{} MiB ({} slots) exactly", smallest, slots(smallest))), std::string::npos) << run.out;
  for (const std::int64_t mib : {smallest - 1, smallest}) {
    const CliRun at_size = run_cpkv(fmt::format("replay {} --backend model --staging-mib {} --json '{}'", trace, mib, at("one.json")));
    ASSERT_EQ(at_size.status, 0) << at_size.err;
    EXPECT_EQ(nlohmann::json::parse(slurp(at("one.json")))["overflow_batches"], overflows(mib)) << mib;
  }
  EXPECT_GT(overflows(smallest - 1), 0);
}

TEST(ModelReplaySizing, StagingSweepRefusesWhatIsNoSweepInOneLine) {
  for (const char* bad : {"5:1:1", "1:5", "1:5:0", "a:b:c", "0:4:1", "1:4:1:2", "1:2000000000:1"}) {
    const CliRun run = run_cpkv(fmt::format("replay traces/samples/tiny.jsonl --backend model --staging-sweep '{}' --json '{}'", bad, at("no.json")));
    EXPECT_EQ(run.status, 2) << bad;
    EXPECT_TRUE(one_line(run.err)) << run.err;
    EXPECT_NE(run.err.find("--staging-sweep"), std::string::npos) << run.err;
    EXPECT_TRUE(run.out.empty()) << run.out;
    EXPECT_FALSE(fs::exists(at("no.json"))) << bad;
  }
  const CliRun sim = run_cpkv("replay traces/samples/tiny.jsonl --backend sim --staging-sweep 1:2:1");
  EXPECT_EQ(sim.status, 2);
  EXPECT_NE(sim.err.find("--staging-sweep"), std::string::npos) << sim.err;
}

}  // namespace

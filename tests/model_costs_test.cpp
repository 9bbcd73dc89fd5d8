// The cost model (model/costs.hpp) and the model replay (harness/model_replay.hpp, `cpkv replay
// --backend model`): the closed-form byte counts against the model's own plans on every field,
// the modelled time's terms by hand, the ceilings files, the summary and the chart.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_run.hpp"
#include "cpkv/model/batch.hpp"
#include "cpkv/model/costs.hpp"
#include "cpkv/model/plan.hpp"
#include "cpkv/model/variants.hpp"
#include "cpkv/traces/trace.hpp"

namespace {

namespace fs = std::filesystem;
using cpkv::model::Batch;
using cpkv::model::Request;
using namespace cpkv::test;  // NOLINT: the CLI tests' one runner (cli_run.hpp)

fs::path temp_dir() { return cpkv::test::temp_dir("cpkv_costs_test"); }
std::string write_temp(const std::string& name, const std::string& text) { return cpkv::test::write_temp("cpkv_costs_test", name, text); }

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
    cpkv::model::BatchCounts counts;
    cpkv::model::count_batch(s, batch, counts);
    const cpkv::model::BatchLayout layout = cpkv::model::layout_batch(s, batch);
    EXPECT_EQ(counts.slot_count, layout.slot_count);
    EXPECT_EQ(counts.current_pages_total, layout.current_pages_total);
    for (cpkv::model::Variant variant : cpkv::model::kAllVariants) {
      for (std::int32_t rank = 0; rank < s.cp; ++rank) {
        const cpkv::model::VariantPlan plan = cpkv::model::variant_plan(layout, variant, rank);
        for (std::int32_t layer = 0; layer < s.layer_count(); ++layer) {
          const auto want = cpkv::model::layer_bytes(s, plan, layer);
          const auto got = cpkv::model::layer_bytes_from_counts(s, counts, variant, rank, layer);
          const std::string where = fmt::format("trial {} variant {} rank {} layer {}", trial, cpkv::model::to_string(variant), rank, layer);
          EXPECT_EQ(got.pulled_from, want.pulled_from) << where;
          EXPECT_EQ(got.allreduce_bytes, want.allreduce_bytes) << where;
          EXPECT_EQ(got.local_copy_bytes, want.local_copy_bytes) << where;
          EXPECT_EQ(got.allreduces, want.allreduces) << where;
          EXPECT_EQ(got.barriers, want.barriers) << where;
          EXPECT_EQ(got.gathers, want.gathers) << where;
          EXPECT_EQ(got.own_rank, want.own_rank) << where;
          EXPECT_EQ(got.allgather_bytes, want.allgather_bytes) << where;
          EXPECT_EQ(got.allgathers, want.allgathers) << where;
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
  EXPECT_DOUBLE_EQ(c["allreduce_busbw_gbps"].get<double>(), cpkv::model::CostParameters{}.allreduce_busbw_gbps);
  EXPECT_DOUBLE_EQ(c["allreduce_latency_us"].get<double>(), cpkv::model::CostParameters{}.allreduce_latency_us);
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
  cpkv::model::CostParameters c;
  c.allreduce_busbw_gbps = 1.0;
  c.allreduce_latency_us = 7.0;
  EXPECT_NEAR(cpkv::model::allreduce_call_us(c, 3000, 2), 7 + 3, 1e-9);  // no curve: latency + bytes / busbw
  c.allreduce_curve = {{1000, 10}, {5000, 30}};
  EXPECT_NEAR(cpkv::model::allreduce_call_us(c, 500, 2), 10, 1e-9);   // below the curve: its first point
  EXPECT_NEAR(cpkv::model::allreduce_call_us(c, 3000, 2), 20, 1e-9);  // halfway between the points
  EXPECT_NEAR(cpkv::model::allreduce_call_us(c, 5000, 2), 30, 1e-9);
  EXPECT_NEAR(cpkv::model::allreduce_call_us(c, 7000, 2), 32, 1e-9);  // past it: 2000 more bytes at 1000 B/us
  EXPECT_NEAR(cpkv::model::allreduce_call_us(c, 7000, 4), 33, 1e-9);  // cp 4: 2(cp-1)/cp = 1.5
}

// layer_time_us term by term (PROTOCOL.md section 7's steps as the built-in exchange runs them,
// gpu/fused/fused_exchange.cpp: fused_compose_layer), by hand:
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

cpkv::model::BatchCounts hand_counts() {
  cpkv::model::BatchCounts c;
  c.requests = 1;
  c.slot_count = 14;
  c.current_pages_total = 6;
  c.prefix_pages_by_owner = {3, 5};
  c.current_pages_by_writer = {2, 4};
  return c;
}

cpkv::model::CostParameters hand_ceilings() {
  cpkv::model::CostParameters ceilings;
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
  cpkv::model::BatchCounts c = hand_counts();
  const cpkv::model::CostParameters ceilings = hand_ceilings();
  const auto time_us = [&](cpkv::model::Variant v) {
    return cpkv::model::layer_time_us(s, c, v, cpkv::model::layer_bytes_from_counts(s, c, v, 0, 0), ceilings, 656, 0);
  };
  using cpkv::model::Variant;
  // symm_dense: launch 13 + barrier 3 + the longer of 9 peer pages (5904 B / 1000) and 3 own prefix
  // pages (1968 B / 500): pulls and own-memory copies run at once on the launch's warps.
  EXPECT_NEAR(time_us(Variant::symm_dense), 13 + 3 + std::max(5.904, 3.936), 1e-9);
  // staging_direct: the own current pages are read from own staging after the barrier: 5 local pages
  // (6.56 us), now longer than the pulls.
  EXPECT_NEAR(time_us(Variant::staging_direct), 13 + 3 + std::max(5.904, 6.56), 1e-9);
  // staging_publish: the publish (2 pages, 1312 B / 500) is serial before the signal, with its own fixed part.
  EXPECT_NEAR(time_us(Variant::staging_publish), 13 + (13 + 2.624) + 3 + std::max(5.904, 3.936), 1e-9);
  // fused_ar: the zeroing of the batch's 14 dense slots (one launch 11 + 14 x 656 B / 500), the
  // compose launch (13 + own prefix 3.936), one all-reduce (7 + 14 x 656 B x 2(cp-1)/cp / 1000).
  EXPECT_NEAR(time_us(Variant::fused_ar), (11 + 18.368) + (13 + 3.936) + (7 + 9.184), 1e-9);
  // v2: compose launch 13 with the pack serial before the rest (13 + 2.624), the longer of prefix from
  // the peer (5 pages, 3.28) and own (3.936); the compact all-reduce (7 + 6 x 656 B / 1000); the unpack
  // launch (13 + 6 pages 3936 B / 500).
  EXPECT_NEAR(time_us(Variant::v2), 13 + (13 + 2.624) + std::max(3.28, 3.936) + (7 + 3.936) + (13 + 7.872), 1e-9);
  // legacy_span_ar, two requests' spans: 8 prefix pages, none current; none prefix, 6 current. The
  // zeroing and the compose launch as fused_ar's, then one call per non-empty span (an empty one
  // enqueues nothing): (7 + 8 x 656 B / 1000) + (7 + 6 x 656 B / 1000).
  c.requests = 2;
  c.span_pages = {8, 0, 0, 6};
  EXPECT_NEAR(time_us(Variant::legacy_span_ar), (11 + 18.368) + (13 + 3.936) + (7 + 5.248) + (7 + 3.936), 1e-9);
  // allgather_zigzag (section 12), the largest rank computing 4 tokens: the compose launch 13 with
  // the longer of the prefix from the peer (5 pages, 3.28) and own (3 pages, 3.936); one all-gather
  // of 2 x 4 rows = 5248 B, padding included, timed as an all-reduce of half of it (7 + 2624 B x
  // 2(cp-1)/cp / 1000: a ring all-gather moves (cp-1)/cp of 5248 B, the same); the re-ordering
  // launch (13 + 6 current pages 3936 B / 500).
  c.max_rank_tokens[static_cast<std::size_t>(cpkv::model::TokenSplit::zigzag)] = 4;
  EXPECT_NEAR(time_us(Variant::allgather_zigzag), 13 + std::max(3.28, 3.936) + (7 + 2.624) + (13 + 7.872), 1e-9);
  // Padding is counted: the largest rank's 5 tokens make every rank send 5 rows (6560 B gathered).
  c.max_rank_tokens[static_cast<std::size_t>(cpkv::model::TokenSplit::zigzag)] = 5;
  EXPECT_NEAR(time_us(Variant::allgather_zigzag), 13 + std::max(3.28, 3.936) + (7 + 3.28) + (13 + 7.872), 1e-9);
}

// The all-reduce variants zero the slots of the layer's dense half that the sum all-reduce reads
// (PROTOCOL.md section 7: "zero the span"): the batch's slots, of every kind active on the layer, in
// one launch (gpu/fused/fused_exchange.cpp: zero_dense_half; the simulator's run_zero_dense alike).
// kv_fp8 (656 B a page, every layer) + indexer_k (132 B, full layers only), counts and ceilings as
// above: on a full (F) layer 14 slots x 788 B, on a shared (S) layer 14 x 656 B (indexer_k is not
// there, so it is not zeroed), each behind one launch of 11 us; the variants that do not zero
// (every other row of section 7's table) price no zero step at all.
TEST(CostModel, DenseZeroIsTheBatchSlotsOfTheKindsActiveOnTheLayer) {
  const cpkv::model::Setting s = hand_setting({*cpkv::model::find_buffer_kind("kv_fp8"), *cpkv::model::find_buffer_kind("indexer_k")}, "FS");
  const cpkv::model::BatchCounts c = hand_counts();
  const cpkv::model::CostParameters ceilings = hand_ceilings();
  using cpkv::model::Variant;
  const std::vector<Variant> zeroing = {Variant::legacy_span_ar, Variant::fused_ar, Variant::v2_fallback};
  for (const cpkv::model::VariantInfo& row : cpkv::model::kVariantTable) {
    const bool zeroes = std::find(zeroing.begin(), zeroing.end(), row.variant) != zeroing.end();
    for (const auto& [layer, page_bytes] : {std::pair<std::int32_t, std::uint64_t>{0, 788}, {1, 656}}) {
      const cpkv::model::LayerBytes bytes = cpkv::model::layer_bytes_from_counts(s, c, row.variant, 0, layer);
      const double zero_us = cpkv::model::layer_copy_components(s, c, row.variant, bytes, ceilings, page_bytes).zero_us;
      const double expected_us = zeroes ? 11 + 14.0 * static_cast<double>(page_bytes) / 500 : 0.0;
      EXPECT_NEAR(zero_us, expected_us, 1e-9) << cpkv::model::to_string(row.variant) << " on layer " << layer;
    }
  }
  // The whole S layer of fused_ar: the zero of kv_fp8 alone, then the compose launch and the
  // all-reduce as on a layer of kv_fp8 only.
  const Variant v = Variant::fused_ar;
  const double us = cpkv::model::layer_time_us(s, c, v, cpkv::model::layer_bytes_from_counts(s, c, v, 0, 1), ceilings, 656, 1);
  EXPECT_NEAR(us, (11 + 18.368) + (13 + 3.936) + (7 + 9.184), 1e-9);
}

// A batch is zeroed over its own slots, not over the largest batch's: the exchange zeroes
// slot_count pages per kind (zero_dense_half), and nothing reads a slot past the batch's. One
// CostModel (as the replay and the bench build it once per trace) prices a batch of 10 slots and
// then one of 3 slots, cp 2, page size 1, kv_fp8 + indexer_k on layers "FS", nominal ceilings but
// local 0.5 B/ns (500 B/us) and a launch of 11 us: each batch's zero over the two layers is
// (11 + slots x 788 / 500) + (11 + slots x 656 / 500) for the three zeroing variants, 0 for the rest
// (section 7's table). Against the old model this fails on the S layer's kinds only: its
// CostModel without dense_slots already took each batch's slots; the largest batch's were the
// bench's (gpu/bench_report.cpp passed them), which no CPU test reaches.
TEST(CostModel, EachBatchIsZeroedOverItsOwnSlots) {
  cpkv::model::Setting s = hand_setting({*cpkv::model::find_buffer_kind("kv_fp8"), *cpkv::model::find_buffer_kind("indexer_k")}, "FS");
  cpkv::model::CostParameters ceilings;
  ceilings.local_gbps = 0.5;
  ceilings.launch_us = 11.0;
  const cpkv::model::CostModel model(s, ceilings);
  Batch big;  // 4 prefix pages + 6 current = 10 slots
  big.requests.push_back(Request{4, 6, {0, 1, 2, 3}});
  Batch small;  // 1 prefix page + 2 current = 3 slots
  small.requests.push_back(Request{1, 2, {5}});
  cpkv::model::BatchCosts costs;
  using cpkv::model::Variant;
  for (const auto& [batch, slots] : {std::pair<const Batch*, double>{&big, 10}, {&small, 3}, {&big, 10}}) {
    model.evaluate(*batch, costs);
    ASSERT_FALSE(costs.verdict.overflow);
    ASSERT_EQ(costs.counts.slot_count, static_cast<std::int64_t>(slots));
    const double expected_us = (11 + slots * 788 / 500) + (11 + slots * 656 / 500);
    for (const cpkv::model::VariantInfo& row : cpkv::model::kVariantTable) {
      const bool zeroes = row.variant == Variant::legacy_span_ar || row.variant == Variant::fused_ar || row.variant == Variant::v2_fallback;
      EXPECT_NEAR(costs.components[static_cast<std::size_t>(row.variant)].zero_us, zeroes ? expected_us : 0.0, 1e-9)
          << cpkv::model::to_string(row.variant) << ", " << slots << " slots";
    }
  }
}

// The same through `cpkv replay --backend model --per-batch` on the bundled tiny trace (cp 2, page
// size 4, kv_fp8 + indexer_k, layers "FS"; batches of 7, 2 and 8 slots), local
// 1 GB/s (1000 B/us), a launch of 11 us: a zeroing variant's zero_ms is (11 + slots x 4 x 788 / 1000)
// on the F layer plus (11 + slots x 4 x 656 / 1000) on the S layer, each batch over its own slots
// (the overflowing batch 2 too: the all-reduce variants have no staging and run it). The old
// command failed this on the S layer's kinds; its slots were already each batch's without --dense-slots.
TEST(ModelReplayCli, PerBatchZeroIsEachBatchsSlotsOfTheActiveKinds) {
  const std::string path = (temp_dir() / "tiny_zero.jsonl").string();
  const CliRun run = run_cpkv(fmt::format("replay traces/samples/tiny.jsonl --backend model --local-gbps 1 --launch-us 11 --per-batch '{}'", path));
  ASSERT_EQ(run.status, 0) << run.err;
  std::ifstream in(path);
  std::string line;
  const double slots_of[] = {7, 2, 8};
  std::size_t b = 0;
  for (; std::getline(in, line); ++b) {
    ASSERT_LT(b, 3u) << line;
    const nlohmann::json record = nlohmann::json::parse(line);
    ASSERT_EQ(record["slots"].get<double>(), slots_of[b]);
    const double expected_us = (11 + slots_of[b] * 4 * 788 / 1000) + (11 + slots_of[b] * 4 * 656 / 1000);
    for (const char* name : {"legacy_span_ar", "fused_ar", "v2_fallback"}) {
      EXPECT_NEAR(record["variants"][name]["zero_ms"].get<double>(), expected_us / 1000, 1e-12) << name << " batch " << b;
    }
  }
  EXPECT_EQ(b, 3u);
}

// --dense-slots priced the zero over a dense buffer sized for the trace's largest batch; the
// exchange zeroes each batch's own slots, so the option had nothing true left to say and is gone:
// asking for it is refused in one line naming it, exit 2, nothing on stdout.
TEST(ModelReplayCli, DenseSlotsIsNoLongerAnOption) {
  const CliRun run = run_cpkv("replay traces/samples/tiny.jsonl --backend model --dense-slots 20");
  EXPECT_EQ(run.status, 2);
  EXPECT_TRUE(one_line(run.err)) << run.err;
  EXPECT_NE(run.err.find("--dense-slots"), std::string::npos) << run.err;
  EXPECT_TRUE(run.out.empty()) << run.out;
}

// The chart needs the configured interpreter with matplotlib; without it the command says so in
// one line and exits 2.
TEST(ModelReplayCli, ChartIsDrawnOrRefusedInOneLine) {
  const std::string png = (temp_dir() / "tiny.png").string();
  const bool have_matplotlib = std::system(fmt::format("'{}' -c 'import matplotlib' > /dev/null 2>&1", CPKV_CHART_PYTHON).c_str()) == 0;
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

// Where the time goes (issue 26 item 2): CostModel's per-part times sum to the modelled time it
// gave before the parts existed, for every variant and batch of every bundled trace (the Mooncake
// import included), under the nominal ceilings and under ceilings that flip which post-signal
// stream is the longer; each part is >= 0, and the parts a variant's table row says it has are
// there: the dense zero for the variants that zero (PROTOCOL.md section 7), the pre-signal fill for
// those with pre-signal pages (publish, pack), none of either otherwise, the barrier where the row
// has one, and all-reduce time only where the row calls an all-reduce.
TEST(ModelReplayCosts, ComponentsSumToTheModelledTimeOnEveryBundledTrace) {
  cpkv::model::CostParameters slow_peer;
  slow_peer.peer_gbps = 3;
  slow_peer.local_gbps = 5000;
  cpkv::model::CostParameters slow_local;
  slow_local.peer_gbps = 5000;
  slow_local.local_gbps = 3;
  std::int64_t batches = 0;
  for (const char* name : {"tiny.jsonl", "seeds_batch.jsonl", "mooncake_slice.jsonl"}) {
    for (const cpkv::model::CostParameters& ceilings : {cpkv::model::CostParameters{}, slow_peer, slow_local}) {
      cpkv::traces::TraceReader reader(std::string(CPKV_SOURCE_DIR) + "/traces/samples/" + name);
      const cpkv::model::CostModel model(reader.header().setting, ceilings);
      cpkv::model::BatchCosts costs;
      while (const std::optional<Batch> batch = reader.next()) {
        ++batches;
        model.evaluate(*batch, costs);
        for (std::size_t v = 0; v < cpkv::model::kVariantCount; ++v) {
          const cpkv::model::Variant variant = cpkv::model::kAllVariants[v];
          const cpkv::model::TimeComponents& p = costs.components[v];
          const std::string where = fmt::format("{} batch {} {} peer {} GB/s", name, reader.batch_index(), cpkv::model::to_string(variant), ceilings.peer_gbps);
          EXPECT_NEAR(p.total_us(), costs.modelled_us[v], 1e-9 * std::max(1.0, costs.modelled_us[v])) << where;
          for (double part : {p.zero_us, p.fill_us, p.launch_us, p.barrier_us, p.peer_us, p.local_us, p.allreduce_us, p.allgather_us}) EXPECT_GE(part, 0.0) << where;
          if (costs.verdict.overflow) {
            EXPECT_EQ(p.total_us(), 0.0) << where << ": a rejected batch moves nothing";
            continue;
          }
          const cpkv::model::VariantInfo& row = cpkv::model::info(variant);
          EXPECT_EQ(p.zero_us > 0, cpkv::model::zeroes_dense(variant)) << where;
          EXPECT_EQ(p.barrier_us > 0, row.counts.barriers > 0) << where;
          EXPECT_EQ(p.allreduce_us > 0, row.allreduce != cpkv::model::AllReduceFamily::none && reader.header().setting.cp > 1 && batch->requests.size() > 0) << where;
          EXPECT_EQ(p.allgather_us > 0, row.counts.allgathers > 0 && reader.header().setting.cp > 1) << where;
          EXPECT_GT(p.launch_us, 0.0) << where;
          EXPECT_GT(p.peer_us + p.local_us, 0.0) << where;
        }
      }
    }
  }
  EXPECT_GT(batches, 0);
}

}  // namespace

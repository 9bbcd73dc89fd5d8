// CPU benchmarks (Google Benchmark): per-batch plan construction for the seeds' traced batch shape
// (the seeds: ragged plan 36 us per layer after caching, slot spans 0.5 us), and the simulator's
// throughput, the trace reader's and the model replay's cost model's on an imported Mooncake trace.
// Run: build/bench/cpkv.bench.cpu [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <optional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "cpkv/model/batch.hpp"
#include "cpkv/model/costs.hpp"
#include "cpkv/model/plan.hpp"
#include "cpkv/model/staging.hpp"
#include "cpkv/sim/runner.hpp"
#include "cpkv/traces/mooncake.hpp"
#include "cpkv/traces/trace.hpp"

namespace {

struct Seeds {
  cpkv::model::Setting setting;
  cpkv::model::Batch batch;
};

const Seeds& seeds() {
  static const Seeds s = [] {
    cpkv::traces::TraceReader reader(std::string(CPKV_SOURCE_DIR) + "/traces/samples/seeds_batch.jsonl");
    Seeds out{reader.header().setting, *reader.next()};
    return out;
  }();
  return s;
}

// glibc returns the free top of the heap to the kernel once it exceeds M_TRIM_THRESHOLD (128 KiB
// by default, until the process frees an mmapped chunk). This benchmark process has an otherwise
// empty heap, so every batch's ~0.2 MB of plans sits at the heap top: freeing it shrinks the heap
// (brk) and the next build page-faults it back in, which costs more than building the plans. A
// long-running rank process keeps its heap; SteadyHeap raises the threshold for the duration of one
// benchmark (set back to 128 KiB after) to measure that. Every per-batch benchmark uses it, so the
// parts add up to the whole; BM_PerBatchPlansOneRankTrimmingHeap keeps the default to show the cost.
class SteadyHeap {
 public:
  SteadyHeap() {
#if defined(__GLIBC__)
    mallopt(M_TRIM_THRESHOLD, 64 << 20);
#endif
  }
  ~SteadyHeap() {
#if defined(__GLIBC__)
    mallopt(M_TRIM_THRESHOLD, 128 << 10);
#endif
  }
  SteadyHeap(const SteadyHeap&) = delete;
  SteadyHeap& operator=(const SteadyHeap&) = delete;
};

void BM_LayoutBatch(benchmark::State& state) {
  const SteadyHeap steady;
  const Seeds& s = seeds();
  for (auto _ : state) benchmark::DoNotOptimize(cpkv::model::layout_batch(s.setting, s.batch));
}
BENCHMARK(BM_LayoutBatch)->Unit(benchmark::kMicrosecond);

void BM_StagingDirectPlan(benchmark::State& state) {
  const SteadyHeap steady;
  const Seeds& s = seeds();
  const auto layout = cpkv::model::layout_batch(s.setting, s.batch);
  for (auto _ : state) benchmark::DoNotOptimize(cpkv::model::staging_direct_plan(layout));
}
BENCHMARK(BM_StagingDirectPlan)->Unit(benchmark::kMicrosecond);

// Everything one rank builds once per batch: layout, verdict, compose plan, staging-remapped page
// inverse and ragged index plan. A rank keeps them for every layer of the batch and replaces them
// when the next batch comes, so the benchmark does the same: each iteration builds a fresh set and
// then drops the previous batch's set (its destruction is timed too).
struct PerBatchPlans {
  cpkv::model::BatchLayout layout;
  cpkv::model::Verdict verdict;
  cpkv::model::VariantPlan plan;
  cpkv::model::PageInverse inverse;
  cpkv::model::RaggedIndexPlan ragged;
};

PerBatchPlans build_per_batch_plans(const Seeds& s, const cpkv::model::StagingCapacity& capacity, std::int32_t rank) {
  PerBatchPlans out;
  out.layout = cpkv::model::layout_batch(s.setting, s.batch);
  out.verdict = cpkv::model::overflow_verdict(out.layout.current_pages_total, capacity.staging_slots);
  out.plan = cpkv::model::variant_plan(out.layout, cpkv::model::Variant::staging_direct, rank);
  out.inverse = cpkv::model::page_inverse(out.layout, s.batch, rank, cpkv::model::InverseTarget::staging);
  out.ragged = cpkv::model::ragged_index_plan(out.layout, s.batch, rank);
  return out;
}

void per_batch_plans_loop(benchmark::State& state) {
  const Seeds& s = seeds();
  const auto capacity = cpkv::model::staging_capacity(s.setting);
  PerBatchPlans cached = build_per_batch_plans(s, capacity, 3);
  for (auto _ : state) {
    PerBatchPlans fresh = build_per_batch_plans(s, capacity, 3);
    benchmark::DoNotOptimize(fresh);
    cached = std::move(fresh);  // the previous batch's plans are freed here
    benchmark::ClobberMemory();
  }
}

void BM_PerBatchPlansOneRank(benchmark::State& state) {
  const SteadyHeap steady;
  per_batch_plans_loop(state);
}
BENCHMARK(BM_PerBatchPlansOneRank)->Unit(benchmark::kMicrosecond);

void BM_PerBatchPlansOneRankTrimmingHeap(benchmark::State& state) { per_batch_plans_loop(state); }
BENCHMARK(BM_PerBatchPlansOneRankTrimmingHeap)->Unit(benchmark::kMicrosecond);

void BM_PageInverseStaging(benchmark::State& state) {
  const SteadyHeap steady;
  const Seeds& s = seeds();
  const auto layout = cpkv::model::layout_batch(s.setting, s.batch);
  for (auto _ : state) benchmark::DoNotOptimize(cpkv::model::page_inverse(layout, s.batch, 3, cpkv::model::InverseTarget::staging));
}
BENCHMARK(BM_PageInverseStaging)->Unit(benchmark::kMicrosecond);

void BM_VariantPlanStagingDirect(benchmark::State& state) {
  const SteadyHeap steady;
  const Seeds& s = seeds();
  const auto layout = cpkv::model::layout_batch(s.setting, s.batch);
  for (auto _ : state) benchmark::DoNotOptimize(cpkv::model::variant_plan(layout, cpkv::model::Variant::staging_direct, 3));
}
BENCHMARK(BM_VariantPlanStagingDirect)->Unit(benchmark::kMicrosecond);

void BM_RaggedIndexPlan(benchmark::State& state) {
  const SteadyHeap steady;
  const Seeds& s = seeds();
  const auto layout = cpkv::model::layout_batch(s.setting, s.batch);
  for (auto _ : state) benchmark::DoNotOptimize(cpkv::model::ragged_index_plan(layout, s.batch, 3));
}
BENCHMARK(BM_RaggedIndexPlan)->Unit(benchmark::kMicrosecond);

// The scheduled simulator on the tiny trace: steps per second of the whole group.
void BM_SimScheduledTiny(benchmark::State& state) {
  const auto source = cpkv::harness::BatchSource::from_trace(std::string(CPKV_SOURCE_DIR) + "/traces/samples/tiny.jsonl");
  cpkv::harness::RunOptions options;
  options.layers = 2;
  std::uint64_t steps = 0;
  for (auto _ : state) {
    const auto report = cpkv::sim::run_scheduled(source, options, cpkv::sim::Schedule{}, cpkv::sim::RunLimits{});
    steps += report.steps;
  }
  state.counters["steps_per_s"] = benchmark::Counter(static_cast<double>(steps), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_SimScheduledTiny)->Unit(benchmark::kMillisecond);

// The trace reader on the trace of docs/benchmarks/model-replay-throughput.md: the
// bundled Mooncake log imported as `cpkv import mooncake LOG --max-total-extend-tokens 5120
// --max-batches 7000` would (the importer's defaults otherwise), made once in memory. Each
// iteration reads and checks the whole trace (header, 7,000 batch lines) from a string stream into
// one reused batch, as `cpkv replay --backend model` does; batches_per_s is the figure.
// The bundled Mooncake log imported as `cpkv import mooncake` does with its defaults (cp 8, P 64,
// kv_fp8 + indexer_k, 61 F layers, pool 65536 pages, zigzag, 16 requests), with the extend-token
// cap and batch count each benchmark names; every imported batch goes to `each(setting, batch)`.
template <typename Each>
cpkv::model::Setting import_bundled_mooncake(std::int64_t max_total_extend_tokens, std::optional<std::int64_t> max_batches, Each each) {
  namespace mc = cpkv::traces::mooncake;
  mc::ImportOptions options;
  cpkv::model::Setting& s = options.setting;
  s.cp = 8;
  s.page_size = 64;
  s.kinds = {*cpkv::model::find_buffer_kind("kv_fp8"), *cpkv::model::find_buffer_kind("indexer_k")};
  s.layer_pattern = std::string(61, 'F');
  s.pool_pages = 65536;
  s.split = cpkv::model::SplitPolicy::zigzag;
  s.caps.max_total_extend_tokens = max_total_extend_tokens;
  s.caps.max_batch_requests = 16;
  if (max_batches) options.max_batches = *max_batches;
  mc::MooncakeReader log(std::string(CPKV_SOURCE_DIR) + "/traces/data/mooncake/synthetic_trace.jsonl", options.block_tokens,
                         /*skip_bad=*/false);
  mc::import_mooncake(log, options, [&](const cpkv::model::Batch& batch) { each(s, batch); });
  return s;
}

const std::string& mooncake_trace() {
  static const std::string text = [] {
    std::ostringstream out;
    cpkv::traces::TraceHeader header;
    header.source = {{"kind", "bench"}};
    std::optional<cpkv::traces::TraceWriter> writer;  // made at the first batch, when the setting is known
    import_bundled_mooncake(5120, 7000, [&](const cpkv::model::Setting& setting, const cpkv::model::Batch& batch) {
      if (!writer) {
        header.setting = setting;
        writer.emplace(out, header);
      }
      writer->write(batch);
    });
    return out.str();
  }();
  return text;
}

void BM_ReadMooncakeTrace(benchmark::State& state) {
  const std::string& text = mooncake_trace();
  std::int64_t batches = 0;
  cpkv::model::Batch batch;
  for (auto _ : state) {
    cpkv::traces::TraceReader reader(std::make_unique<std::istringstream>(text), "mooncake-7000.jsonl");
    while (reader.next(batch)) ++batches;
    benchmark::DoNotOptimize(batch);
  }
  state.counters["batches_per_s"] = benchmark::Counter(static_cast<double>(batches), benchmark::Counter::kIsRate);
  state.counters["MB_per_s"] = benchmark::Counter(static_cast<double>(text.size()) * state.iterations() / 1e6, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ReadMooncakeTrace)->Unit(benchmark::kMillisecond);

// The model replay's own work (`cpkv replay --backend model`'s "model speed" line times exactly
// this: model::CostModel::evaluate per batch, every variant and rank) on the trace `cpkv import
// mooncake traces/data/mooncake/synthetic_trace.jsonl` writes with its default options
// (cli/import_command.cpp ImportCommandOptions: cp 8, P 64, kv_fp8 + indexer_k, 61 F layers, pool
// 65536 pages, zigzag, caps 16384 extend tokens and 16 requests), held in memory. Target (issue
// 37): >= 100k batches/s on one core; batches_per_s is the figure.
const std::vector<cpkv::model::Batch>& default_mooncake_batches(cpkv::model::Setting& setting_out) {
  static cpkv::model::Setting setting;
  static const std::vector<cpkv::model::Batch> batches = [] {
    std::vector<cpkv::model::Batch> out;
    setting = import_bundled_mooncake(16384, std::nullopt, [&](const cpkv::model::Setting&, const cpkv::model::Batch& batch) { out.push_back(batch); });
    return out;
  }();
  setting_out = setting;
  return batches;
}

void BM_ModelReplayDefaultMooncake(benchmark::State& state) {
  cpkv::model::Setting setting;
  const std::vector<cpkv::model::Batch>& batches = default_mooncake_batches(setting);
  const cpkv::model::CostModel model(setting, cpkv::model::CostParameters{});
  cpkv::model::BatchCosts costs;
  std::int64_t evaluated = 0;
  for (auto _ : state) {
    for (const cpkv::model::Batch& batch : batches) {
      model.evaluate(batch, costs);
      benchmark::DoNotOptimize(costs.modelled_us);
    }
    evaluated += static_cast<std::int64_t>(batches.size());
  }
  state.counters["batches"] = static_cast<double>(batches.size());
  state.counters["batches_per_s"] = benchmark::Counter(static_cast<double>(evaluated), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ModelReplayDefaultMooncake)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();

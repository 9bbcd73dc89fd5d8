// CPU benchmarks (Google Benchmark): per-batch plan construction for the seeds' traced batch shape
// (the seeds: ragged plan 36 us per layer after caching, slot spans 0.5 us), and the simulator's
// throughput. Run: build/bench/cpkv.bench.cpu [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include "cpkv/model/batch.hpp"
#include "cpkv/model/plan.hpp"
#include "cpkv/model/staging.hpp"
#include "cpkv/sim/runner.hpp"
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

void BM_LayoutBatch(benchmark::State& state) {
  const Seeds& s = seeds();
  for (auto _ : state) benchmark::DoNotOptimize(cpkv::model::layout_batch(s.setting, s.batch));
}
BENCHMARK(BM_LayoutBatch)->Unit(benchmark::kMicrosecond);

void BM_StagingDirectPlan(benchmark::State& state) {
  const Seeds& s = seeds();
  const auto layout = cpkv::model::layout_batch(s.setting, s.batch);
  for (auto _ : state) benchmark::DoNotOptimize(cpkv::model::staging_direct_plan(layout));
}
BENCHMARK(BM_StagingDirectPlan)->Unit(benchmark::kMicrosecond);

// Everything one rank builds once per batch: layout, verdict, compose plan, staging-remapped page
// inverse and ragged index plan.
void BM_PerBatchPlansOneRank(benchmark::State& state) {
  const Seeds& s = seeds();
  const auto capacity = cpkv::model::staging_capacity(s.setting);
  for (auto _ : state) {
    const auto layout = cpkv::model::layout_batch(s.setting, s.batch);
    benchmark::DoNotOptimize(cpkv::model::overflow_verdict(layout.current_pages_total, capacity.staging_slots));
    benchmark::DoNotOptimize(cpkv::model::variant_plan(layout, cpkv::model::Variant::staging_direct, 3));
    benchmark::DoNotOptimize(cpkv::model::page_inverse(layout, s.batch, 3, cpkv::model::InverseTarget::staging));
    benchmark::DoNotOptimize(cpkv::model::ragged_index_plan(layout, s.batch, 3));
  }
}
BENCHMARK(BM_PerBatchPlansOneRank)->Unit(benchmark::kMicrosecond);

void BM_PageInverseStaging(benchmark::State& state) {
  const Seeds& s = seeds();
  const auto layout = cpkv::model::layout_batch(s.setting, s.batch);
  for (auto _ : state) benchmark::DoNotOptimize(cpkv::model::page_inverse(layout, s.batch, 3, cpkv::model::InverseTarget::staging));
}
BENCHMARK(BM_PageInverseStaging)->Unit(benchmark::kMicrosecond);

void BM_VariantPlanStagingDirect(benchmark::State& state) {
  const Seeds& s = seeds();
  const auto layout = cpkv::model::layout_batch(s.setting, s.batch);
  for (auto _ : state) benchmark::DoNotOptimize(cpkv::model::variant_plan(layout, cpkv::model::Variant::staging_direct, 3));
}
BENCHMARK(BM_VariantPlanStagingDirect)->Unit(benchmark::kMicrosecond);

void BM_RaggedIndexPlan(benchmark::State& state) {
  const Seeds& s = seeds();
  const auto layout = cpkv::model::layout_batch(s.setting, s.batch);
  for (auto _ : state) benchmark::DoNotOptimize(cpkv::model::ragged_index_plan(layout, s.batch, 3));
}
BENCHMARK(BM_RaggedIndexPlan)->Unit(benchmark::kMicrosecond);

// The scheduled simulator on the tiny trace: steps per second of the whole group.
void BM_SimScheduledTiny(benchmark::State& state) {
  const auto source = cpkv::sim::BatchSource::from_trace(std::string(CPKV_SOURCE_DIR) + "/traces/samples/tiny.jsonl");
  cpkv::sim::SimOptions options;
  options.layers = 2;
  std::uint64_t steps = 0;
  for (auto _ : state) {
    const auto report = cpkv::sim::run_scheduled(source, options, cpkv::sim::Schedule{}, cpkv::sim::RunLimits{});
    steps += report.steps;
  }
  state.counters["steps_per_s"] = benchmark::Counter(static_cast<double>(steps), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_SimScheduledTiny)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();

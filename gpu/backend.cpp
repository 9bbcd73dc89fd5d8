// The GPU backend's driver: the bootstrap segment, one process per rank through the harness's
// launcher, each rank's life, and the report every backend fills.
#include <algorithm>
#include <cstdlib>
#include <new>
#include <optional>
#include <string>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "cpkv/harness/attention_limit.hpp"
#include "cpkv/harness/shared_region.hpp"
#include "fused/fused_exchange.hpp"
#include "plugin_host.hpp"
#include "rank.hpp"
#include "timeline.hpp"

namespace cpkv::cuda {

namespace {

// What the ranks left in the bootstrap segment, as the report every backend fills.
void fill_report(const Bootstrap& boot, std::int32_t cp, harness::RunReport& report) {
  for (std::int32_t r = 0; r < cp; ++r) {
    harness::Totals rank = boot.totals[r];
    rank.steps = static_cast<std::uint64_t>(rank.layers);  // a GPU rank's step is one layer (its kernels are not counted one by one)
    harness::add_rank(report, rank);
  }
  report.violation_count = boot.violation_count.load();
  for (std::int32_t i = 0; i <= harness::kInvariants; ++i) report.violations_by_invariant[i] = boot.violations_by_invariant[i].load();
  for (std::int64_t i = 0; i < std::min<std::int64_t>(report.violation_count, harness::kViolationsMax); ++i) report.violations.push_back(boot.violations[i]);
  for (std::int32_t r = 1; r < cp && report.failure.empty(); ++r) {
    if (boot.path[r].load() != boot.path[0].load()) {
      harness::Violation v;
      v.invariant = 7;
      v.rank = r;
      v.set_detail(fmt::format("rank {} took path {}, rank 0 path {}", r, boot.path[r].load(), boot.path[0].load()));
      report.violations.push_back(v);
      ++report.violation_count;
      ++report.violations_by_invariant[7];
    }
  }
}

// Before anything is allocated: what every GPU needs beside what it has free (printed), refused in
// one line when it does not fit, all read from one pool plan (sparse or dense, the layout every rank
// carves, each rank's reservation and backed runs); then, for a sparse pool, the socket pairs its
// descriptors cross (made here, before the ranks fork). The free figures come from a probe child
// before any rank starts, so this run's own ranks do not lower them.
PoolShare plan_pools(const harness::BatchSource& source, const harness::RunOptions& options, const CudaOptions& cuda, const harness::SourceShape& shape,
                     const DeviceProbe& devices) {
  PoolShare share;
  const PoolMemory memory = cuda.pool_memory;
  const std::int32_t cp = source.setting.cp;
  const std::int32_t used = std::min(devices.count, cp);
  std::uint64_t granularity = 1;
  for (std::int32_t d = 0; d < used; ++d) {
    if (memory == PoolMemory::sparse && devices.vmm[d] == 0) {
      throw DeviceRefusal(fmt::format("cuda: GPU {} does not support virtual memory management with POSIX file descriptors, which a sparse pool needs "
                                      "(--pool-memory dense allocates every slab whole)", d));
    }
    granularity = std::max<std::uint64_t>(granularity, devices.granularity[d]);
  }
  const NeedInputs in{memory, granularity, cuda.measure_ceilings, kBenchBufferBytes};
  PoolVerdict verdict = pool_verdict(source.setting, options.layers, shape, in, std::vector<std::uint64_t>(devices.free, devices.free + devices.count));
  if (cuda.need_line_printed == nullptr || verdict.need_line != *cuda.need_line_printed) {
    fmt::print("{}\n", verdict.need_line);
    std::fflush(stdout);
    if (cuda.need_line_printed != nullptr) *cuda.need_line_printed = verdict.need_line;  // once per size over the runs that share it
  }
  if (!verdict.refusal.empty()) throw DeviceRefusal(verdict.refusal);
  share.plan = std::move(verdict.plan);
  if (memory == PoolMemory::dense) return share;
  share.channels = std::make_unique<FdChannels>(cp);
  return share;
}

// One rank process's life: set up (rank_memory.cpp), the bench's ceilings where asked, every batch
// through the plugin host (plugin_host.cpp: the backend's one rank loop, whatever the exchange,
// through the drain check after the plugin's teardown), tear-down.
int cuda_rank(const RankContext& ctx) {
  Rank r{ctx};
  set_up_rank(r);
  const RankTimelineHandle timeline = open_timeline(r);
  if (ctx.cuda.measure_ceilings) measure_ceilings(r, ctx.boot->bench_results[ctx.rank]);
  run_plugin_batches(r);
  leave_group(r);
  return harness::kRankExitOk;
}

harness::RunReport run_group(const harness::BatchSource& source, const harness::RunOptions& options, const CudaOptions& cuda, BenchResult* bench) {
  harness::RunReport report;
  report.variant = options.variant;
  report.mode = "cuda";
  const std::int32_t cp = source.setting.cp;
  if (!cuda.exchange) throw std::invalid_argument("cuda: no exchange table to run (make_cuda_backend fills in the default; run_bench needs one named)");
  if (cp > kRanksMax) throw std::invalid_argument(fmt::format("cp {} exceeds the cuda backend's cap of {} ranks (one node's GPUs)", cp, kRanksMax));
  const DeviceProbe devices = probe_devices();
  if (devices.error[0] != '\0') throw std::runtime_error(fmt::format("cuda: probing the devices: {}", devices.error));
  const int gpus = devices.count;
  if (gpus == 0) {
    report.failure = "no CUDA device";
    return report;
  }
  const harness::SourceShape shape = harness::measure(source);
  report.batches = shape.batches;
  PoolShare pools = plan_pools(source, options, cuda, shape, devices);
  harness::SharedRegion region = harness::SharedRegion::create(sizeof(Bootstrap));
  auto* boot = new (region.base()) Bootstrap();
  boot->wait_ms_max = cuda.wait_ms_max;
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);
  const std::unique_ptr<harness::TimelineParts> timeline = start_group_timeline(cuda, options.variant, cp);
  harness::LaunchOptions launch;
  launch.ranks = cp;
  launch.run_ms_max = cuda.run_ms_max;
  launch.stuck_ms_max = cuda.stuck_ms_max;
  launch.label = "cuda rank";
  if (cuda.on_progress) {
    launch.on_tick = [&] {
      std::int64_t done = boot->layers_done[0].load();
      for (std::int32_t r = 1; r < cp; ++r) done = std::min(done, boot->layers_done[r].load());
      cuda.on_progress(done);  // layers every rank has finished
    };
  }
  const harness::LaunchResult launched = harness::launch_ranks(launch, [&](std::int32_t r, harness::RankProgress& progress) {
    kernels::set_compose_blocks_per_sm(cuda.compose_blocks_per_sm);  // in the rank process, before its first launch
    return cuda_rank(RankContext{boot, source, options, cuda, shape, r, gpus, progress, &pools});
  });
  report.failure = with_plugin_calls(*boot, cp, cuda.exchange->name, launched.failure);
  report.deadlock = launched.deadlock;
  harness::check_unchanged(source);  // one line for the group (launch.cpp: ranks leave it to this check)
  fill_report(*boot, cp, report);
  finish_group_timeline(timeline.get(), report);  // the ranks' parts, also after a failure
  if (bench != nullptr) fold_bench(*boot, cp, shape.batches, *bench);
  return report;
}

class CudaBackend final : public harness::Backend {
 public:
  explicit CudaBackend(CudaOptions options) : options_(options) {}
  std::string name() const override { return "cuda"; }
  harness::RunReport run(const harness::BatchSource& source, const harness::RunOptions& options) override {
    // A plugin's own planted bugs (any bug of an exchange it declared, checked at load) are its to switch on.
    const bool plugin_holds = options_.exchange && options_.exchange->holds(std::string(harness::to_string(options.mutant)));
    if (!plugin_holds && !harness::held_by(options.mutant, harness::kGpuHolds | harness::kHarnessHolds)) {
      throw std::invalid_argument(fmt::format("the GPU backend does not hold planted bug '{}'", harness::to_string(options.mutant)));
    }
    return run_group(source, options, options_, nullptr);
  }

 private:
  CudaOptions options_;
};

}  // namespace

void apply_knobs(const harness::ReplayRequest& request, CudaOptions& options) {
  options.pool_memory = pool_memory_from(request.pool_memory.value_or("sparse").c_str());
  options.compose_blocks_per_sm = request.compose_blocks_per_sm.value_or(0);
}

std::unique_ptr<harness::Backend> make_cuda_backend(CudaOptions options) {
  if (options.need_line_printed == nullptr) options.need_line_printed = std::make_shared<std::string>();  // once per size over this backend's runs
  if (!options.exchange) {
    harness::register_builtin_exchange(harness::kBuiltinExchange, fused::builtin_exchange_table());
    options.exchange = harness::find_exchange(harness::kBuiltinExchange);
  }
  return std::make_unique<CudaBackend>(options);
}

BenchResult run_bench(const harness::BatchSource& source, const harness::RunOptions& options, const CudaOptions& cuda) {
  BenchResult result;
  result.report = run_group(source, options, cuda, &result);
  return result;
}

// --swarm on the GPU: a rotating slow rank whose spin before its exchange is drawn from the seed,
// 1 to 8 Mi cycles (about 0.5 to 4.5 ms on an H200).
std::int64_t slow_rank_cycles_of(std::uint64_t seed) {
  std::uint64_t z = seed + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return static_cast<std::int64_t>((z ^ (z >> 31)) % 8 + 1) << 20;
}

void register_backend(harness::Registry& registry) {
  harness::register_builtin_exchange(harness::kBuiltinExchange, fused::builtin_exchange_table());
  harness::BackendEntry cuda;
  cuda.name = "cuda";
  cuda.summary = "one process per GPU rank (rank r on GPU r % gpu_count), CUDA IPC and NCCL, every dense byte verified on the device; "
                 "every exchange through the plugin ABI: cpkv's own fused compose (--exchange builtin, the default) or a plugin's (--exchange PATH)";
  cuda.options = harness::kTakesWaitMsMax | harness::kTakesStuckMsMax | harness::kTakesIpcFault | harness::kTakesExchange | harness::kTakesSwarm |
                  harness::kTakesTimeline | harness::kTakesPoolMemory | harness::kTakesComposeBlocks;
  cuda.mutants = harness::kGpuHolds | harness::kHarnessHolds;
  cuda.ranks_max = kRanksMax;  // one node's GPUs (kernels::kCpMax): the bootstrap's per-rank arrays
  cuda.default_exchange = harness::kBuiltinExchange;
  cuda.replay = [](const harness::CheckedRequest& c, const harness::BatchSource& source, const harness::ScannedSource&,
                   const harness::ProgressFunction& progress) {
    // A trace this backend cannot check is refused before the machine is looked at: it would fail on
    // any (plugin_host.cpp: check_attention keeps the mid-run check as a backstop).
    harness::refuse_attention_over_limit(c, source);
    gpus_or_refuse();
    CudaOptions options;
    if (c.request.stuck_ms_max) options.stuck_ms_max = *c.request.stuck_ms_max;
    if (c.request.wait_ms_max) options.wait_ms_max = *c.request.wait_ms_max;
    options.on_progress = progress;
    options.exchange = c.exchange;  // never null here: check_request loads the default when none is named
    options.timeline = c.request.timeline.value_or("");
    apply_knobs(c.request, options);
    if (c.request.swarm) options.slow_rank_cycles = slow_rank_cycles_of(c.request.seed);
    return make_cuda_backend(options);
  };
  // The header's line of the exchange run (and a swarm's slow rank); a timeline counts CUDA events.
  cuda.check = [](harness::CheckedRequest& c) {
    c.timeline_clock = harness::TimelineClock::cuda_events;
    std::string& line = c.backend_line;
    if (c.exchange) {
      line = fmt::format("exchange: plugin '{}' ({}), ABI version {}{}", c.exchange->name,
                         c.exchange_by_default ? fmt::format("{}, the default", harness::kBuiltinExchange) : c.request.exchange.value_or(""),
                         CPKV_EXCHANGE_ABI_VERSION, c.exchange->parts != nullptr ? ", with the bench's parts" : "");
    }
    if (c.request.swarm) {
      line += fmt::format("{}slow rank: (batch + layer) % cp spins {} cycles before its exchange (drawn from seed {})", line.empty() ? "" : " | ",
                          slow_rank_cycles_of(c.request.seed), c.request.seed);
    }
  };
  cuda.bench = bench_report;
  registry.add(std::move(cuda));
}

}  // namespace cpkv::cuda

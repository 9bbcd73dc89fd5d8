// cpkv mutants --backend cuda: the GPU planted bugs (single_half, no_barrier, skip_zero,
// barrier_passes_early) on one rank per GPU and oversubscribed, and the verify kernel's self-test.
// Each bug must be reported with the rank, layer, slot and byte of the first wrong byte (or, for a
// barrier, a violation); the correct protocol must pass the same runs.
#include <chrono>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "backends.hpp"
#include "commands.hpp"
#include "cpkv/model/assert.hpp"
#include "cpkv/sim/mutant.hpp"
#include "cpkv/sim/runner.hpp"
#include "cuda_backend.hpp"

namespace cpkv::cli {

namespace {

// The plugin and the planted bugs that reach it: the ones it holds itself, then the harness's that
// corrupt an input it reads (the request's own check says which).
std::shared_ptr<const harness::ExchangePlugin> load_plugin(const std::string& path, std::chrono::milliseconds limit, std::vector<harness::Mutant>& mutants) {
  auto plugin = harness::find_exchange(path, limit);  // a refusal is a RequestError: cli/main.cpp says it in one line, exit 2
  for (const std::string& name : plugin->mutants) mutants.push_back(*harness::parse_mutant(name));
  for (harness::Mutant m : harness::kHarnessMutants) {
    if ((plugin->uses & harness::input_corrupted_by(m)) != 0) mutants.push_back(m);
  }
  if (!plugin->implements(model::Variant::staging_direct)) {
    throw harness::RequestError("exchange", fmt::format("{}: exchange plugin '{}' does not implement staging_direct, the planted-bug workload's variant", path, plugin->name));
  }
  return plugin;
}

struct Row {
  bool ok = false;
  std::string verdict;  // yes, NO, robust, ERROR
  std::string finding;
};

// One planted bug's run. A plugin's own bug (and the GPU's) must be caught. A harness bug corrupts
// an input the plugin reads; a plugin that does not depend on what it corrupts (one that zeroes its
// own tails) passes it, which is right: "robust", not a failure. A run that cannot be made is that
// row's ERROR, and the table goes on to its end.
Row run_row(harness::Backend& backend, const harness::BatchSource& source, const harness::RunOptions& options, bool harness_fault) {
  try {
    const harness::RunReport report = backend.run(source, options);
    if (!report.passed()) return {true, "yes", cuda::first_finding(report)};
    if (harness_fault) return {true, "robust", "passes: the plugin is robust to it (it does not depend on the input this corrupts: it makes that part itself)"};
    return {false, "NO", cuda::first_finding(report)};
  } catch (const std::exception& e) {
    return {false, "ERROR", e.what()};
  }
}

}  // namespace

void run_gpu_mutants(const std::optional<std::string>& asked) {
  // --exchange, else CPKV_EXCHANGE, else the built-in plugin (cpkv's own fused compose through the
  // ABI), and the other knobs, resolved by the request check as a replay's are.
  harness::CheckedRequest knobs;
  knobs.request.exchange = asked;
  // The entry that holds the GPU's planted bugs, as `cpkv mutants` chose it (by its bits, never its name).
  for (const harness::BackendEntry& entry : cpkv::backends::registry().entries()) {
    if ((entry.mutants & harness::kGpuHolds) != 0 && knobs.backend == nullptr) knobs.backend = &entry;
  }
  CPKV_ASSERT(knobs.backend != nullptr);  // run_mutants calls this only where such an entry is registered
  knobs.request.backend = knobs.backend->name;
  knobs.knobs = harness::resolve_knobs(knobs.request, *knobs.backend);
  const std::string named = knobs.request.exchange.value_or(knobs.backend->default_exchange);
  if (named == harness::kInProcessExchange) {
    throw OptionError(fmt::format("--exchange: {} ({})", harness::kInProcessGone, asked ? "--exchange inprocess" : "CPKV_EXCHANGE=inprocess"));
  }
  std::vector<harness::Mutant> mutants;
  cuda::CudaOptions cuda_options;
  cuda::apply_knobs(knobs.request, cuda_options);
  cuda_options.exchange = load_plugin(named, std::chrono::milliseconds(knobs.request.exchange_load_ms_max.value_or(harness::kLoadMsMax)), mutants);
  const int gpus = cuda::gpus_or_refuse();
  fmt::print("cpkv mutants --backend cuda: {} GPUs | staging_direct, {} layers, page 16, kv_fp8 + indexer_k{}\n", gpus, cuda::kGpuMutantLayers,
             fmt::format(" | exchange plugin '{}' ({}): two batches, so a first batch's plan or inverse is stale in the second",
                         cuda_options.exchange->name, named));
  fmt::print("{}\n", harness::knobs_line(knobs));
  bool ok = true;
  const cuda::VerifySelfTest self = cuda::verify_self_test();
  const bool located = self.failure.empty() && self.wrong_bytes_clean == 0 && self.wrong_bytes_corrupted == 1 && self.slot == self.planted_slot &&
                       self.row == self.planted_row && self.byte == self.planted_byte && self.expected == self.planted_expected &&
                       self.actual == self.planted_actual;
  ok = ok && located;
  fmt::print("verify self-test: {} | clean buffer {} wrong bytes; one byte flipped at slot {} row {} byte {} ({:#04x} -> {:#04x}); found {} wrong at "
             "slot {} row {} byte {} (expected {:#04x} got {:#04x}) {}\n",
             located ? "passes" : "FAILS", self.wrong_bytes_clean, self.planted_slot, self.planted_row, self.planted_byte, self.planted_expected,
             self.planted_actual, self.wrong_bytes_corrupted, self.slot, self.row, self.byte, self.expected, self.actual, self.failure);
  fmt::print("{:<22} {:>3} {:>5}  {:<8} {}\n", "mutant", "cp", "gpus", "caught", "first finding");
  auto backend = cuda::make_cuda_backend(cuda_options);
  for (const std::int32_t cp : {2, 4, 8}) {
    const harness::BatchSource source = cuda::gpu_plugin_mutant_source(cp);
    harness::RunOptions options;
    options.variant = model::Variant::staging_direct;
    options.layers = cuda::kGpuMutantLayers;
    options.seed = 7;
    const harness::RunReport clean = backend->run(source, options);
    ok = ok && clean.passed();
    fmt::print("{:<22} {:>3} {:>5}  {:<8} {}\n", "none", cp, std::min(gpus, cp), clean.passed() ? "passes" : "FAILS", cuda::first_finding(clean));
    for (harness::Mutant mutant : mutants) {
      options.mutant = mutant;
      const Row row = run_row(*backend, source, options, harness::held_by(mutant, harness::kHarnessHolds));
      ok = ok && row.ok;
      fmt::print("{:<22} {:>3} {:>5}  {:<8} {}\n", harness::to_string(mutant), cp, std::min(gpus, cp), row.verdict, row.finding);
      std::fflush(stdout);
    }
    options.mutant = harness::Mutant::none;
  }
  exit_status() = ok ? kExitOk : kExitFailure;
}

}  // namespace cpkv::cli

// cpkv mutants: the property suite against every planted bug, as a table.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include <rapidcheck/detail/Configuration.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "backends.hpp"
#include "commands.hpp"
#include "mutants_report.hpp"
#include "options.hpp"
#include "rc_params.hpp"
#include "run_outputs.hpp"
#include "cpkv/model/content.hpp"
#include "cpkv/properties/mutation.hpp"

namespace cpkv::cli {
namespace {

struct MutantsOptions {
  std::optional<std::uint64_t> seed;
  std::optional<int> cases;
  bool every_property = false;
  std::string backend = "sim";
  std::optional<std::string> exchange;  // cuda: an exchange plugin (include/cpkv/exchange_abi.h)
  std::optional<std::string> shard;     // sim: K/N (mutants_report.hpp)
  RunOutputOptions outputs;             // sim: --json, --junit, --out
};

// The coverage of the correct protocol's runs (every property, every case) and the targets missed.
struct CoverageReport {
  std::string text;  // the table and a line per target missed, as printed
  std::vector<std::string> misses;
};

CoverageReport coverage_report(const properties::MutantRow& row, const rc::detail::TestParams& params) {
  CoverageReport report;
  report.text = fmt::format("\n{}", properties::coverage_table(row.coverage));
  for (const auto& [name, coverage] : row.coverage) {
    for (const properties::Property& property : properties::all_properties()) {
      if (property.name != name) continue;
      properties::PropertyOutcome outcome;
      outcome.coverage = coverage;
      for (const std::string& miss : properties::coverage_misses(property, outcome, params)) report.misses.push_back(miss);
    }
  }
  for (const std::string& miss : report.misses) report.text += fmt::format("COVERAGE TARGET MISSED: {}\n", miss);
  report.text += "\n";
  return report;
}

// The --json file: what was asked, the shard, its rows and (in the shard holding none) the coverage.
std::string mutants_json(const MutantsRun& run, const std::vector<std::size_t>& indices, const std::vector<properties::MutantRow>& rows,
                         const std::optional<CoverageReport>& coverage) {
  nlohmann::json out = {{"cpkv_mutants", 1},
                        {"seed", run.seed},
                        {"cases", run.cases},
                        {"every_property", run.every_property},
                        {"suite_rows", properties::suite_rows().size()},
                        {"shard", run.shard ? nlohmann::json{{"k", run.shard->k}, {"n", run.shard->n}} : nlohmann::json{{"k", 1}, {"n", 1}}}};
  out["rows"] = nlohmann::json::array();
  for (std::size_t i = 0; i < rows.size(); ++i) out["rows"].push_back(mutant_row_json(indices[i], rows[i]));
  out["coverage"] = coverage ? nlohmann::json{{"table", coverage->text}, {"missed", coverage->misses}} : nlohmann::json(nullptr);
  return out.dump(2) + "\n";
}

// The backend's planted bugs, asked of its registry entry (never of its name): a backend holding
// the GPU's runs them on the GPUs (cli/gpu_mutants_command.cpp), one holding the simulator's runs
// the property suite.
const harness::BackendEntry& mutants_backend(const MutantsOptions& o) {
  const harness::BackendEntry* entry = cpkv::backends::registry().find(o.backend);
  if (entry == nullptr) throw OptionError(fmt::format("--backend: '{}' is not one of {}", o.backend, cpkv::backends::registry().names()));
  if (entry->mutants == 0) throw OptionError(fmt::format("--backend {} moves no content: planted bugs live in the backends that do", o.backend));
  if (o.exchange && (entry->options & harness::kTakesExchange) == 0) {
    throw OptionError(fmt::format("--exchange: --backend {} does not take it (a plugin runs on a backend that takes --exchange)", o.backend));
  }
  const bool on_gpus = (entry->mutants & harness::kGpuHolds) != 0;
  if (on_gpus && (o.shard || o.outputs.any())) {
    throw OptionError(fmt::format("{}: --backend {} does not take it (the simulator's suite does)",
                                  o.shard ? "--shard" : o.outputs.json_path ? "--json" : o.outputs.junit_path ? "--junit" : "--out", o.backend));
  }
  return *entry;
}

void run_mutants(const MutantsOptions& o) {
  check_rc_params();
  if ((mutants_backend(o).mutants & harness::kGpuHolds) != 0) {
#if CPKV_HAVE_CUDA_BACKEND
    run_gpu_mutants(o.exchange);
#endif
    return;  // an entry holding the GPU's planted bugs is registered only where the GPU backend is built
  }
  rc::detail::TestParams params = properties::suite_params();
  if (o.seed) params.seed = *o.seed;
  if (o.cases) params.maxSuccess = *o.cases;
  const MutantsRun run{params.seed, params.maxSuccess, o.every_property, o.shard ? std::optional<Shard>(parse_shard(*o.shard)) : std::nullopt};
  RunOutputs outputs = open_run_outputs(o.outputs);
  const std::vector<harness::Mutant> all = properties::suite_rows();
  std::vector<std::size_t> indices = run.shard ? properties::shard_rows(run.shard->k, run.shard->n) : properties::shard_rows(1, 1);
  std::vector<harness::Mutant> mutants;
  for (std::size_t i : indices) mutants.push_back(all[i]);
  print_mutants_header(run);
  std::fflush(stdout);
  MutantsTally tally;
  std::optional<CoverageReport> coverage;
  const std::vector<properties::MutantRow> rows = properties::mutation_table(params, o.every_property, [&](const properties::MutantRow& row) {
    print_mutant_row(row);
    tally.add(row);
    if (row.mutant == harness::Mutant::none) {
      coverage = coverage_report(row, params);
      tally.coverage_met = coverage->misses.empty();
      fmt::print("{}", coverage->text);
    }
    std::fflush(stdout);
  }, mutants);
  exit_status() = print_mutants_summary(tally);
  outputs.write([&] { return mutants_json(run, indices, rows, coverage); }, [&] { return mutants_junit(run, rows, tally); });
}

}  // namespace

void register_mutants(CLI::App& app) {
  auto o = std::make_shared<MutantsOptions>();
  CLI::App* cmd = app.add_subcommand("mutants",
                                     "Run the property suite against each planted bug and print which property caught it, the shrunk "
                                     "counterexample's size (requests + schedule choices) and the time to catch it. RC_PARAMS is honoured.");
  cmd->add_option("--seed", o->seed, "RapidCheck seed (default: the suite's fixed seed or RC_PARAMS)")->check(seed_value());
  cmd->add_option("--cases", o->cases, "cases per property (default: RapidCheck's max_success)")
      ->check(whole_in<int>(1, static_cast<int>(option_limits::repetitions_max)));
  cmd->add_flag("--every-property", o->every_property, "after the first catch, run the other scheduled properties too (slower)");
  cmd->add_option("--backend", o->backend, "sim (the property suite) or cuda (the GPU planted bugs on 2+ GPUs and the verify self-test)")->capture_default_str();
  cmd->add_option("--exchange", o->exchange,
                  "cuda: the planted bugs against this exchange plugin instead of cpkv's own: the ones it holds itself and the harness's "
                  "that reach what it reads (stale_page_inverse, reused_plan, unzeroed_rows)");
  cmd->add_option("--shard", o->shard,
                  "K/N: run only shard K (1-based) of N: the rows i (0 none, then the planted bugs in table order) with i % N == K - 1; "
                  "the exit status judges only these rows (the correct protocol and coverage in shard 1)");
  add_run_output_options(*cmd, o->outputs, "the rows", "row");
  cmd->callback([o] { run_mutants(*o); });
}

}  // namespace cpkv::cli

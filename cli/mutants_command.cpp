// cpkv mutants: the property suite against every planted bug, as a table.
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include <rapidcheck/detail/Configuration.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "commands.hpp"
#include "options.hpp"
#include "rc_params.hpp"
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
};

// RapidCheck reads RC_PARAMS on first use and ends the process (status 1, several lines) when it
// cannot parse it; read it here first, so a bad one is bad input like any option.
void check_rc_params() {
  const char* env = std::getenv("RC_PARAMS");
  if (env == nullptr) return;
  refuse_unknown_rc_params_keys(env);
  try {
    (void)rc::detail::configFromString(env);
  } catch (const rc::detail::ConfigurationException& e) {
    throw OptionError(fmt::format("RC_PARAMS: {}", e.what()));
  }
}

// The invariant column: the one that fired in the catching property ("-" when not caught).
std::string invariant_cell(const properties::MutantRow& row) {
  return row.caught && row.invariant > 0 ? std::to_string(row.invariant) : "-";
}

void print_row(const properties::MutantRow& row) {
  const bool none = row.mutant == harness::Mutant::none;
  const std::string name = none ? "none (correct protocol)" : std::string(harness::to_string(row.mutant));
  const std::string verdict = none ? (row.caught ? "FAILED" : "passes") : (row.caught ? "yes" : "NO");
  fmt::print("{:<26} {:<8} {:<28} {:>9} {:>9} {:>9.2f}\n", name, verdict, row.caught ? row.caught_by : "-", invariant_cell(row),
             row.caught ? std::to_string(row.counterexample_size) : "-", row.seconds);
  if (!row.also_caught_by.empty()) fmt::print("    also caught by: {}\n", fmt::join(row.also_caught_by, ", "));
  // A failure that came through no invariant check (an exception in the body) records no case:
  // say so, with RapidCheck's first line, rather than print an empty or another row's line.
  const std::string why = row.message.substr(0, row.message.find('\n'));
  if (row.caught) fmt::print("    replay: {}\n", row.replay.empty() ? "none (no counterexample was recorded: " + why + ")" : row.replay);
}

// The coverage of the correct protocol's runs (every property, every case) and the targets missed.
std::vector<std::string> print_coverage(const properties::MutantRow& row, const rc::detail::TestParams& params) {
  fmt::print("\n{}", properties::coverage_table(row.coverage));
  std::vector<std::string> misses;
  for (const auto& [name, coverage] : row.coverage) {
    for (const properties::Property& property : properties::all_properties()) {
      if (property.name != name) continue;
      properties::PropertyOutcome outcome;
      outcome.coverage = coverage;
      for (const std::string& miss : properties::coverage_misses(property, outcome, params)) misses.push_back(miss);
    }
  }
  for (const std::string& miss : misses) fmt::print("COVERAGE TARGET MISSED: {}\n", miss);
  fmt::print("\n");
  return misses;
}

void run_mutants(const MutantsOptions& o) {
  check_rc_params();
  if (o.exchange && o.backend != "cuda") throw OptionError(fmt::format("--exchange: --backend {} does not take it (a plugin runs on cuda)", o.backend));
  if (o.backend == "cuda") {
#if CPKV_HAVE_CUDA_BACKEND
    run_gpu_mutants(o.exchange);
    return;
#else
    throw OptionError("--backend cuda: not available in this build (needs nvcc and NCCL at configure time)");
#endif
  }
  if (o.backend != "sim") throw OptionError(fmt::format("--backend: '{}' is not one of sim, cuda", o.backend));
  rc::detail::TestParams params = properties::suite_params();
  if (o.seed) params.seed = *o.seed;
  if (o.cases) params.maxSuccess = *o.cases;
  fmt::print("cpkv mutants: property suite against every planted bug | seed {} | {} cases per property\n", params.seed, params.maxSuccess);
  fmt::print("{:<26} {:<8} {:<28} {:>9} {:>9} {:>9}\n", "mutant", "caught", "first by property", "invariant", "cex size", "s to catch");
  std::fflush(stdout);
  std::int32_t caught = 0;
  std::int32_t planted = 0;
  bool clean_passes = true;
  bool coverage_met = true;
  properties::mutation_table(params, o.every_property, [&](const properties::MutantRow& row) {
    print_row(row);
    if (row.mutant == harness::Mutant::none) {
      clean_passes = !row.caught;
      coverage_met = print_coverage(row, params).empty();
    } else {
      ++planted;
      caught += row.caught ? 1 : 0;
    }
    std::fflush(stdout);
  });
  fmt::print("caught {} of {} planted bugs ({:.0f}%); correct protocol {}; coverage targets {}\n", caught, planted,
             planted ? 100.0 * caught / planted : 0.0, clean_passes ? "passes every property" : "FAILS a property",
             coverage_met ? "met" : "MISSED");
  exit_status() = caught == planted && clean_passes && coverage_met ? kExitOk : kExitFailure;
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
  cmd->callback([o] { run_mutants(*o); });
}

}  // namespace cpkv::cli

namespace cpkv::cli {
namespace {

struct SoakOptions {
  double minutes = 1.0;
  std::uint64_t seed = 0;  // 0: drawn from the clock and printed (the one non-replayable choice)
  int cases = 100;
};

void run_soak(const SoakOptions& o) {
  check_rc_params();
  // The master seed is the one random choice of a soak; every property seed derives from it.
  const std::uint64_t master = o.seed != 0 ? o.seed : static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  fmt::print("cpkv soak: {} minutes | master seed {} | {} cases per property and seed\n", o.minutes, master, o.cases);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double, std::ratio<60>>(o.minutes);
  std::uint64_t state = master;
  std::int64_t rounds = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    state = model::mix64(state);
    rc::detail::TestParams params = properties::suite_params();
    params.seed = state;
    params.maxSuccess = o.cases;
    fmt::print("seed {} ...\n", params.seed);
    std::fflush(stdout);
    for (const properties::Property& property : properties::all_properties()) {
      const properties::PropertyOutcome outcome = properties::check_property(property, harness::Mutant::none, params);
      if (outcome.passed) continue;
      fmt::print("FAILED {} with seed {}:\n{}\n  reproduce: RC_PARAMS=\"seed={}\" build/tests/cpkv.tests.properties\n", property.name, params.seed,
                 outcome.message, params.seed);
      exit_status() = kExitFailure;
      return;
    }
    ++rounds;
  }
  fmt::print("soak passed: {} seeds x {} properties\n", rounds, properties::all_properties().size());
}

}  // namespace

void register_soak(CLI::App& app) {
  auto o = std::make_shared<SoakOptions>();
  CLI::App* cmd = app.add_subcommand("soak", "Run the property suite with fresh seeds until the time is up, printing each seed before it starts.");
  cmd->add_option("--minutes", o->minutes, "how long to run")->capture_default_str()->check(finite_in(0, option_limits::soak_minutes_max, /*low_open=*/true));
  cmd->add_option("--seed", o->seed, "master seed (default: drawn and printed)")->check(seed_value());
  cmd->add_option("--cases", o->cases, "cases per property and seed")->capture_default_str()
      ->check(whole_in<int>(1, static_cast<int>(option_limits::repetitions_max)));
  cmd->callback([o] { run_soak(*o); });
}

}  // namespace cpkv::cli

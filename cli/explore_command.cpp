// cpkv explore: every interleaving of the rank step machines for small settings.
#include <chrono>
#include <cstdio>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "commands.hpp"
#include "options.hpp"
#include "cpkv/properties/explorer.hpp"
#include "cpkv/sim/runner.hpp"

namespace cpkv::cli {
namespace {

struct ExploreCliOptions {
  std::int32_t cp_max = 4;
  std::int32_t layers_max = 4;
  std::string variant = "staging_direct";
  double seconds_max = 60.0;
};

void run_explore(const ExploreCliOptions& o) {
  const auto variant = model::parse_variant(o.variant);
  if (!variant) throw OptionError(fmt::format("--variant: unknown variant '{}'", o.variant));
  fmt::print("cpkv explore: every interleaving, visited-state set over program-counter vectors | variant {} | batch: (prefix 2 extend 3) "
             "(extend 2), page 2, kv_fp8 + indexer_k, layers FSFS\n",
             o.variant);
  fmt::print("{:>3} {:>7} {:<20} {:>10} {:>12} {:>9}  {}\n", "cp", "layers", "mutant", "states", "transitions", "seconds", "result");
  bool all_as_expected = true;
  const auto report = [&](std::int32_t cp, std::int32_t layers, sim::Mutant mutant) {
    properties::ExploreOptions options;
    options.setting = properties::exploration_setting(cp);
    options.batch = properties::exploration_batch();
    options.variant = *variant;
    options.layers = layers;
    options.mutant = mutant;
    options.seconds_max = o.seconds_max;
    const properties::ExploreResult r = properties::explore(options);
    std::string result;
    if (r.found) {
      result = fmt::format("FOUND {} | schedule [{}]", r.finding, fmt::join(r.schedule, " "));
    } else {
      result = r.complete ? "proved: no violation in any interleaving" : "INCOMPLETE (limit reached)";
    }
    const bool expected = mutant == sim::Mutant::none ? (!r.found && r.complete) : r.found;
    all_as_expected = all_as_expected && expected;
    fmt::print("{:>3} {:>7} {:<20} {:>10} {:>12} {:>9.2f}  {}\n", cp, layers, sim::to_string(mutant), r.states, r.transitions, r.seconds, result);
    std::fflush(stdout);
  };
  for (std::int32_t cp = 1; cp <= o.cp_max; ++cp) {
    for (std::int32_t layers = 1; layers <= o.layers_max; ++layers) report(cp, layers, sim::Mutant::none);
  }
  for (sim::Mutant mutant : {sim::Mutant::single_half, sim::Mutant::no_barrier, sim::Mutant::arrive_before_fill}) {
    report(2, std::min(3, o.layers_max), mutant);
  }
  exit_status() = all_as_expected ? kExitOk : kExitFailure;
}

}  // namespace

void register_explore(CLI::App& app) {
  auto o = std::make_shared<ExploreCliOptions>();
  CLI::App* cmd = app.add_subcommand("explore",
                                     "Explore every interleaving of the rank step machines for small settings (cp 1..N, layers 1..M) with a "
                                     "visited-state set: proves parity-half reuse safety and barrier phase safety for them, and finds the "
                                     "single_half, no_barrier and arrive_before_fill counterexamples.");
  cmd->add_option("--cp-max", o->cp_max, "largest group explored")->capture_default_str()->check(whole_in<std::int32_t>(1, 4));
  cmd->add_option("--layers-max", o->layers_max, "most layers explored")->capture_default_str()->check(whole_in<std::int32_t>(1, 4));
  cmd->add_option("--variant", o->variant, "exchange variant")->capture_default_str();
  cmd->add_option("--seconds-max", o->seconds_max, "time limit per exploration")->capture_default_str()->check(finite_in(0, option_limits::explore_seconds_max, /*low_open=*/true));
  cmd->callback([o] { run_explore(*o); });
}

}  // namespace cpkv::cli

// cpkv explore: every interleaving of the rank step machines for small settings.
#include <chrono>
#include <cstdio>
#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "commands.hpp"
#include "explore_rows.hpp"
#include "options.hpp"
#include "run_outputs.hpp"
#include "shard_rows.hpp"
#include "cpkv/properties/explorer.hpp"
#include "cpkv/sim/mutant.hpp"
#include "cpkv/sim/runner.hpp"

namespace cpkv::cli {
namespace {

struct ExploreCliOptions {
  std::int32_t cp_max = 4;
  std::int32_t layers_max = 4;
  std::string variant = "staging_direct";
  double seconds_max = 60.0;
  bool shapes = true;
  std::int32_t shape_layers = 3;
  std::optional<std::string> shard;  // K/N over the units (cli/explore_rows.hpp)
  RunOutputOptions outputs;          // --json, --junit, --out
};

std::string outcome(const properties::ExploreResult& r) {
  if (r.found) return fmt::format("FOUND {} | schedule [{}]", r.finding, fmt::join(r.schedule, " "));
  return r.complete ? "proved: no violation in any interleaving" : "INCOMPLETE (limit reached)";
}

// Every shape proved for cp 1..min(3, cp_max), then every planted bug hunted over the shapes (cp 2,
// then 3) until one shape finds it. True when every proof completed clean and every bug was found.
bool explore_shapes(const ExploreCliOptions& o, ShardedRun& run) {
  const std::int32_t layers = std::min(o.shape_layers, o.layers_max);
  const std::int32_t cp_top = std::min(3, o.cp_max);
  fmt::print("\nshapes ({} layers, pattern FSFS, page 2, kv_fp8 + indexer_k)\n", layers);
  const std::string shape_header = fmt::format("{:<21} {:>3} {:>10} {:>12} {:>9}  {}", "shape", "cp", "states", "transitions", "seconds", "result");
  fmt::print("{}\n", shape_header);
  bool ok = true;
  for (std::int32_t cp = 1; cp <= cp_top; ++cp) {
    for (const properties::ExploreShape& shape : properties::exploration_shapes(cp)) {
      if (!run.take()) continue;
      properties::ExploreOptions options = properties::options_for(shape, layers, harness::Mutant::none);
      options.seconds_max = o.seconds_max;
      const properties::ExploreResult r = properties::explore(options);
      ok = ok && !r.found && r.complete;
      const std::string line = fmt::format("{:<21} {:>3} {:>10} {:>12} {:>9.2f}  {}", shape.name, cp, r.states, r.transitions, r.seconds, outcome(r));
      const std::string stem = fmt::format("explore-{}-cp{}-none", shape.name, cp);
      const ExploreCounterexample kept = keep_explore_counterexample(options, r, stem);
      fmt::print("{}\n{}", line, counterexample_lines(kept));
      run.add(explore_row(shape_header, fmt::format("{} cp {}", shape.name, cp), r, !r.found && r.complete, line, kept.replay));
      std::fflush(stdout);
    }
  }
  fmt::print("\nplanted bugs: the first shape (cp 2, then 3) in which exploration reaches a violation or deadlock\n");
  const std::string hunt_header = fmt::format("{:<26} {:<21} {:>3} {:>10} {:>9}  {}", "mutant", "shape", "cp", "states", "seconds", "finding");
  fmt::print("{}\n", hunt_header);
  for (harness::Mutant mutant : harness::kAllMutants) {
    if (!run.take()) continue;
    bool found = false;
    std::string line;
    ExploreCounterexample kept;
    properties::ExploreResult hit;
    for (std::int32_t cp = 2; cp <= std::max(2, cp_top) && !found; ++cp) {
      for (const properties::ExploreShape& shape : properties::exploration_shapes(cp)) {
        properties::ExploreOptions options = properties::options_for(shape, layers, mutant);
        options.seconds_max = o.seconds_max;
        const properties::ExploreResult r = properties::explore(options);
        if (!r.found) continue;
        found = true;
        hit = r;
        line = fmt::format("{:<26} {:<21} {:>3} {:>10} {:>9.2f}  {}", harness::to_string(mutant), shape.name, cp, r.states, r.seconds, r.finding);
        kept = keep_explore_counterexample(options, r, fmt::format("explore-{}-cp{}-{}", shape.name, cp, harness::to_string(mutant)));
        break;
      }
    }
    if (!found) line = fmt::format("{:<26} {:<21}", harness::to_string(mutant), "NOT FOUND in any shape");
    fmt::print("{}\n{}", line, counterexample_lines(kept));
    run.add(explore_row(hunt_header, std::string(harness::to_string(mutant)), hit, found, line, kept.replay));
    ok = ok && found;
    std::fflush(stdout);
  }
  return ok;
}

void run_explore(const ExploreCliOptions& o) {
  const auto variant = model::parse_variant(o.variant);
  if (!variant) throw OptionError(fmt::format("--variant: unknown variant '{}'", o.variant));
  const std::int32_t cp_top = std::min(3, o.cp_max);
  ShardedRun run = sharded_run("explore", o.shard, explore_units(o.cp_max, o.layers_max, o.shapes, cp_top),
                               {{"cp_max", o.cp_max}, {"layers_max", o.layers_max}, {"variant", o.variant}, {"shapes", o.shapes},
                                {"shape_layers", o.shape_layers}, {"seconds_max", o.seconds_max}});
  RunOutputs outputs = open_run_outputs(o.outputs);
  fmt::print("cpkv explore: every interleaving, visited-state set over program-counter vectors | variant {} | batch: (prefix 2 extend 3) "
             "(extend 2), page 2, kv_fp8 + indexer_k, layers FSFS\n",
             o.variant);
  if (!run.header().empty()) fmt::print("{}\n", run.header().substr(3));
  const std::string grid_header = fmt::format("{:>3} {:>7} {:<20} {:>10} {:>12} {:>9}  {}", "cp", "layers", "mutant", "states", "transitions", "seconds", "result");
  fmt::print("{}\n", grid_header);
  bool all_as_expected = true;
  const auto report = [&](std::int32_t cp, std::int32_t layers, harness::Mutant mutant) {
    if (!run.take()) return;
    properties::ExploreOptions options;
    options.setting = properties::exploration_setting(cp);
    options.batches = {properties::exploration_batch()};
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
    const bool expected = mutant == harness::Mutant::none ? (!r.found && r.complete) : r.found;
    all_as_expected = all_as_expected && expected;
    const std::string line = fmt::format("{:>3} {:>7} {:<20} {:>10} {:>12} {:>9.2f}  {}", cp, layers, harness::to_string(mutant), r.states, r.transitions, r.seconds, result);
    const std::string stem = fmt::format("explore-cp{}-layers{}-{}", cp, layers, harness::to_string(mutant));
    const ExploreCounterexample kept = keep_explore_counterexample(options, r, stem);
    fmt::print("{}\n{}", line, counterexample_lines(kept));
    run.add(explore_row(grid_header, fmt::format("cp {} layers {} {}", cp, layers, harness::to_string(mutant)), r, expected, line, kept.replay));
    std::fflush(stdout);
  };
  for (std::int32_t cp = 1; cp <= o.cp_max; ++cp) {
    for (std::int32_t layers = 1; layers <= o.layers_max; ++layers) report(cp, layers, harness::Mutant::none);
  }
  for (harness::Mutant mutant : {harness::Mutant::single_half, harness::Mutant::no_barrier, harness::Mutant::arrive_before_fill}) {
    report(2, std::min(3, o.layers_max), mutant);
  }
  if (o.shapes) all_as_expected = explore_shapes(o, run) && all_as_expected;
  exit_status() = all_as_expected ? kExitOk : kExitFailure;
  outputs.write([&] { return sharded_json(run); }, [&] { return sharded_junit(run); });
}

}  // namespace

void register_explore(CLI::App& app) {
  auto o = std::make_shared<ExploreCliOptions>();
  CLI::App* cmd = app.add_subcommand("explore",
                                     "Explore every interleaving of the rank step machines for small settings (cp 1..N, layers 1..M) with a "
                                     "visited-state set: proves parity-half reuse safety and barrier phase safety for them, and finds the "
                                     "single_half, no_barrier and arrive_before_fill counterexamples; then proves every shape (the barrier variants, an idle "
                                     "rank, overflow then normal, two batches, the capability fallback) for cp <= 3 and hunts every planted bug over them.");
  cmd->add_option("--cp-max", o->cp_max, "largest group explored")->capture_default_str()->check(whole_in<std::int32_t>(1, 4));
  cmd->add_option("--layers-max", o->layers_max, "most layers explored")->capture_default_str()->check(whole_in<std::int32_t>(1, 4));
  cmd->add_option("--variant", o->variant, "exchange variant")->capture_default_str();
  cmd->add_option("--seconds-max", o->seconds_max, "time limit per exploration")->capture_default_str()->check(finite_in(0, option_limits::explore_seconds_max, /*low_open=*/true));
  cmd->add_option("--shape-layers", o->shape_layers, "layers of the shapes table")->capture_default_str()->check(whole_in<std::int32_t>(1, 4));
  cmd->add_flag("!--no-shapes", o->shapes, "leave out the shapes table and the planted-bug hunt over the shapes");
  cmd->add_option("--shard", o->shard, "K/N: run only the explorations i (0-based, in the order the tables print them) with i % N == K - 1");
  add_run_output_options(*cmd, o->outputs, "each exploration's row", "exploration");
  cmd->callback([o] { run_explore(*o); });
}

}  // namespace cpkv::cli

// cpkv explore: every interleaving of the rank step machines for small settings.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "commands.hpp"
#include "options.hpp"
#include "cpkv/harness/temp_files.hpp"
#include "cpkv/properties/explorer.hpp"
#include "cpkv/properties/properties.hpp"
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
};

// A finding written as a counterexample (trace and schedule, and its timeline beside them as
// STEM.timeline.json) in the run's private counterexample folder; prints the replay line and the
// timeline's path.
void print_counterexample(const properties::ExploreOptions& options, const properties::ExploreResult& r, const std::string& stem) {
  properties::Case c;
  c.setting = options.setting;
  c.batches = options.batches;
  c.variant = options.variant;
  c.layers = options.layers;
  c.schedule = r.schedule;
  c.ipc_missing_rank = options.ipc_missing_rank;
  try {
    const std::string dir = harness::private_folder("cpkv-counterexamples");
    fmt::print("    replay: {}\n", properties::write_replay(c, options.mutant, dir, stem));
    const std::string timeline = (std::filesystem::path(dir) / (stem + ".timeline.json")).string();
    properties::write_timeline(c, options.mutant, timeline);
    fmt::print("    timeline: {}\n", timeline);
  } catch (const std::runtime_error& e) {
    fmt::print("    counterexample not written: {}\n", e.what());
  }
}

std::string outcome(const properties::ExploreResult& r) {
  if (r.found) return fmt::format("FOUND {} | schedule [{}]", r.finding, fmt::join(r.schedule, " "));
  return r.complete ? "proved: no violation in any interleaving" : "INCOMPLETE (limit reached)";
}

// Every shape proved for cp 1..min(3, cp_max), then every planted bug hunted over the shapes (cp 2,
// then 3) until one shape finds it. True when every proof completed clean and every bug was found.
bool explore_shapes(const ExploreCliOptions& o) {
  const std::int32_t layers = std::min(o.shape_layers, o.layers_max);
  const std::int32_t cp_top = std::min(3, o.cp_max);
  fmt::print("\nshapes ({} layers, pattern FSFS, page 2, kv_fp8 + indexer_k)\n", layers);
  fmt::print("{:<21} {:>3} {:>10} {:>12} {:>9}  {}\n", "shape", "cp", "states", "transitions", "seconds", "result");
  bool ok = true;
  for (std::int32_t cp = 1; cp <= cp_top; ++cp) {
    for (const properties::ExploreShape& shape : properties::exploration_shapes(cp)) {
      properties::ExploreOptions options = properties::options_for(shape, layers, harness::Mutant::none);
      options.seconds_max = o.seconds_max;
      const properties::ExploreResult r = properties::explore(options);
      ok = ok && !r.found && r.complete;
      fmt::print("{:<21} {:>3} {:>10} {:>12} {:>9.2f}  {}\n", shape.name, cp, r.states, r.transitions, r.seconds, outcome(r));
      std::fflush(stdout);
    }
  }
  fmt::print("\nplanted bugs: the first shape (cp 2, then 3) in which exploration reaches a violation or deadlock\n");
  fmt::print("{:<26} {:<21} {:>3} {:>10} {:>9}  {}\n", "mutant", "shape", "cp", "states", "seconds", "finding");
  for (harness::Mutant mutant : harness::kAllMutants) {
    bool found = false;
    for (std::int32_t cp = 2; cp <= std::max(2, cp_top) && !found; ++cp) {
      for (const properties::ExploreShape& shape : properties::exploration_shapes(cp)) {
        properties::ExploreOptions options = properties::options_for(shape, layers, mutant);
        options.seconds_max = o.seconds_max;
        const properties::ExploreResult r = properties::explore(options);
        if (!r.found) continue;
        found = true;
        fmt::print("{:<26} {:<21} {:>3} {:>10} {:>9.2f}  {}\n", harness::to_string(mutant), shape.name, cp, r.states, r.seconds, r.finding);
        print_counterexample(options, r, fmt::format("explore-{}-{}-cp{}", harness::to_string(mutant), shape.name, cp));
        break;
      }
    }
    if (!found) fmt::print("{:<26} {:<21}\n", harness::to_string(mutant), "NOT FOUND in any shape");
    ok = ok && found;
    std::fflush(stdout);
  }
  return ok;
}

void run_explore(const ExploreCliOptions& o) {
  const auto variant = model::parse_variant(o.variant);
  if (!variant) throw OptionError(fmt::format("--variant: unknown variant '{}'", o.variant));
  fmt::print("cpkv explore: every interleaving, visited-state set over program-counter vectors | variant {} | batch: (prefix 2 extend 3) "
             "(extend 2), page 2, kv_fp8 + indexer_k, layers FSFS\n",
             o.variant);
  fmt::print("{:>3} {:>7} {:<20} {:>10} {:>12} {:>9}  {}\n", "cp", "layers", "mutant", "states", "transitions", "seconds", "result");
  bool all_as_expected = true;
  const auto report = [&](std::int32_t cp, std::int32_t layers, harness::Mutant mutant) {
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
    fmt::print("{:>3} {:>7} {:<20} {:>10} {:>12} {:>9.2f}  {}\n", cp, layers, harness::to_string(mutant), r.states, r.transitions, r.seconds, result);
    if (r.found) print_counterexample(options, r, fmt::format("explore-{}-cp{}-layers{}", harness::to_string(mutant), cp, layers));
    std::fflush(stdout);
  };
  for (std::int32_t cp = 1; cp <= o.cp_max; ++cp) {
    for (std::int32_t layers = 1; layers <= o.layers_max; ++layers) report(cp, layers, harness::Mutant::none);
  }
  for (harness::Mutant mutant : {harness::Mutant::single_half, harness::Mutant::no_barrier, harness::Mutant::arrive_before_fill}) {
    report(2, std::min(3, o.layers_max), mutant);
  }
  if (o.shapes) all_as_expected = explore_shapes(o) && all_as_expected;
  exit_status() = all_as_expected ? kExitOk : kExitFailure;
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
  cmd->callback([o] { run_explore(*o); });
}

}  // namespace cpkv::cli

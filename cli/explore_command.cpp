// cpkv explore: the interleavings of the rank step machines, reduced (partial-order reduction over
// the steps' footprints, sleep sets) over a visited set of full-state fingerprints.
#include <chrono>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>

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
  std::string reduction = "partial-order";
  std::string symmetry = "idle-ranks";
  std::int32_t bitstate = 0;         // log2 of the bitstate array's bits; 0: exhaustive
  bool check_reduction = false;      // compare the reduced and the full search over the shapes, cp 1..min(4, cp max)
  CheckFilter check;                 // --check-cp, --check-shape: a part of the comparison
  std::optional<std::string> shard;  // K/N over the units (cli/explore_rows.hpp)
  RunOutputOptions outputs;          // --json, --junit, --out
};

properties::ExploreOptions with_cli(properties::ExploreOptions options, const ExploreCliOptions& o) {
  options.seconds_max = o.seconds_max;
  options.reduction = o.reduction == "none" ? properties::Reduction::none : properties::Reduction::partial_order;
  options.symmetry = o.symmetry == "none" ? properties::Symmetry::none : properties::Symmetry::idle_ranks;
  options.bitstate_log2 = o.bitstate;
  return options;
}

std::string outcome(const properties::ExploreResult& r) {
  if (r.found) return fmt::format("FOUND {} | schedule [{}]", r.finding, fmt::join(r.schedule, " "));
  if (r.coverage_estimate < 1.0) return fmt::format("no violation in the states visited (bitstate: coverage >= {:.4f})", r.coverage_estimate);
  return r.complete ? "proved: no violation in any interleaving" : "INCOMPLETE (limit reached)";
}
bool proved(const properties::ExploreResult& r) { return !r.found && (r.complete || r.coverage_estimate < 1.0); }

// The full search's states for a shape, unreduced: measured for cp <= 4, and above that the cp 4
// count grown by the cp 3 -> 4 ratio per added rank (an estimate: states grow about that much per
// rank, docs/properties.md).
struct UnreducedEstimate {
  std::map<std::pair<std::string, std::int32_t>, std::uint64_t> measured;
  std::string text(const properties::ExploreShape& shape, std::int32_t cp, std::int32_t layers, const ExploreCliOptions& o);
  std::uint64_t full(const std::string& name, std::int32_t cp, std::int32_t layers, const ExploreCliOptions& o);
};

std::uint64_t UnreducedEstimate::full(const std::string& name, std::int32_t cp, std::int32_t layers, const ExploreCliOptions& o) {
  const auto at = measured.find({name, cp});
  if (at != measured.end()) return at->second;
  for (const properties::ExploreShape& s : properties::exploration_shapes(cp)) {
    if (s.name != name) continue;
    properties::ExploreOptions options = with_cli(properties::options_for(s, layers, harness::Mutant::none), o);
    options.reduction = properties::Reduction::none;
    options.symmetry = properties::Symmetry::none;
    options.bitstate_log2 = 0;
    const properties::ExploreResult r = properties::explore(options);
    return measured[{name, cp}] = r.complete ? r.states : 0;
  }
  return 0;
}

std::string UnreducedEstimate::text(const properties::ExploreShape& shape, std::int32_t cp, std::int32_t layers, const ExploreCliOptions& o) {
  if (cp <= 4) return fmt::format("{}", full(shape.name, cp, layers, o));
  const double f3 = static_cast<double>(full(shape.name, 3, layers, o));
  const double f4 = static_cast<double>(full(shape.name, 4, layers, o));
  if (f3 <= 0 || f4 <= 0) return "?";
  return fmt::format("~{:.1e}", f4 * std::pow(f4 / f3, cp - 4));
}

// Every shape proved for cp 1..cp_max, with the unreduced states beside the reduced ones.
bool prove_shapes(const ExploreCliOptions& o, ShardedRun& run, std::int32_t layers) {
  fmt::print("\nshapes ({} layers, pattern FSFS, page 2, kv_fp8 + indexer_k; reduction {}, symmetry {})\n", layers, o.reduction, o.symmetry);
  const std::string header = fmt::format("{:<21} {:>3} {:>10} {:>12} {:>11} {:>9} {:>9}  {}", "shape", "cp", "states", "transitions", "unreduced",
                                         "cpu s", "states/s", "result");
  fmt::print("{}\n", header);
  UnreducedEstimate estimate;
  bool ok = true;
  for (std::int32_t cp = 1; cp <= o.cp_max; ++cp) {
    for (const properties::ExploreShape& shape : properties::exploration_shapes(cp)) {
      if (!run.take()) continue;
      const properties::ExploreOptions options = with_cli(properties::options_for(shape, layers, harness::Mutant::none), o);
      const properties::ExploreResult r = properties::explore(options);
      ok = ok && proved(r);
      const std::string line = fmt::format("{:<21} {:>3} {:>10} {:>12} {:>11} {:>9.2f} {:>9.0f}  {}", shape.name, cp, r.states, r.transitions,
                                           estimate.text(shape, cp, layers, o), r.seconds, r.states_per_second(), outcome(r));
      const ExploreCounterexample kept = keep_explore_counterexample(options, r, fmt::format("explore-{}-cp{}-none", shape.name, cp));
      fmt::print("{}\n{}", line, counterexample_lines(kept));
      run.add(explore_row(header, fmt::format("{} cp {}", shape.name, cp), r, proved(r), line, kept.replay));
      std::fflush(stdout);
    }
  }
  return ok;
}

// One planted bug hunted over the shapes of one group size, `first` tried first: the first shape
// that reaches it.
struct Hit {
  properties::ExploreResult r;
  properties::ExploreOptions options;
  std::string shape;
  std::int32_t cp = 0;
};
std::optional<Hit> hunt(const ExploreCliOptions& o, harness::Mutant mutant, std::int32_t cp, std::int32_t layers, const std::string& first) {
  std::vector<properties::ExploreShape> shapes = properties::exploration_shapes(cp);
  std::stable_partition(shapes.begin(), shapes.end(), [&](const properties::ExploreShape& s) { return s.name == first; });
  for (const properties::ExploreShape& shape : shapes) {
    const properties::ExploreOptions options = with_cli(properties::options_for(shape, layers, mutant), o);
    properties::ExploreResult r = properties::explore(options);
    if (r.found) return Hit{std::move(r), options, shape.name, cp};
  }
  return std::nullopt;
}

// Every planted bug hunted over the shapes: at the smallest group (cp 2, then up) that reaches it,
// and at cp max, each with its replayable schedule.
bool hunt_bugs(const ExploreCliOptions& o, ShardedRun& run, std::int32_t layers) {
  const std::int32_t top = std::max(2, o.cp_max);
  fmt::print("\nplanted bugs: the first shape in which exploration reaches a violation or deadlock, at the smallest cp (2, then up) and at cp {}\n", top);
  const std::string header = fmt::format("{:<26} {:<21} {:>3} {:>10} {:>9}  {}", "mutant", "shape", "cp", "states", "cpu s", "finding");
  fmt::print("{}\n", header);
  bool ok = true;
  for (harness::Mutant mutant : harness::kAllMutants) {
    if (!run.take()) continue;
    std::vector<Hit> hits;
    for (std::int32_t cp = 2; cp <= top && hits.empty(); ++cp) {
      if (auto h = hunt(o, mutant, cp, layers, "")) hits.push_back(std::move(*h));
    }
    if (!hits.empty() && hits.front().cp < top) {
      if (auto h = hunt(o, mutant, top, layers, hits.front().shape)) hits.push_back(std::move(*h));
    }
    const bool found = !hits.empty() && hits.back().cp == top;
    std::string text;
    std::string replay;
    for (const Hit& h : hits) {
      const std::string line = fmt::format("{:<26} {:<21} {:>3} {:>10} {:>9.2f}  {}", harness::to_string(mutant), h.shape, h.cp, h.r.states, h.r.seconds, h.r.finding);
      const ExploreCounterexample kept = keep_explore_counterexample(h.options, h.r, fmt::format("explore-{}-cp{}-{}", h.shape, h.cp, harness::to_string(mutant)));
      fmt::print("{}\n{}", line, counterexample_lines(kept));
      text += (text.empty() ? "" : "\n") + line;
      replay = kept.replay;
    }
    if (!found) {
      const std::string line = fmt::format("{:<26} {:<21} {:>3}", harness::to_string(mutant), "NOT FOUND in any shape", top);
      fmt::print("{}\n", line);
      text += (text.empty() ? "" : "\n") + line;
    }
    run.add(explore_row(header, std::string(harness::to_string(mutant)), found ? hits.back().r : properties::ExploreResult{}, found, text, replay));
    ok = ok && found;
    std::fflush(stdout);
  }
  return ok;
}

// One comparison's verdict. Where the full search hit its limit, what it found so far is still a
// set of real findings: the reduced search (complete) must hold every one of them, or they differ.
std::string compare_verdict(const properties::ExploreResult& full, const properties::ExploreResult& reduced) {
  if (full.complete && reduced.complete) return full.findings == reduced.findings ? "agree" : "DIFFER";
  if (!reduced.complete) return "INCOMPLETE (the reduced search hit the limit)";
  const bool holds = std::includes(reduced.findings.begin(), reduced.findings.end(), full.findings.begin(), full.findings.end());
  return holds ? fmt::format("INCOMPLETE (the full search hit the limit; the reduced one holds its {} findings so far)", full.findings.size())
               : "DIFFER (the full search, stopped at the limit, found what the reduced one did not)";
}

// With symmetry on top: the symmetric search's findings, up to a permutation of the idle ranks,
// must be those of a complete search without it (the reduced one, else the full one).
std::string symmetry_verdict(const std::string& verdict, const properties::ExploreResult& full, const properties::ExploreResult& reduced,
                             const properties::ExploreResult& symmetric) {
  if (symmetric.symmetric_ranks == 0) return verdict;
  const properties::ExploreResult* base = reduced.complete ? &reduced : full.complete ? &full : nullptr;
  if (!symmetric.complete) return verdict == "agree" ? "INCOMPLETE (the symmetric search hit the limit)" : verdict;
  if (base == nullptr) return verdict;
  const std::uint8_t ranks = symmetric.symmetric_ranks;
  if (properties::canonical_findings(base->findings, ranks) != properties::canonical_findings(symmetric.findings, ranks)) {
    return "DIFFER (with and without symmetry, up to a permutation of the idle ranks)";
  }
  return verdict;
}

// --check-reduction: on every shape of cp 1..min(4, cp max), the correct protocol and every planted
// bug, the reduced and the full search collect every violation and deadlock; they must agree. The
// last line counts the verdicts.
bool check_reduction(const ExploreCliOptions& o, ShardedRun& run, std::int32_t layers) {
  fmt::print("\nreduced against full: every violation and deadlock of every shape, none and every planted bug ({} layers)\n", layers);
  const std::string header = fmt::format("{:<21} {:>3} {:<26} {:>10} {:>10} {:>10} {:>8}  {}", "shape", "cp", "mutant", "full", "reduced", "symmetric", "findings", "result");
  fmt::print("{}\n", header);
  std::vector<harness::Mutant> mutants = {harness::Mutant::none};
  mutants.insert(mutants.end(), std::begin(harness::kAllMutants), std::end(harness::kAllMutants));
  if (!o.check.mutant.empty()) mutants = {*harness::parse_mutant(o.check.mutant)};  // checked in run_explore
  std::map<std::string, std::int32_t> verdicts;
  for (std::int32_t cp = 1; cp <= std::min(4, o.cp_max); ++cp) {
    for (const properties::ExploreShape& shape : properties::exploration_shapes(cp)) {
      if (!o.check.selected(cp, shape.name)) continue;
      for (harness::Mutant mutant : mutants) {
        if (!run.take()) continue;
        properties::ExploreOptions options = with_cli(properties::options_for(shape, layers, mutant), o);
        options.collect_all = true;
        options.bitstate_log2 = 0;
        const properties::Symmetry symmetry = options.symmetry;
        options.reduction = properties::Reduction::none;
        options.symmetry = properties::Symmetry::none;
        const properties::ExploreResult full = properties::explore(options);
        options.reduction = properties::Reduction::partial_order;
        const properties::ExploreResult reduced = properties::explore(options);
        options.symmetry = symmetry;
        const properties::ExploreResult symmetric = symmetry == properties::Symmetry::none ? properties::ExploreResult{} : properties::explore(options);
        const std::string verdict = symmetry_verdict(compare_verdict(full, reduced), full, reduced, symmetric);
        const bool agree = verdict == "agree";
        ++verdicts[verdict.substr(0, verdict.find(' '))];
        const std::string line = fmt::format("{:<21} {:>3} {:<26} {:>10} {:>10} {:>10} {:>8}  {}", shape.name, cp, harness::to_string(mutant), full.states, reduced.states,
                                             symmetric.symmetric_ranks ? fmt::format("{}", symmetric.states) : "-", full.findings.size(), verdict);
        fmt::print("{}\n", line);
        run.add(explore_row(header, fmt::format("{} cp {} {}", shape.name, cp, harness::to_string(mutant)), reduced, agree, line, ""));
        std::fflush(stdout);
      }
    }
  }
  fmt::print("reduced against full: {} agree, {} differ, {} incomplete\n", verdicts["agree"], verdicts["DIFFER"], verdicts["INCOMPLETE"]);
  return verdicts["DIFFER"] == 0 && verdicts["INCOMPLETE"] == 0;
}

// The grid: the exploration batch for cp 1..cp_max x layers 1..layers_max, then three planted bugs.
bool explore_grid(const ExploreCliOptions& o, ShardedRun& run, model::Variant variant) {
  const std::string header = fmt::format("{:>3} {:>7} {:<20} {:>10} {:>12} {:>9} {:>9}  {}", "cp", "layers", "mutant", "states", "transitions", "cpu s", "states/s", "result");
  fmt::print("{}\n", header);
  bool ok = true;
  const auto report = [&](std::int32_t cp, std::int32_t layers, harness::Mutant mutant) {
    if (!run.take()) return;
    properties::ExploreOptions options;
    options.setting = properties::exploration_setting(cp);
    options.batches = {properties::exploration_batch()};
    options.variant = variant;
    options.layers = layers;
    options.mutant = mutant;
    options = with_cli(options, o);
    const properties::ExploreResult r = properties::explore(options);
    const bool expected = mutant == harness::Mutant::none ? proved(r) : r.found;
    ok = ok && expected;
    const std::string line = fmt::format("{:>3} {:>7} {:<20} {:>10} {:>12} {:>9.2f} {:>9.0f}  {}", cp, layers, harness::to_string(mutant), r.states, r.transitions, r.seconds,
                                         r.states_per_second(), outcome(r));
    const ExploreCounterexample kept = keep_explore_counterexample(options, r, fmt::format("explore-cp{}-layers{}-{}", cp, layers, harness::to_string(mutant)));
    fmt::print("{}\n{}", line, counterexample_lines(kept));
    run.add(explore_row(header, fmt::format("cp {} layers {} {}", cp, layers, harness::to_string(mutant)), r, expected, line, kept.replay));
    std::fflush(stdout);
  };
  for (std::int32_t cp = 1; cp <= o.cp_max; ++cp) {
    for (std::int32_t layers = 1; layers <= o.layers_max; ++layers) report(cp, layers, harness::Mutant::none);
  }
  // The planted bugs show the search can find each: at cp 2 and at least 2 layers whatever the
  // grid's bounds, as single_half shows only when a second layer reuses a half (at one layer every
  // interleaving is proved and the row was a miss, exit 1); the row prints the layers it ran.
  for (harness::Mutant mutant : {harness::Mutant::single_half, harness::Mutant::no_barrier, harness::Mutant::arrive_before_fill}) {
    report(2, std::max(2, std::min(3, o.layers_max)), mutant);
  }
  return ok;
}

void run_explore(const ExploreCliOptions& o) {
  const auto variant = model::parse_variant(o.variant);
  if (!variant) throw OptionError(fmt::format("--variant: unknown variant '{}'", o.variant));
  if (o.bitstate > 0 && o.bitstate < 10) throw OptionError(fmt::format("--bitstate: {} is below 10 (0: off, else 10..36)", o.bitstate));
  if (!o.check.shape.empty()) {
    std::vector<std::string> names;
    for (const properties::ExploreShape& s : properties::exploration_shapes(1)) names.push_back(s.name);
    if (std::find(names.begin(), names.end(), o.check.shape) == names.end()) {
      throw OptionError(fmt::format("--check-shape: unknown shape '{}' (one of {})", o.check.shape, fmt::join(names, ", ")));
    }
  }
  if (!o.check.mutant.empty()) {
    const auto m = harness::parse_mutant(o.check.mutant);
    if (!m || (*m != harness::Mutant::none && std::find(std::begin(harness::kAllMutants), std::end(harness::kAllMutants), *m) == std::end(harness::kAllMutants))) {
      throw OptionError(fmt::format("--check-mutant: unknown planted bug '{}' (none or one of the simulator's)", o.check.mutant));
    }
  }
  const std::int32_t layers = std::min(o.shape_layers, o.layers_max);
  ShardedRun run = sharded_run("explore", o.shard, explore_units(o.cp_max, o.layers_max, o.shapes, o.check_reduction, o.check),
                               {{"cp_max", o.cp_max}, {"layers_max", o.layers_max}, {"variant", o.variant}, {"shapes", o.shapes},
                                {"shape_layers", o.shape_layers}, {"seconds_max", o.seconds_max}, {"reduction", o.reduction}, {"symmetry", o.symmetry},
                                {"bitstate", o.bitstate}, {"check_reduction", o.check_reduction},
                                {"check_cp", o.check.cp}, {"check_shape", o.check.shape}, {"check_mutant", o.check.mutant}});
  RunOutputs outputs = open_run_outputs(o.outputs);
  fmt::print("cpkv explore: the interleavings of the rank step machines | visited set of 128-bit full-state fingerprints{} | reduction {} | "
             "variant {} | batch: (prefix 2 extend 3) (extend 2), page 2, kv_fp8 + indexer_k, layers FSFS\n",
             o.bitstate > 0 ? fmt::format(" (bitstate, 2^{} bits)", o.bitstate) : "", o.reduction, o.variant);
  if (!run.header().empty()) fmt::print("{}\n", run.header().substr(3));
  bool ok = explore_grid(o, run, *variant);
  if (o.shapes) {
    ok = prove_shapes(o, run, layers) && ok;
    ok = hunt_bugs(o, run, layers) && ok;
  }
  if (o.check_reduction) ok = check_reduction(o, run, std::min(layers, 2)) && ok;
  exit_status() = ok ? kExitOk : kExitFailure;
  outputs.write([&] { return sharded_json(run); }, [&] { return sharded_junit(run); });
}

}  // namespace

void register_explore(CLI::App& app) {
  auto o = std::make_shared<ExploreCliOptions>();
  CLI::App* cmd = app.add_subcommand("explore",
                                     "Explore the interleavings of the rank step machines for small settings (cp 1..N, layers 1..M) over a visited "
                                     "set of full-state fingerprints, independent steps in one order (partial-order reduction): proves parity-half "
                                     "reuse safety and barrier phase safety for them, and finds the single_half, no_barrier and arrive_before_fill "
                                     "counterexamples; then proves every shape (the barrier variants, the token-split variants, an idle rank, overflow "
                                     "then normal, two batches, every rank writing, the capability fallback) for cp 1..N and hunts every planted bug "
                                     "over them; states equal up to a permutation of the idle ranks are one.");
  cmd->add_option("--cp-max", o->cp_max, "largest group explored")->capture_default_str()->check(whole_in<std::int32_t>(1, 8));
  cmd->add_option("--layers-max", o->layers_max, "most layers explored (the planted bugs' rows run at 2 or 3)")->capture_default_str()->check(whole_in<std::int32_t>(1, 4));
  cmd->add_option("--variant", o->variant, "exchange variant")->capture_default_str();
  cmd->add_option("--seconds-max", o->seconds_max, "CPU-time limit per exploration (seconds of the exploring thread, so a loaded machine gives the same verdicts)")->capture_default_str()->check(finite_in(0, option_limits::explore_seconds_max, /*low_open=*/true));
  cmd->add_option("--shape-layers", o->shape_layers, "layers of the shapes table")->capture_default_str()->check(whole_in<std::int32_t>(1, 4));
  cmd->add_option("--reduction", o->reduction, "partial-order (persistent and sleep sets) or none (every interleaving)")
      ->capture_default_str()
      ->check(CLI::IsMember({"partial-order", "none"}));
  cmd->add_option("--symmetry", o->symmetry, "idle-ranks (states equal up to a permutation of the idle ranks are one) or none")
      ->capture_default_str()
      ->check(CLI::IsMember({"idle-ranks", "none"}));
  cmd->add_option("--bitstate", o->bitstate, "LOG2: bitstate hashing over 2^LOG2 bits (partial coverage, stated) instead of the exhaustive table; 0: off")
      ->capture_default_str()
      ->check(whole_in<std::int32_t>(0, 36));
  cmd->add_flag("--check-reduction", o->check_reduction, "also compare the reduced and the full search (every violation and deadlock) on every shape of cp 1..min(4, N)");
  cmd->add_option("--check-cp", o->check.cp, "with --check-reduction: compare at this cp only (0: every cp)")->capture_default_str()->check(whole_in<std::int32_t>(0, 4));
  cmd->add_option("--check-shape", o->check.shape, "with --check-reduction: compare this shape only (a name of the shapes table)");
  cmd->add_option("--check-mutant", o->check.mutant, "with --check-reduction: compare for this planted bug only (or none: the correct protocol)");
  cmd->add_flag("!--no-shapes", o->shapes, "leave out the shapes table and the planted-bug hunt over the shapes");
  cmd->add_option("--shard", o->shard, "K/N: run only the explorations i (0-based, in the order the tables print them) with i % N == K - 1");
  add_run_output_options(*cmd, o->outputs, "each exploration's row", "exploration");
  cmd->callback([o] { run_explore(*o); });
}

}  // namespace cpkv::cli

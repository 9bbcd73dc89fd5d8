// cpkv soak: the property suite with fresh seeds until the time (or the seed count) is up; its seeds
// shard over machines (--shard K/N, cli/shard_rows.hpp, docs/sharding.md).
#include <chrono>
#include <cstdio>
#include <memory>

#include <fmt/format.h>

#include "commands.hpp"
#include "options.hpp"
#include "rc_params.hpp"
#include "run_outputs.hpp"
#include "shard_rows.hpp"
#include "cpkv/model/content.hpp"
#include "cpkv/properties/mutation.hpp"
#include "cpkv/properties/properties.hpp"

namespace cpkv::cli {
namespace {

struct SoakOptions {
  double minutes = 1.0;
  std::uint64_t seed = 0;  // 0: drawn from the clock and printed (the one non-replayable choice)
  int cases = 100;
  std::optional<std::size_t> seeds;  // stop after this many seeds (the whole run's, over every shard)
  std::optional<std::string> shard;
  RunOutputOptions outputs;  // --json, --junit, --out
};

// One seed through every property (stopping at the first that fails): its row.
nlohmann::json soak_seed(std::uint64_t seed, int cases) {
  rc::detail::TestParams params = properties::suite_params();
  params.seed = seed;
  params.maxSuccess = cases;
  const auto start = std::chrono::steady_clock::now();
  nlohmann::json row = {{"section", "seeds"}, {"name", fmt::format("seed {}", seed)}, {"seed", seed}, {"passed", true}};
  for (const properties::Property& property : properties::all_properties()) {
    const properties::PropertyOutcome outcome = properties::check_property(property, harness::Mutant::none, params);
    if (outcome.passed) continue;
    std::string replay;
    try {
      replay = properties::last_counterexample_replay();
    } catch (const std::runtime_error& e) {
      replay = fmt::format("none ({})", e.what());
    }
    row["passed"] = false;
    row["failure"] = fmt::format("{} failed (invariant {})", property.name, outcome.invariant);
    row["replay"] = replay;
    row["text"] = fmt::format("FAILED {} with seed {}:\n{}\n  reproduce: RC_PARAMS=\"seed={}\" build/tests/cpkv.tests.properties\n  replay: {}", property.name,
                              seed, outcome.message, seed, replay.empty() ? "none recorded" : replay);
    break;
  }
  if (row.at("passed").get<bool>()) row["text"] = fmt::format("seed {}: {} properties passed", seed, properties::all_properties().size());
  row["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return row;
}

void run_soak(const SoakOptions& o) {
  check_rc_params();
  if (o.shard && o.seed == 0) throw OptionError("--shard: needs --seed (every shard must draw the same seeds from one master seed)");
  // The master seed is the one random choice of a soak; every property seed derives from it.
  const std::uint64_t master = o.seed != 0 ? o.seed : static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  ShardedRun run = sharded_run("soak", o.shard, o.seeds, {{"seed", master}, {"cases", o.cases}});
  RunOutputs outputs = open_run_outputs(o.outputs);
  const std::string& out = outputs.out;
  const std::string count = o.seeds ? fmt::format(" | {} seeds at most", *o.seeds) : "";
  fmt::print("cpkv soak: {} minutes | master seed {} | {} cases per property and seed{}{}\n", o.minutes, master, o.cases, count, run.header());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double, std::ratio<60>>(o.minutes);
  std::uint64_t state = master;
  while (std::chrono::steady_clock::now() < deadline && (!o.seeds || run.next < *o.seeds)) {
    state = model::mix64(state);  // every shard draws every seed, and runs its own
    if (!run.take()) continue;
    fmt::print("seed {} ...\n", state);
    std::fflush(stdout);
    if (!out.empty()) properties::set_counterexample_folder(out, fmt::format("seed-{}-", state));
    run.add(soak_seed(state, o.cases));
    if (!run.rows.back().at("passed").get<bool>()) fmt::print("{}\n", run.rows.back().at("text").get<std::string>());
  }
  std::size_t failed = 0;
  for (const nlohmann::json& row : run.rows) failed += row.at("passed").get<bool>() ? 0 : 1;
  if (failed == 0) fmt::print("soak passed: {} seeds x {} properties\n", run.rows.size(), properties::all_properties().size());
  else fmt::print("soak FAILED: {} of {} seeds failed\n", failed, run.rows.size());
  exit_status() = failed == 0 ? kExitOk : kExitFailure;
  outputs.write([&] { return sharded_json(run); }, [&] { return sharded_junit(run); });
}

}  // namespace

void register_soak(CLI::App& app) {
  auto o = std::make_shared<SoakOptions>();
  CLI::App* cmd = app.add_subcommand("soak", "Run the property suite with fresh seeds until the time is up, printing each seed before it starts.");
  cmd->add_option("--minutes", o->minutes, "how long to run")->capture_default_str()->check(finite_in(0, option_limits::soak_minutes_max, /*low_open=*/true));
  cmd->add_option("--seed", o->seed, "master seed (default: drawn and printed)")->check(seed_value());
  cmd->add_option("--cases", o->cases, "cases per property and seed")->capture_default_str()
      ->check(whole_in<int>(1, static_cast<int>(option_limits::repetitions_max)));
  cmd->add_option("--seeds", o->seeds, "stop after this many seeds of the run (every shard's together), or when the time is up")
      ->check(whole_in<std::size_t>(1, static_cast<std::size_t>(option_limits::repetitions_max)));
  cmd->add_option("--shard", o->shard,
                  "K/N: run only the seeds i (0-based, in the order the master seed draws them) with i % N == K - 1; needs --seed");
  add_run_output_options(*cmd, o->outputs, "each seed's row", "seed");
  cmd->callback([o] { run_soak(*o); });
}

}  // namespace cpkv::cli

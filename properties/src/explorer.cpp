#include "cpkv/properties/explorer.hpp"

#include <chrono>
#include <cstring>
#include <unordered_set>

#include <fmt/format.h>

#include "cpkv/sim/machine.hpp"
#include "cpkv/sim/runner.hpp"
#include "cpkv/sim/world.hpp"

namespace cpkv::properties {

namespace {

struct Explorer {
  const ExploreOptions& options;
  sim::World& world;
  std::vector<sim::RankMachine> machines;
  std::unordered_set<std::string> visited;
  std::vector<std::uint32_t> path;
  ExploreResult result;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  bool stop = false;

  std::string key() const {
    std::string k;
    for (const sim::RankMachine& m : machines) {
      const std::uint64_t pc = m.steps_taken();
      k.append(reinterpret_cast<const char*>(&pc), sizeof(pc));
    }
    return k;
  }

  struct Snapshot {
    std::vector<std::uint8_t> memory;
    std::vector<sim::RankMachine> machines;
  };
  Snapshot save() const {
    return Snapshot{std::vector<std::uint8_t>(world.region().base(), world.region().base() + world.region().size()), machines};
  }
  void restore(const Snapshot& s) {
    std::memcpy(world.region().base(), s.memory.data(), s.memory.size());
    machines.clear();
    machines.insert(machines.end(), s.machines.begin(), s.machines.end());
  }

  void visit() {
    if (stop) return;
    // A violation is found on the transition that made it, so it is checked before the visited-set
    // pruning: a path into an already visited state still has its last step checked.
    if (world.violation_count() > 0) {
      const auto violations = world.violations();
      result.found = true;
      result.finding = sim::describe(violations.front());
      result.schedule = path;
      stop = true;
      return;
    }
    if (!visited.insert(key()).second) return;
    ++result.states;
    if (result.states >= options.states_max ||
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > options.seconds_max) {
      stop = true;
      return;
    }
    std::vector<std::uint32_t> runnable;
    bool all_finished = true;
    for (std::uint32_t r = 0; r < machines.size(); ++r) {
      if (!machines[r].finished()) all_finished = false;
      if (machines[r].runnable()) runnable.push_back(r);
    }
    if (all_finished) return;
    if (runnable.empty()) {
      std::string positions;
      for (const sim::RankMachine& m : machines) positions += (positions.empty() ? "" : "; ") + m.describe_position();
      result.found = true;
      result.finding = fmt::format("invariant 8 (liveness): deadlock: {}", positions);
      result.schedule = path;
      stop = true;
      return;
    }
    if (runnable.size() == 1) {  // no choice: no snapshot needed
      machines[runnable[0]].step();
      ++result.transitions;
      path.push_back(0);
      visit();
      path.pop_back();
      return;
    }
    const Snapshot here = save();
    for (std::uint32_t choice = 0; choice < runnable.size() && !stop; ++choice) {
      if (choice > 0) restore(here);
      machines[runnable[choice]].step();
      ++result.transitions;
      path.push_back(choice);
      visit();
      path.pop_back();
    }
  }
};

// Runs every machine to the end of its current program, always choosing the first runnable rank
// (choice 0), and records the choices so the replay schedule reproduces them.
bool run_prologue(std::vector<sim::RankMachine>& machines, std::vector<std::uint32_t>& path) {
  while (true) {
    bool all_finished = true;
    bool stepped = false;
    for (sim::RankMachine& m : machines) {
      if (m.finished()) continue;
      all_finished = false;
      if (!m.runnable()) continue;
      m.step();
      path.push_back(0);
      stepped = true;
      break;
    }
    if (all_finished) return true;
    if (!stepped) return false;
  }
}

}  // namespace

model::Setting exploration_setting(std::int32_t cp) {
  model::Setting s;
  s.cp = cp;
  s.page_size = 2;
  s.kinds = {*model::find_buffer_kind("kv_fp8"), *model::find_buffer_kind("indexer_k")};
  s.layer_pattern = "FSFS";
  s.pool_pages = 8;
  s.caps.max_total_extend_tokens = 16;
  s.caps.max_batch_requests = 4;
  return s;
}

model::Batch exploration_batch() {
  model::Batch b;
  b.requests.push_back({2, 3, {5}});  // one prefix page, a full and a partial current page
  b.requests.push_back({0, 2, {}});   // one page-exact current page
  return b;
}

ExploreResult explore(const ExploreOptions& options) {
  const sim::BatchSource source = sim::BatchSource::from_batches(options.setting, {options.batch});
  const sim::SourceShape shape = sim::measure(source);
  sim::SimOptions sim_options;
  sim_options.variant = options.variant;
  sim_options.layers = options.layers;
  sim_options.mutant = options.mutant;
  sim::World world(sim::geometry_for(options.setting, options.layers, shape.slot_count_max, shape.current_pages_max), sim_options.seed);
  Explorer explorer{options, world, {}, {}, {}, {}};
  for (std::int32_t r = 0; r < options.setting.cp; ++r) explorer.machines.emplace_back(world, options.setting, sim_options, r);
  for (sim::RankMachine& m : explorer.machines) m.begin_run();
  if (!run_prologue(explorer.machines, explorer.path)) {
    explorer.result.found = true;
    explorer.result.finding = "deadlock in the capability probe";
    return explorer.result;
  }
  for (sim::RankMachine& m : explorer.machines) m.begin_batch(options.batch, 0);
  explorer.visit();
  explorer.result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - explorer.start).count();
  explorer.result.complete = !explorer.stop;
  return explorer.result;
}

}  // namespace cpkv::properties

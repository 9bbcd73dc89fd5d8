#include "cpkv/properties/explorer.hpp"

#include <chrono>
#include <cstring>
#include <stdexcept>
#include <unordered_set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cpkv/sim/checkers.hpp"
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

  // As the scheduled runner does: once every rank finished a batch, every rank begins the next. The
  // batch each rank is on is a function of its steps taken, so the state key still covers it.
  void begin_next_batch_if_done() {
    for (const sim::RankMachine& m : machines) {
      if (!m.finished()) return;
    }
    const std::int64_t next = machines.front().batch_index() + 1;
    if (next >= static_cast<std::int64_t>(options.batches.size())) return;
    for (sim::RankMachine& m : machines) m.begin_batch(options.batches[static_cast<std::size_t>(next)], next);
  }

  // The group has stopped: every rank finished its program and no batch is left to begin.
  bool at_end() const {
    for (const sim::RankMachine& m : machines) {
      if (!m.finished()) return false;
    }
    return machines.front().batch_index() + 1 >= static_cast<std::int64_t>(options.batches.size());
  }

  void visit() {
    if (stop) return;
    // A violation is found on the transition that made it, so it is checked before the visited-set
    // pruning: a path into an already visited state still has its last step checked. So is
    // quiescence, on every path that reaches the end: the end's program-counter vector is the same
    // for every interleaving, the flags each one left behind need not be.
    if (at_end()) sim::on_quiescence(world);
    if (world.violation_count() > 0) {
      const auto violations = world.violations();
      result.found = true;
      result.finding = harness::describe(violations.front());
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
    begin_next_batch_if_done();
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
  const harness::BatchSource source = harness::BatchSource::from_batches(options.setting, options.batches);
  const harness::SourceShape shape = harness::measure(source);
  harness::RunOptions sim_options;
  sim_options.variant = options.variant;
  sim_options.layers = options.layers;
  sim_options.mutant = options.mutant;
  sim_options.ipc_missing_rank = options.ipc_missing_rank;
  sim::World world(sim::geometry_for(options.setting, options.layers, shape.slot_count_max, shape.current_pages_max), sim_options.seed);
  Explorer explorer{options, world, {}, {}, {}, {}};
  for (std::int32_t r = 0; r < options.setting.cp; ++r) explorer.machines.emplace_back(world, options.setting, sim_options, r);
  for (sim::RankMachine& m : explorer.machines) m.begin_run();
  if (!run_prologue(explorer.machines, explorer.path)) {
    explorer.result.found = true;
    explorer.result.finding = "deadlock in the capability probe";
    return explorer.result;
  }
  if (options.batches.empty()) throw std::invalid_argument("explore: no batch to explore");
  for (sim::RankMachine& m : explorer.machines) m.begin_batch(options.batches.front(), 0);
  explorer.visit();
  explorer.result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - explorer.start).count();
  explorer.result.complete = !explorer.stop;
  return explorer.result;
}

namespace {
model::Batch one_request(std::int64_t prefix_len, std::int64_t extend_len, std::vector<std::int64_t> pages) {
  model::Batch b;
  b.requests.push_back({prefix_len, extend_len, std::move(pages)});
  return b;
}

ExploreShape shape(std::string name, std::int32_t cp, std::vector<model::Batch> batches, model::Variant variant) {
  ExploreShape s;
  s.name = std::move(name);
  s.setting = exploration_setting(cp);
  s.batches = std::move(batches);
  s.variant = variant;
  return s;
}
}  // namespace

std::string ExploreShape::describe() const {
  std::vector<std::string> text;
  for (const model::Batch& b : batches) {
    std::string one;
    for (const model::Request& r : b.requests) one += fmt::format("{}(prefix {} extend {})", one.empty() ? "" : " ", r.prefix_len, r.extend_len);
    text.push_back("[" + one + "]");
  }
  return fmt::format("{}", fmt::join(text, " then "));
}

std::vector<ExploreShape> exploration_shapes(std::int32_t cp) {
  std::vector<ExploreShape> shapes;
  for (model::Variant v : model::barrier_variants()) {
    shapes.push_back(shape(std::string(model::to_string(v)), cp, {exploration_batch()}, v));
  }
  // One current page: rank 0 writes it, every other rank has nothing to write but must still take
  // part in the barrier (section 4) and still reads rank 0's page.
  shapes.push_back(shape("idle_rank", cp, {one_request(2, 2, {5})}, model::Variant::staging_direct));
  // Caps of 4 tokens and 1 request: staging_slots = ceil(4 / 2) + 1 = 3. Four current pages overflow
  // (every rank must reject the batch without a write or a wait); the next batch (2 pages) must run.
  ExploreShape overflow = shape("overflow_then_normal", cp, {one_request(0, 8, {}), one_request(2, 3, {5})}, model::Variant::staging_direct);
  overflow.setting.caps.max_total_extend_tokens = 4;
  overflow.setting.caps.max_batch_requests = 1;
  shapes.push_back(overflow);
  // Two batches of different shapes in the same buffers: the plan must be rebuilt for the second.
  shapes.push_back(shape("two_batches", cp, {exploration_batch(), one_request(2, 4, {3})}, model::Variant::staging_direct));
  // The last rank's IPC probe fails: the group agrees on the fallback (all-reduce, no barrier).
  ExploreShape fallback = shape("capability_fallback", cp, {exploration_batch()}, model::Variant::staging_direct);
  fallback.ipc_missing_rank = cp - 1;
  shapes.push_back(fallback);
  return shapes;
}

ExploreOptions options_for(const ExploreShape& shape, std::int32_t layers, harness::Mutant mutant) {
  ExploreOptions options;
  options.setting = shape.setting;
  options.batches = shape.batches;
  options.variant = shape.variant;
  options.ipc_missing_rank = shape.ipc_missing_rank;
  options.layers = layers;
  options.mutant = mutant;
  return options;
}

}  // namespace cpkv::properties

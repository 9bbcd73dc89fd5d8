#include "cpkv/properties/explorer.hpp"

#include <chrono>
#include <ctime>
#include <cstring>
#include <stdexcept>
#include <algorithm>
#include <bit>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cpkv/model/content.hpp"
#include "cpkv/properties/footprint.hpp"
#include "cpkv/sim/checkers.hpp"
#include "cpkv/sim/machine.hpp"
#include "cpkv/sim/runner.hpp"
#include "cpkv/sim/world.hpp"
#include "state_hash.hpp"

namespace cpkv::properties {

namespace {

using detail::Fingerprint;

std::uint8_t bit(std::uint32_t r) { return static_cast<std::uint8_t>(1u << r); }

// The CPU time of the exploring thread: the limit and the reported seconds, so that a loaded
// machine (other builds sharing the cores) gives the same verdicts and rates as an idle one.
double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// Where a rank's future, as far as a sequence of other ranks' steps can take it, must stop: a wait
// on a counter of some rank of the persistent set still below what the wait needs (a rank in the
// set takes no step in such a sequence, so the counter stays put). `before`: the footprint of the
// rank's steps from its program counter up to that wait.
enum CounterKind : std::int32_t { kBarrier = 0, kCollective = 1, kBatch = 2 };
struct Cut {
  std::int32_t kind = kBarrier;
  std::int64_t need = 0;
  Footprint before;
};
struct Horizon {
  std::vector<Cut> cuts;
  Footprint all;  // the whole rest of the program, when no cut stops it
};

bool same(const Footprint& a, const Footprint& b) {
  return a.top == b.top && a.reads.bits == b.reads.bits && a.writes.bits == b.writes.bits && a.ors.bits == b.ors.bits && a.adds.bits == b.adds.bits;
}
bool same(const Horizon& a, const Horizon& b) {
  if (a.cuts.size() != b.cuts.size() || !same(a.all, b.all)) return false;
  for (std::size_t i = 0; i < a.cuts.size(); ++i) {
    if (a.cuts[i].kind != b.cuts[i].kind || a.cuts[i].need != b.cuts[i].need || !same(a.cuts[i].before, b.cuts[i].before)) return false;
  }
  return true;
}

struct Explorer {
  const ExploreOptions& options;
  sim::World& world;
  std::vector<sim::RankMachine> machines;
  Footprints footprints;
  detail::RegionHash hash;
  sim::MutantPolicy mutant;
  detail::VisitedTable table;
  std::optional<detail::BitState> bits;
  std::vector<std::uint32_t> path;
  ExploreResult result;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  double cpu_start = thread_cpu_seconds();
  bool stop = false;
  bool limit = false;
  std::vector<sim::RankMachine> machine_undo;
  std::vector<std::uint32_t> objects;
  // Per rank, for its current program: each step's footprint, and the horizon from each program
  // counter (a function of the program, the counter and the rank's counters there, which are
  // kept to check it: a horizon is built once per program position, not once per state).
  struct CachedHorizon {
    bool built = false;
    std::uint64_t barriers = 0, collectives = 0, batches = 0;
    Horizon horizon;
  };
  struct FootprintCache {
    std::int64_t batch = -2;
    std::size_t size = 0;
    std::vector<Footprint> steps;
    std::vector<CachedHorizon> horizons;
  };
  std::vector<FootprintCache> cache;
  std::vector<const Horizon*> horizons;
  Horizon finished_horizon;

  Explorer(const ExploreOptions& o, sim::World& w)
      : options(o),
        world(w),
        footprints(o.setting.cp, o.layers, w.current_capacity(), o.mutant),
        hash(w),
        mutant(o.mutant),
        cache(static_cast<std::size_t>(o.setting.cp)),
        horizons(static_cast<std::size_t>(o.setting.cp)) {
    if (o.bitstate_log2 > 0) bits.emplace(o.bitstate_log2);
  }

  bool reduced() const { return options.reduction == Reduction::partial_order; }

  const Footprint& footprint(std::uint32_t r, std::size_t index) {
    const sim::RankMachine& m = machines[r];
    FootprintCache& c = cache[r];
    if (c.batch != m.batch_index() || c.size != m.program().size()) {
      c.batch = m.batch_index();
      c.size = m.program().size();
      c.steps.clear();
      for (const sim::Step& s : m.program()) c.steps.push_back(footprints.of(m, s));
      c.horizons.assign(c.size + 1, CachedHorizon{});
    }
    return c.steps[index];
  }
  const Footprint& next_footprint(std::uint32_t r) { return footprint(r, machines[r].pc()); }

  Fingerprint key() const {
    Fingerprint f = options.key == StateKey::full_state ? hash.value() : Fingerprint{};
    for (std::uint32_t r = 0; r < machines.size(); ++r) {
      const std::uint64_t steps = machines[r].steps_taken();
      const auto batch = static_cast<std::uint64_t>(machines[r].batch_index() + 1);
      f.a += model::mix64((std::uint64_t{r} << 56) ^ (batch << 40) ^ steps);
      f.b += model::mix64(model::mix64(steps + 0x51ed27ULL * (r + 1)) ^ batch);
    }
    return f;
  }

  std::uint64_t counter(std::uint32_t r, std::int32_t kind) const {
    const sim::RankMachine& m = machines[r];
    return kind == kBarrier ? m.barriers_arrived() : kind == kCollective ? m.collectives_arrived() : m.batches_arrived();
  }
  bool blocked_by(std::uint8_t set, std::int32_t kind, std::int64_t need) const {
    for (std::uint32_t c = 0; c < machines.size(); ++c) {
      if ((set & bit(c)) && static_cast<std::int64_t>(counter(c, kind)) < need) return true;
    }
    return false;
  }

  void build_horizon(std::uint32_t b, Horizon& h);
  void take_horizon(std::uint32_t b);
  const Footprint& horizon(std::uint32_t b, std::uint8_t set) const {
    for (const Cut& cut : horizons[b]->cuts) {
      if (blocked_by(set, cut.kind, cut.need)) return cut.before;
    }
    return horizons[b]->all;
  }
  std::uint8_t closure(std::uint32_t seed, std::uint8_t enabled, std::uint8_t unfinished);
  std::uint8_t persistent(std::uint8_t enabled, std::uint8_t unfinished);

  std::size_t step(std::uint32_t r);
  void undo(std::uint32_t r, std::size_t mark);
  void verify_step(std::uint32_t r, const std::vector<std::uint8_t>& before, const Footprint& f);
  bool found_violation();
  bool at_end() const;
  void visit(std::uint8_t sleep);
  void visit_state(std::uint8_t sleep);
  void explore_from(std::uint8_t todo, std::uint8_t sleep, std::uint8_t enabled);
  bool over_limits();
};

// The horizon of rank b at its program counter: built the first time the rank stands there with
// these counters, then reused (Explorer.HorizonCache... : the cached and the rebuilt one agree).
void Explorer::take_horizon(std::uint32_t b) {
  const sim::RankMachine& m = machines[b];
  if (m.finished()) {
    horizons[b] = &finished_horizon;
    return;
  }
  footprint(b, m.pc());  // (re)builds the rank's cache for its current program
  CachedHorizon& c = cache[b].horizons[m.pc()];
  if (!c.built || c.barriers != m.barriers_arrived() || c.collectives != m.collectives_arrived() || c.batches != m.batches_arrived()) {
    build_horizon(b, c.horizon);
    c = {true, m.barriers_arrived(), m.collectives_arrived(), m.batches_arrived(), std::move(c.horizon)};
  }
  horizons[b] = &c.horizon;
  if (options.verify_footprints) {
    Horizon fresh;
    build_horizon(b, fresh);
    if (!same(fresh, c.horizon)) throw std::logic_error(fmt::format("explore: rank {}'s cached horizon at step {} differs from the one rebuilt", b, m.pc()));
  }
}

void Explorer::build_horizon(std::uint32_t b, Horizon& h) {
  h.cuts.clear();
  h.all = Footprint{};
  const sim::RankMachine& m = machines[b];
  if (m.finished()) return;
  std::int64_t barriers = static_cast<std::int64_t>(m.barriers_arrived());
  std::int64_t collectives = static_cast<std::int64_t>(m.collectives_arrived());
  std::int64_t batches = static_cast<std::int64_t>(m.batches_arrived());
  Footprint acc;
  const std::vector<sim::Step>& program = m.program();
  for (std::size_t k = m.pc(); k < program.size(); ++k) {
    const sim::Op op = program[k].op;
    if (op == sim::Op::wait && !mutant.uses_reset_barrier()) h.cuts.push_back({kBarrier, barriers - static_cast<std::int64_t>(mutant.barrier_phase_lag()), acc});
    if (op == sim::Op::coll_wait) h.cuts.push_back({kCollective, collectives, acc});
    if (op == sim::Op::batch_wait) h.cuts.push_back({kBatch, batches, acc});
    acc |= footprint(b, k);
    if (op == sim::Op::arrive) ++barriers;
    if (op == sim::Op::coll_arrive) ++collectives;
    if (op == sim::Op::batch_arrive) ++batches;
    if (op == sim::Op::batch_begin) {
      // The program past it is built by it: its batch arrival and wait come first (machine.cpp
      // build_batch_program); past that wait, anything.
      acc.writes.add(footprints.rank_location(static_cast<std::int32_t>(b), Footprints::batch));
      h.cuts.push_back({kBatch, batches + 1, acc});
      acc.top = true;
    }
  }
  h.all = acc;
}

// A persistent set from `seed`: ranks are added until no step of a rank outside the set, in any
// sequence of outside steps, can touch what an enabled step inside reads or writes, and no outside
// step can enable a disabled step inside (docs/properties.md, "Partial-order reduction").
std::uint8_t Explorer::closure(std::uint32_t seed, std::uint8_t enabled, std::uint8_t unfinished) {
  std::uint8_t set = bit(seed);
  std::vector<std::uint32_t> work = {seed};
  while (!work.empty()) {
    const std::uint32_t a = work.back();
    work.pop_back();
    std::uint8_t add = 0;
    if (enabled & bit(a)) {
      const Footprint& f = next_footprint(a);
      for (std::uint32_t b = 0; b < machines.size(); ++b) {
        if ((set & bit(b)) || !(unfinished & bit(b))) continue;
        if (conflict(f, horizon(b, set))) add |= bit(b);
      }
    } else {
      // A wait: only the ranks whose counter is still short can let it pass.
      const sim::Step& s = *machines[a].next_step();
      const std::int32_t kind = s.op == sim::Op::wait ? kBarrier : s.op == sim::Op::coll_wait ? kCollective : kBatch;
      std::int64_t need = static_cast<std::int64_t>(counter(a, kind));
      if (kind == kBarrier) need -= static_cast<std::int64_t>(mutant.barrier_phase_lag());
      for (std::uint32_t b = 0; b < machines.size(); ++b) {
        if ((set & bit(b)) || !(unfinished & bit(b))) continue;
        if ((kind == kBarrier && mutant.uses_reset_barrier()) || static_cast<std::int64_t>(counter(b, kind)) < need) add |= bit(b);
      }
    }
    for (std::uint32_t b = 0; b < machines.size(); ++b) {
      if (add & bit(b)) work.push_back(b);
    }
    set |= add;
  }
  return set & enabled;
}

std::uint8_t Explorer::persistent(std::uint8_t enabled, std::uint8_t unfinished) {
  if (!reduced() || std::popcount(enabled) == 1) return enabled;
  for (std::uint32_t b = 0; b < machines.size(); ++b) take_horizon(b);
  std::uint8_t best = enabled;
  for (std::uint32_t seed = 0; seed < machines.size() && std::popcount(best) > 1; ++seed) {
    if (!(enabled & bit(seed))) continue;
    const std::uint8_t set = closure(seed, enabled, unfinished);
    if (std::popcount(set) < std::popcount(best)) best = set;
  }
  return best;
}

// Runs rank r's next step with its undo record: the machine as it was, and the bytes of the flag
// spans and of every object the step may write (all of them under a test hook or verification).
std::size_t Explorer::step(std::uint32_t r) {
  const std::size_t mark = hash.mark();
  const bool save_all = options.after_step || options.verify_footprints;
  for (std::size_t u = 0; u < hash.flag_units(); ++u) hash.save(u);
  if (save_all) {
    for (std::size_t u = hash.flag_units(); u < hash.units(); ++u) hash.save(u);
  } else {
    objects.clear();
    footprints.written_objects(machines[r], *machines[r].next_step(), objects);
    for (std::uint32_t o : objects) hash.save(hash.unit_of(o));
  }
  std::vector<std::uint8_t> before;
  const Footprint f = next_footprint(r);
  if (options.verify_footprints) before.assign(world.region().base(), world.region().base() + world.region().size());
  machine_undo.push_back(machines[r]);
  machines[r].step();
  if (options.after_step) options.after_step(world, machines, r);
  hash.fold_saved_since(mark);
  ++result.transitions;
  if (options.verify_footprints) verify_step(r, before, f);
  return mark;
}

void Explorer::undo(std::uint32_t r, std::size_t mark) {
  hash.undo_to(mark);
  machines[r] = std::move(machine_undo.back());
  machine_undo.pop_back();
  if (options.verify_footprints && !(hash.value() == hash.full())) throw std::logic_error("explore: the undo log left the state hash stale");
}

// verify_footprints: the step changed no object outside those written_objects names, nor a buffer
// its footprint does not write; the incremental hash equals the hash from scratch.
void Explorer::verify_step(std::uint32_t r, const std::vector<std::uint8_t>& before, const Footprint& f) {
  std::vector<std::uint32_t> named;
  footprints.written_objects(machine_undo.back(), *machine_undo.back().next_step(), named);
  const sim::Step& s = *machine_undo.back().next_step();
  for (std::int32_t p = 0; p < options.setting.cp; ++p) {
    const std::pair<sim::World::ByteSpan, std::int32_t> spans[] = {
        {world.staging_span(p), -1}, {world.dense_span(p, 0), Footprints::dense0}, {world.dense_span(p, 1), Footprints::dense1},
        {world.pool_span(p), Footprints::pool}, {world.compact_span(p), Footprints::compact}, {world.scratch_span(p), -2}};
    for (std::uint32_t o = 0; o < kObjectsPerRank; ++o) {
      const auto [span, location] = spans[o];
      if (std::memcmp(before.data() + span.offset, world.region().base() + span.offset, span.bytes) == 0) continue;
      const std::uint32_t id = static_cast<std::uint32_t>(p) * kObjectsPerRank + o;
      const bool in_objects = std::find(named.begin(), named.end(), id) != named.end();
      const bool in_footprint = location == -2   ? p == static_cast<std::int32_t>(r)
                                : location == -1 ? f.writes.has(footprints.rank_location(p, Footprints::staging0)) ||
                                                       f.writes.has(footprints.rank_location(p, Footprints::staging1))
                                : location == Footprints::dense0 ? footprints.writes_dense(f, p, 0)
                                : location == Footprints::dense1 ? footprints.writes_dense(f, p, 1)
                                                                 : f.writes.has(footprints.rank_location(p, location));
      if (!in_objects || !in_footprint) {
        throw std::logic_error(fmt::format("explore: rank {} step '{}' changed object {} of rank {} outside its footprint", r, sim::to_string(s), o, p));
      }
    }
  }
  // Dense writes by slot: each changed slot's location is written.
  for (std::int32_t p = 0; p < options.setting.cp; ++p) {
    for (std::int32_t half = 0; half < 2; ++half) {
      for (std::size_t k = 0; k < options.setting.kinds.size(); ++k) {
        const std::uint64_t page = world.geometry().page_bytes(k);
        for (std::int64_t slot = 0; slot < world.geometry().slot_count_max; ++slot) {
          const std::uint64_t at = static_cast<std::uint64_t>(world.dense_page(p, half, k, slot) - world.region().base());
          if (std::memcmp(before.data() + at, world.region().base() + at, page) == 0) continue;
          Footprint one;
          footprints.dense_slot(one.writes, p, half, slot);
          if (!one.writes.intersects(f.writes)) {
            throw std::logic_error(fmt::format("explore: rank {} step '{}' changed dense slot {} of rank {} half {} outside its footprint", r, sim::to_string(s), slot, p, half));
          }
        }
      }
    }
  }
  if (!(hash.value() == hash.full())) throw std::logic_error("explore: the incremental state hash differs from the hash from scratch");
}

// A violation recorded by the last step (or at quiescence): the first one ends the exploration,
// or, collecting, every one is kept and the records are cleared (they are no part of the state).
bool Explorer::found_violation() {
  if (world.violation_count() == 0) return false;
  const auto violations = world.violations();
  if (options.collect_all) {
    for (const harness::Violation& v : violations) result.findings.insert(harness::describe(v));
    const sim::World::ByteSpan records = world.record_span();
    std::memset(world.region().base() + records.offset, 0, records.bytes);
    return false;
  }
  result.found = true;
  result.finding = harness::describe(violations.front());
  result.schedule = path;
  stop = true;
  return true;
}

// The group has stopped: every rank finished its program and no batch is left to begin.
bool Explorer::at_end() const {
  for (const sim::RankMachine& m : machines) {
    if (!m.finished()) return false;
  }
  return machines.front().batch_index() + 1 >= static_cast<std::int64_t>(options.batches.size());
}

bool Explorer::over_limits() {
  if (result.states < options.states_max &&
      ((result.states & 255) != 0 || thread_cpu_seconds() - cpu_start <= options.seconds_max)) {
    return false;
  }
  stop = true;
  limit = true;
  return true;
}

// As the scheduled runner does: once every rank finished a batch, every rank begins the next (the
// batch each rank is on is in the state's key). Quiescence is checked on every path that reaches
// the end, before the visited-set pruning, as are the last step's violations.
void Explorer::visit(std::uint8_t sleep) {
  if (stop) return;
  if (at_end()) sim::on_quiescence(world);
  if (found_violation()) return;
  bool all_finished = true;
  for (const sim::RankMachine& m : machines) all_finished = all_finished && m.finished();
  const std::int64_t next = machines.front().batch_index() + 1;
  if (!all_finished || next >= static_cast<std::int64_t>(options.batches.size())) return visit_state(sleep);
  const std::vector<sim::RankMachine> saved = machines;
  for (sim::RankMachine& m : machines) m.begin_batch(options.batches[static_cast<std::size_t>(next)], next);
  visit_state(sleep);
  machines = saved;
}

void Explorer::visit_state(std::uint8_t sleep) {
  const Fingerprint f = key();
  std::uint8_t todo_mask = 0xFF;  // of the persistent set: all on a first visit
  if (bits) {
    if (!bits->insert(f)) return;
    ++result.states;
    sleep = 0;  // bitstate keeps no sleep sets
  } else {
    std::uint8_t* stored = nullptr;
    if (table.insert(f, sleep, stored)) {
      ++result.states;
    } else {
      // Visited with sleep set Z: what it left unexplored is Z; now only Z minus this sleep set.
      todo_mask = static_cast<std::uint8_t>(*stored & ~sleep);
      if (todo_mask == 0) return;
      *stored &= sleep;
    }
  }
  if (over_limits()) return;
  std::uint8_t enabled = 0;
  std::uint8_t unfinished = 0;
  for (std::uint32_t r = 0; r < machines.size(); ++r) {
    if (!machines[r].finished()) unfinished |= bit(r);
    if (machines[r].runnable()) enabled |= bit(r);
  }
  if (unfinished == 0) return;
  if (enabled == 0) {
    std::string positions;
    for (const sim::RankMachine& m : machines) positions += (positions.empty() ? "" : "; ") + m.describe_position();
    const std::string finding = fmt::format("invariant 8 (liveness): deadlock: {}", positions);
    if (options.collect_all) {
      result.findings.insert(finding);
      return;
    }
    result.found = true;
    result.finding = finding;
    result.schedule = path;
    stop = true;
    return;
  }
  const std::uint8_t todo = static_cast<std::uint8_t>(persistent(enabled, unfinished) & todo_mask & ~sleep);
  explore_from(todo, sleep, enabled);
}

// Each rank of `todo` in turn; a child's sleep set holds the ranks of (sleep, done before) whose
// next step is independent of the one taken (it is still next there, and was explored here).
void Explorer::explore_from(std::uint8_t todo, std::uint8_t sleep, std::uint8_t enabled) {
  std::uint8_t done = 0;
  for (std::uint32_t r = 0; r < machines.size() && !stop; ++r) {
    if (!(todo & bit(r))) continue;
    std::uint8_t child_sleep = 0;
    if (reduced() && !bits) {
      const Footprint& f = next_footprint(r);
      for (std::uint32_t t = 0; t < machines.size(); ++t) {
        if (t != r && ((sleep | done) & bit(t)) && !conflict(next_footprint(t), f)) child_sleep |= bit(t);
      }
    }
    path.push_back(static_cast<std::uint32_t>(std::popcount(static_cast<std::uint8_t>(enabled & (bit(r) - 1)))));
    const std::size_t mark = step(r);
    visit(child_sleep);
    undo(r, mark);
    path.pop_back();
    done |= bit(r);
  }
}

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
  if (options.batches.empty()) throw std::invalid_argument("explore: no batch to explore");
  if (options.setting.cp > 8) throw std::invalid_argument("explore: at most 8 ranks");
  const harness::BatchSource source = harness::BatchSource::from_batches(options.setting, options.batches);
  const harness::SourceShape shape = harness::measure(source);
  harness::RunOptions sim_options;
  sim_options.variant = options.variant;
  sim_options.layers = options.layers;
  sim_options.mutant = options.mutant;
  sim_options.ipc_missing_rank = options.ipc_missing_rank;
  sim::World world(sim::geometry_for(options.setting, options.layers, shape.slot_count_max, shape.current_pages_max), sim_options.seed);
  std::vector<sim::RankMachine> machines;
  for (std::int32_t r = 0; r < options.setting.cp; ++r) machines.emplace_back(world, options.setting, sim_options, r);
  for (sim::RankMachine& m : machines) m.begin_run();
  std::vector<std::uint32_t> path;
  if (!run_prologue(machines, path)) {
    ExploreResult r;
    r.found = true;
    r.finding = "deadlock in the capability probe";
    return r;
  }
  for (sim::RankMachine& m : machines) m.begin_batch(options.batches.front(), 0);
  // The prologue's writes are in the region now: the hash starts from them.
  Explorer explorer(options, world);
  explorer.machines = std::move(machines);
  explorer.path = std::move(path);
  explorer.visit(0);
  explorer.result.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - explorer.start).count();
  explorer.result.seconds = thread_cpu_seconds() - explorer.cpu_start;
  explorer.result.complete = !explorer.limit && !explorer.result.found;
  if (explorer.bits) {
    // Supertrace: a new state is lost when all three of its bits were already set; with a share q
    // of the bits set, that is q^3 at most, so at least 1 - q^3 of the states met were kept.
    const double q = explorer.bits->fill();
    explorer.result.coverage_estimate = 1.0 - q * q * q;
    explorer.result.complete = false;
  }
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
  // Section 12's token split over the same batch: no staging and no barrier, one all-gather per kind
  // between collective barriers, then the re-ordering (where allgather_skipped_reorder lives).
  shapes.push_back(shape("allgather_zigzag", cp, {exploration_batch()}, model::Variant::allgather_zigzag));
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
  // Every rank writes: 2 cp current pages, two per rank under the zigzag split (caps raised to fit).
  ExploreShape every = shape("every_rank_writes", cp, {one_request(0, 4 * cp, {})}, model::Variant::staging_direct);
  every.setting.caps.max_total_extend_tokens = 4 * cp;
  every.setting.caps.max_batch_requests = 1;
  every.setting.pool_pages = std::max(8, 2 * cp);
  shapes.push_back(every);
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

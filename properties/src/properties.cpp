#include "cpkv/properties/properties.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <ostream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cpkv/model/staging.hpp"
#include "cpkv/traces/trace.hpp"

namespace cpkv::properties {

namespace {
std::int64_t g_last_size = 0;
std::string g_last_replay;
std::int32_t g_last_run_first = 0;  // the invariant that fired first in the last simulated run
std::int32_t g_last_first = 0;      // ... in the last recorded counterexample's run

const sim::RunReport& noted(const sim::RunReport& report) {
  g_last_run_first = sim::first_invariant_fired(report);
  return report;
}

std::string variant_name(model::Variant v) { return std::string(model::to_string(v)); }
}  // namespace

std::int64_t last_counterexample_size() { return g_last_size; }
std::string last_counterexample_replay() { return g_last_replay; }
std::int32_t last_counterexample_first_invariant() { return g_last_first; }

void showValue(const Case& c, std::ostream& os) {
  const model::Setting& s = c.setting;
  os << fmt::format("cp {} page_size {} kinds [", s.cp, s.page_size);
  for (std::size_t k = 0; k < s.kinds.size(); ++k) os << (k ? " " : "") << s.kinds[k].name;
  os << fmt::format("] layers {} (simulated {}) split {} pool_pages {} caps(tokens {}, requests {}, mib {}) staging_slots {}\n",
                    s.layer_pattern, c.layers, model::to_string(s.split), s.pool_pages,
                    s.caps.max_total_extend_tokens ? std::to_string(*s.caps.max_total_extend_tokens) : "-",
                    s.caps.max_batch_requests ? std::to_string(*s.caps.max_batch_requests) : "-",
                    s.caps.staging_mib_override ? std::to_string(*s.caps.staging_mib_override) : "-",
                    model::staging_capacity(s).staging_slots);
  os << fmt::format("variant {} seed {} ipc_missing_rank {}\n", model::to_string(c.variant), c.seed, c.ipc_missing_rank);
  for (std::size_t b = 0; b < c.batches.size(); ++b) {
    os << fmt::format("batch {}:", b);
    for (const model::Request& r : c.batches[b].requests) {
      os << fmt::format(" (prefix {} pages [{}] extend {})", r.prefix_len, fmt::join(r.prefix_pages, " "), r.extend_len);
    }
    os << "\n";
  }
  os << fmt::format("schedule [{}]", fmt::join(c.schedule, " "));
}

rc::Gen<model::Setting> gen_setting(const Bounds& bounds) {
  return rc::gen::exec([bounds] {
    model::Setting s;
    s.cp = *rc::gen::inRange<std::int32_t>(1, bounds.cp_max + 1);
    s.page_size = 1 << *rc::gen::inRange<std::int32_t>(0, bounds.page_size_log2_max + 1);
    static const std::vector<std::vector<std::string_view>> kind_sets = {
        {"kv_fp8", "indexer_k"}, {"kv_fp8"}, {"kv_bf16", "indexer_k"}, {"kv_bf16"}, {"indexer_k"}};
    for (std::string_view name : *rc::gen::elementOf(kind_sets)) s.kinds.push_back(*model::find_buffer_kind(name));
    const auto layers = *rc::gen::inRange<std::int32_t>(1, bounds.layers_max + 1);
    for (std::int32_t l = 0; l < layers; ++l) s.layer_pattern += *rc::gen::element('F', 'S');
    s.split = *rc::gen::element(model::SplitPolicy::zigzag, model::SplitPolicy::contiguous, model::SplitPolicy::round_robin);
    s.pool_pages = *rc::gen::inRange<std::int64_t>(1, 129);
    return s;
  });
}

rc::Gen<model::Batch> gen_batch(const model::Setting& setting, const Bounds& bounds) {
  return rc::gen::exec([setting, bounds] {
    model::Batch batch;
    const std::int64_t P = setting.page_size;
    const auto requests = *rc::gen::inRange<std::int32_t>(1, bounds.requests_max + 1);
    std::int64_t tokens = 0;
    for (std::int32_t r = 0; r < requests; ++r) {
      model::Request req;
      // Extends: one token, page-exact, or partial last page.
      const auto shape = *rc::gen::inRange(0, 3);
      const auto pages = *rc::gen::inRange<std::int64_t>(1, 5);
      req.extend_len = shape == 0 ? 1 : shape == 1 ? pages * P : (pages - 1) * P + *rc::gen::inRange<std::int64_t>(1, P + 1);
      const auto prefix_pages = *rc::gen::inRange<std::int64_t>(0, 5);
      req.prefix_len = prefix_pages * P;
      if (r > 0 && tokens + req.extend_len + req.prefix_len > bounds.tokens_max) break;
      // Scattered page ids, as an allocator leaves them; shared pages across requests are allowed.
      for (std::int64_t k = 0; k < prefix_pages; ++k) req.prefix_pages.push_back(*rc::gen::inRange<std::int64_t>(0, setting.pool_pages));
      tokens += req.extend_len + req.prefix_len;
      batch.requests.push_back(std::move(req));
    }
    return batch;
  });
}

rc::Gen<Case> gen_case(const Bounds& bounds, bool tight_caps, bool ipc_faults) {
  return rc::gen::exec([bounds, tight_caps, ipc_faults] {
    Case c;
    c.setting = *gen_setting(bounds);
    const auto batch_count = *rc::gen::inRange<std::int32_t>(1, bounds.batches_max + 1);
    for (std::int32_t b = 0; b < batch_count; ++b) c.batches.push_back(*gen_batch(c.setting, bounds));
    std::int64_t extend_max = 1;
    std::int64_t requests_max = 1;
    for (const model::Batch& batch : c.batches) {
      std::int64_t extend = 0;
      for (const model::Request& r : batch.requests) extend += r.extend_len;
      extend_max = std::max(extend_max, extend);
      requests_max = std::max<std::int64_t>(requests_max, static_cast<std::int64_t>(batch.requests.size()));
    }
    const CapsShape caps = tight_caps ? CapsShape::tight
                                      : *rc::gen::element(CapsShape::tight, CapsShape::loose, CapsShape::absent, CapsShape::mib_override);
    const std::int64_t P = c.setting.page_size;
    switch (caps) {
      case CapsShape::tight:
        // Around the edge: the largest batch needs about ceil(extend / P) + requests slots.
        c.setting.caps.max_total_extend_tokens = std::max<std::int64_t>(1, extend_max + *rc::gen::inRange<std::int64_t>(-2 * P, P + 1));
        c.setting.caps.max_batch_requests = *rc::gen::inRange<std::int64_t>(1, requests_max + 1);
        break;
      case CapsShape::loose:
        c.setting.caps.max_total_extend_tokens = extend_max * 4;
        c.setting.caps.max_batch_requests = requests_max * 4;
        break;
      case CapsShape::absent:
        break;
      case CapsShape::mib_override:
        c.setting.caps.staging_mib_override = *rc::gen::inRange<std::int64_t>(1, 4);
        break;
    }
    c.variant = *rc::gen::elementOf(model::kAllVariants);
    c.layers = c.setting.layer_count();
    c.schedule = *rc::gen::container<std::vector<std::uint32_t>>(rc::gen::inRange<std::uint32_t>(0, 8));
    c.ipc_missing_rank = ipc_faults ? *rc::gen::inRange<std::int32_t>(-1, c.setting.cp) : -1;
    c.seed = *rc::gen::inRange<std::uint64_t>(1, 1000);
    return c;
  });
}

namespace {
sim::SimOptions options_of(const Case& c, sim::Mutant mutant) {
  sim::SimOptions options;
  options.variant = c.variant;
  options.layers = c.layers;
  options.seed = c.seed;
  options.mutant = mutant;
  options.ipc_missing_rank = c.ipc_missing_rank;
  return options;
}
}  // namespace

sim::RunReport run_case(const Case& c, sim::Mutant mutant) {
  const sim::BatchSource source = sim::BatchSource::from_batches(c.setting, c.batches);
  sim::Schedule schedule{sim::ScheduleKind::list, c.schedule, c.seed};
  sim::RunLimits limits;
  limits.steps_max = 5'000'000;
  return noted(sim::run_scheduled(source, options_of(c, mutant), schedule, limits));
}

sim::RunReport run_case_free(const Case& c, sim::Mutant mutant) {
  const sim::BatchSource source = sim::BatchSource::from_batches(c.setting, c.batches);
  sim::FaultOptions faults;
  faults.seed = c.seed;
  faults.delay_us_max = 100;
  faults.slow_producer_delay_us = 300;
  sim::RunLimits limits;
  limits.wait_ms_max = 2000;
  limits.run_ms_max = 30000;
  return noted(sim::run_free(source, options_of(c, mutant), sim::RanksAs::processes, faults, limits));
}

std::string write_replay(const Case& c, sim::Mutant mutant, const std::string& dir, const std::string& stem) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  const fs::path trace = fs::path(dir) / (stem + ".jsonl");
  const fs::path schedule = fs::path(dir) / (stem + ".schedule");
  {
    std::ofstream out(trace);
    traces::TraceHeader header;
    header.setting = c.setting;
    header.source = {{"kind", "property counterexample"}, {"name", stem}};
    traces::TraceWriter writer(out, header);
    for (const model::Batch& b : c.batches) writer.write(b);
  }
  {
    std::ofstream out(schedule);
    out << fmt::format("{}\n", fmt::join(c.schedule, " "));
  }
  // An empty choice list runs round-robin, which is what --schedule round-robin does.
  std::string line = fmt::format("cpkv replay {} --backend sim --variant {} --seed {} --layers {} --schedule {}", trace.string(),
                                 variant_name(c.variant), c.seed, c.layers, c.schedule.empty() ? "round-robin" : schedule.string());
  if (mutant != sim::Mutant::none) line += fmt::format(" --mutant {}", sim::to_string(mutant));
  if (c.ipc_missing_rank >= 0) line += fmt::format(" --ipc-missing-rank {}", c.ipc_missing_rank);
  return line;
}

namespace {
[[noreturn]] void fail(const Case& c, sim::Mutant mutant, const std::string& property, const std::string& why);
}  // namespace

std::unique_ptr<sim::Backend> scheduled_backend(const Case& c) {
  sim::RunLimits limits;
  limits.steps_max = 5'000'000;
  return sim::make_scheduled_backend(sim::Schedule{sim::ScheduleKind::list, c.schedule, c.seed}, limits, false);
}

void byte_exactness_on(const BackendFactory& backend_for, const Bounds& bounds, sim::Mutant mutant, bool require_no_violation) {
  const Case c = *gen_case(bounds, false, false);
  sim::SimOptions options;
  options.variant = c.variant;
  options.layers = c.layers;
  options.seed = c.seed;
  options.mutant = mutant;
  g_last_run_first = 0;
  const sim::RunReport& report = noted(backend_for(c)->run(sim::BatchSource::from_batches(c.setting, c.batches), options));
  for (const sim::SharedTotals& t : report.ranks) {
    if (t.mismatches > 0) fail(c, mutant, "6_byte_exactness", t.first_mismatch);
  }
  if (!report.failure.empty()) fail(c, mutant, "6_byte_exactness", "the run did not complete: " + report.failure);
  if (require_no_violation && report.violation_count > 0) fail(c, mutant, "6_byte_exactness", sim::describe(report.violations.front()));
}

namespace {

Bounds sim_bounds() {
  Bounds b;
  b.cp_max = 8;
  b.page_size_log2_max = 8;
  b.requests_max = 64;
  b.layers_max = 4;
  b.tokens_max = 384;
  b.batches_max = 3;
  return b;
}

std::int64_t case_size(const Case& c) {
  std::int64_t requests = 0;
  for (const model::Batch& b : c.batches) requests += static_cast<std::int64_t>(b.requests.size());
  return requests + static_cast<std::int64_t>(c.schedule.size());
}

// Records the failing case (the last one recorded is the shrunk counterexample), then fails.
[[noreturn]] void fail(const Case& c, sim::Mutant mutant, const std::string& property, const std::string& why) {
  g_last_size = case_size(c);
  g_last_first = g_last_run_first;
  const std::string dir = (std::filesystem::temp_directory_path() / "cpkv-counterexamples").string();
  g_last_replay = write_replay(c, mutant, dir, fmt::format("{}-{}", property, sim::to_string(mutant)));
  RC_FAIL(fmt::format("{}\n  replay: {}", why, g_last_replay));
}

std::string first_violation(const sim::RunReport& report, std::int32_t invariant) {
  for (const sim::Violation& v : report.violations) {
    if (v.invariant == invariant) return sim::describe(v);
  }
  // Only the first World::kViolationsMax violations are kept; the counts cover all of them.
  if (report.violations_by_invariant[invariant] > 0) {
    return fmt::format("{} violations of invariant {} (not among the first {} kept)", report.violations_by_invariant[invariant], invariant,
                       report.violations.size());
  }
  return {};
}

// The sim-backed part of a property: no violation of `invariant`.
void expect_no_violation(const Case& c, sim::Mutant mutant, const sim::RunReport& report, std::int32_t invariant, const std::string& name) {
  const std::string found = first_violation(report, invariant);
  if (!found.empty()) fail(c, mutant, name, found);
}

void page_writer_exclusivity(sim::Mutant mutant) {
  const Case c = *gen_case(sim_bounds(), false, false);
  // Model: every current page has exactly one writer, a rank of the group, and the staging_direct
  // plan reads it from that writer's staging at its current index.
  for (const model::Batch& batch : c.batches) {
    const model::BatchLayout layout = model::layout_batch(c.setting, batch);
    const auto plan = model::staging_direct_plan(layout);
    std::int64_t owned = 0;
    for (std::int32_t rank = 0; rank < c.setting.cp; ++rank) owned += static_cast<std::int64_t>(model::variant_plan(layout, c.variant, rank).own_current.size());
    RC_ASSERT(owned == layout.current_pages_total);
    for (std::int64_t i = 0; i < layout.current_pages_total; ++i) {
      const model::CurrentPage& page = layout.current[i];
      RC_ASSERT(page.writer >= 0);
      RC_ASSERT(page.writer < c.setting.cp);
      RC_ASSERT(plan[page.slot].table_index == c.setting.cp + page.writer);
      RC_ASSERT(plan[page.slot].source_page == i);
    }
  }
  expect_no_violation(c, mutant, run_case(c, mutant), 1, "1_page_writer_exclusivity");
}

void parity_half_reuse_safety(sim::Mutant mutant) {
  Case c = *gen_case(sim_bounds(), false, false);
  c.variant = *rc::gen::elementOf(model::barrier_variants());
  expect_no_violation(c, mutant, run_case(c, mutant), 2, "2_parity_half_reuse_safety");
}

void overflow_determinism(sim::Mutant mutant) {
  const Case c = *gen_case(sim_bounds(), true, false);
  const std::int64_t slots = model::staging_capacity(c.setting).staging_slots;
  std::int64_t overflows = 0;
  for (const model::Batch& batch : c.batches) {
    const model::BatchLayout layout = model::layout_batch(c.setting, batch);
    // The verdict is a function of batch-logical values: the same from every rank's layout.
    const model::Verdict verdict = model::overflow_verdict(layout.current_pages_total, slots);
    RC_ASSERT(verdict.overflow == (layout.current_pages_total > slots));
    overflows += verdict.overflow ? 1 : 0;
  }
  const sim::RunReport report = run_case(c, mutant);
  expect_no_violation(c, mutant, report, 3, "3_overflow_determinism");
  // A rejected batch leaves no rank waiting or writing: the run ends, and every rank skipped exactly
  // those batches.
  if (!report.failure.empty()) fail(c, mutant, "3_overflow_determinism", fmt::format("the run did not end normally: {}", report.failure));
  for (const sim::SharedTotals& t : report.ranks) {
    if (t.overflows != overflows) fail(c, mutant, "3_overflow_determinism", fmt::format("a rank rejected {} batches, the model {}", t.overflows, overflows));
  }
}

void barrier_phase_safety(sim::Mutant mutant) {
  Case c = *gen_case(sim_bounds(), false, false);
  c.variant = *rc::gen::elementOf(model::barrier_variants());
  expect_no_violation(c, mutant, run_case(c, mutant), 4, "4_barrier_phase_safety");
}

void plan_invariance(sim::Mutant mutant) {
  // The simulator's checker rebuilds each batch's plan and compares it with the one the rank uses on
  // every layer (built once per batch, cached): a stale or layer-dependent plan is a violation.
  const Case c = *gen_case(sim_bounds(), false, false);
  expect_no_violation(c, mutant, run_case(c, mutant), 5, "5_plan_invariance");
}

void byte_exactness(sim::Mutant mutant) {
  // Only invariant 6 here: the other checkers' findings belong to their own properties.
  byte_exactness_on([](const Case& c) { return scheduled_backend(c); }, sim_bounds(), mutant, /*require_no_violation=*/false);
}

void capability_agreement(sim::Mutant mutant) {
  const Case c = *gen_case(sim_bounds(), false, true);
  expect_no_violation(c, mutant, run_case(c, mutant), 7, "7_capability_agreement");
}

void liveness(sim::Mutant mutant) {
  const Case c = *gen_case(sim_bounds(), false, false);
  const sim::RunReport report = run_case(c, mutant);
  if (!report.failure.empty()) fail(c, mutant, "8_liveness", report.failure);
}

void free_running_byte_exactness(sim::Mutant mutant) {
  Bounds bounds = sim_bounds();
  bounds.cp_max = 4;
  bounds.tokens_max = 128;
  const Case c = *gen_case(bounds, false, false);
  const sim::RunReport report = run_case_free(c, mutant);
  if (!report.failure.empty()) fail(c, mutant, "free_running_processes", report.failure);
  for (const sim::SharedTotals& t : report.ranks) {
    if (t.mismatches > 0) fail(c, mutant, "free_running_processes", t.first_mismatch);
  }
  if (report.violation_count > 0) fail(c, mutant, "free_running_processes", sim::describe(report.violations.front()));
}

}  // namespace

const std::vector<Property>& all_properties() {
  static const std::vector<Property> properties = {
      {"1_page_writer_exclusivity", 1, page_writer_exclusivity},
      {"2_parity_half_reuse_safety", 2, parity_half_reuse_safety},
      {"3_overflow_determinism", 3, overflow_determinism},
      {"4_barrier_phase_safety", 4, barrier_phase_safety},
      {"5_plan_invariance", 5, plan_invariance},
      {"6_byte_exactness", 6, byte_exactness},
      {"7_capability_agreement", 7, capability_agreement},
      {"8_liveness", 8, liveness},
      {"free_running_processes", 0, free_running_byte_exactness},
  };
  return properties;
}

}  // namespace cpkv::properties

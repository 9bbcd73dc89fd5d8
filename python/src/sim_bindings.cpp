// Bindings of the rank simulator (sim/include/cpkv/sim: backend.hpp, runner.hpp): replay a trace, or
// batches held in memory, through the one Backend interface, and return the report as the dict
// `cpkv replay --json` writes: the same functions build both (harness/replay_report.hpp), and the
// tests compare the two. Options are checked in the CLI's order with the CLI's reasons, named by
// the Python parameter.
#include <chrono>

#include <fmt/format.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "cpkv/harness/replay_report.hpp"
#include "cpkv/sim/backend.hpp"
#include "cpkv/sim/mutant.hpp"
#include "cpkv/sim/runner.hpp"
#include "cpkv/sim/shared_region.hpp"

namespace cpkv::python {
namespace {

struct ReplayArgs {
  std::string backend = "sim";
  std::string variant = "all";
  std::string ranks_as = "processes";
  std::optional<std::string> schedule;
  std::uint64_t seed = 1;
  py::object layers;  // an int or "all"
  std::optional<std::int64_t> batch;
  std::string mutant = "none";
  std::int64_t wait_ms_max = 20000;
  std::int32_t ipc_missing_rank = -1;
};

// What to run, checked before any rank starts.
struct ReplayPlan {
  std::vector<model::Variant> variants;
  sim::Mutant mutant = sim::Mutant::none;
  std::int32_t layers = 1;
  std::optional<sim::Schedule> schedule;
};

std::int32_t checked_layers(const py::object& layers, std::int32_t layer_count) {
  if (py::isinstance<py::str>(layers)) {
    if (layers.cast<std::string>() == "all") return layer_count;
    throw InputError("layers", fmt::format("'{}' is not a number or 'all'", layers.cast<std::string>()));
  }
  const auto value = layers.cast<std::int64_t>();
  if (value < 1) throw InputError("layers", fmt::format("{} is less than 1", value));
  return static_cast<std::int32_t>(std::min<std::int64_t>(value, layer_count));
}

std::optional<sim::Schedule> checked_schedule(const ReplayArgs& a) {
  if (!a.schedule) return std::nullopt;
  if (auto named = sim::named_schedule(*a.schedule, a.seed)) return named;
  try {
    return sim::read_schedule_file(*a.schedule);
  } catch (const std::exception& e) {
    throw InputError("schedule", e.what());
  }
}

ReplayPlan check_options(const ReplayArgs& a) {
  if (a.backend != "sim") {
    throw InputError("backend", fmt::format("'{}' is not available from Python (sim; the model replay and the GPU backend run through the cpkv command)", a.backend));
  }
  ReplayPlan plan;
  const auto mutant = sim::parse_mutant(a.mutant);
  if (!mutant) throw InputError("mutant", fmt::format("unknown mutant '{}'", a.mutant));
  plan.mutant = *mutant;
  auto variants = harness::variants_named(a.variant);
  if (!variants) throw InputError("variant", fmt::format("unknown variant '{}' (or 'all')", a.variant));
  plan.variants = *std::move(variants);
  if (a.ranks_as != "processes" && a.ranks_as != "threads") throw InputError("ranks_as", fmt::format("'{}' is not processes or threads", a.ranks_as));
  if (a.wait_ms_max < 1) throw InputError("wait_ms_max", fmt::format("{} is less than 1", a.wait_ms_max));
  if (a.batch && *a.batch < 0) throw InputError("batch", fmt::format("{} is negative", *a.batch));
  if (a.ipc_missing_rank < -1) throw InputError("ipc_missing_rank", fmt::format("{} is negative (-1: none)", a.ipc_missing_rank));
  return plan;
}

// The CLI's JSON as Python objects: through the json module, so the dict is the text `cpkv replay
// --json` writes, parsed, and nothing is restated here.

std::unique_ptr<sim::Backend> make_backend(const ReplayArgs& a, const ReplayPlan& plan) {
  sim::RunLimits limits;
  limits.wait_ms_max = a.wait_ms_max;
  if (plan.schedule) return sim::make_scheduled_backend(*plan.schedule, limits, false);
  sim::FaultOptions faults;
  faults.seed = a.seed;
  return sim::make_free_backend(a.ranks_as == "threads" ? sim::RanksAs::threads : sim::RanksAs::processes, faults, limits);
}

py::dict run_source(const sim::BatchSource& source, const py::object& trace_label, const ReplayArgs& a) {
  ReplayPlan plan = check_options(a);
  // Validates every batch before any rank starts; the batches the overflow verdict rejects are
  // listed as the CLI's report lists them (PROTOCOL.md section 4: a rejected batch is named).
  const harness::SourceScan scanned = harness::scan(source);
  if (a.batch && scanned.shape.batches == 0) throw InputError("batch", fmt::format("{} is not in {}", *a.batch, py::str(trace_label).cast<std::string>()));
  plan.layers = checked_layers(a.layers, source.setting.layer_count());
  if (a.ipc_missing_rank >= source.setting.cp) {
    throw InputError("ipc_missing_rank", fmt::format("{} is not a rank of cp = {}", a.ipc_missing_rank, source.setting.cp));
  }
  plan.schedule = checked_schedule(a);
  sim::sweep_stale_regions();
  const std::unique_ptr<sim::Backend> backend = make_backend(a, plan);
  py::list runs;
  for (model::Variant variant : plan.variants) {
    sim::SimOptions options;
    options.variant = variant;
    options.layers = plan.layers;
    options.seed = a.seed;
    options.mutant = plan.mutant;
    options.ipc_missing_rank = a.ipc_missing_rank;
    const auto start = std::chrono::steady_clock::now();
    sim::RunReport report;
    {
      py::gil_scoped_release release;  // ranks may be threads or forked processes: none touches Python
      report = backend->run(source, options);
    }
    runs.append(to_python(harness::run_json(report, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count())));
  }
  return py::dict(py::arg("trace") = trace_label, py::arg("seed") = a.seed, py::arg("layers") = plan.layers, py::arg("mode") = backend->name(),
                  py::arg("mutant") = a.mutant, py::arg("rejected_batches") = to_python(harness::rejected_json(scanned.rejected)), py::arg("runs") = runs);
}

ReplayArgs args_of(std::string backend, std::string variant, std::string ranks_as, std::optional<std::string> schedule, std::uint64_t seed,
                   py::object layers, std::optional<std::int64_t> batch, std::string mutant, std::int64_t wait_ms_max, std::int32_t ipc_missing_rank) {
  return ReplayArgs{std::move(backend), std::move(variant), std::move(ranks_as), std::move(schedule), seed, std::move(layers), batch,
                    std::move(mutant), wait_ms_max, ipc_missing_rank};
}

}  // namespace

void bind_sim(py::module_& m) {
  m.def("replay", [](const std::string& path, std::string backend, std::string variant, std::string ranks_as, std::optional<std::string> schedule,
                     std::uint64_t seed, py::object layers, std::optional<std::int64_t> batch, std::string mutant, std::int64_t wait_ms_max,
                     std::int32_t ipc_missing_rank) {
    const ReplayArgs a = args_of(std::move(backend), std::move(variant), std::move(ranks_as), std::move(schedule), seed, std::move(layers), batch,
                                 std::move(mutant), wait_ms_max, ipc_missing_rank);
    check_options(a);  // option errors before the trace is opened, as the CLI does
    return run_source(sim::BatchSource::from_trace(path, batch), py::str(path), a);
  }, py::arg("path"), py::arg("backend") = "sim", py::arg("variant") = "all", py::arg("ranks_as") = "processes", py::arg("schedule") = py::none(),
        py::arg("seed") = 1, py::arg("layers") = 4, py::arg("batch") = py::none(), py::arg("mutant") = "none", py::arg("wait_ms_max") = 20000,
        py::arg("ipc_missing_rank") = -1,
        "Replay every batch of a trace through the rank simulator with one variant or 'all', checking every dense byte "
        "against the model. Returns the dict `cpkv replay --json FILE` writes: trace, seed, layers, mode, mutant, and per "
        "variant run: passed, mismatches, violations, deadlock, failure, steps, seconds, per-rank totals, violation details. "
        "schedule: None (free-running ranks_as processes or threads), 'random', 'round-robin' or a schedule file.");
  m.def("replay_batches", [](const model::Setting& setting, std::vector<model::Batch> batches, std::string variant, std::string ranks_as,
                             std::optional<std::string> schedule, std::uint64_t seed, py::object layers, std::string mutant, std::int64_t wait_ms_max,
                             std::int32_t ipc_missing_rank) {
    require_valid(setting);
    if (batches.empty()) throw InputError("batches", "no batch given");
    for (std::size_t b = 0; b < batches.size(); ++b) require_valid(setting, batches[b], fmt::format("batch {}", b));
    const ReplayArgs a = args_of("sim", std::move(variant), std::move(ranks_as), std::move(schedule), seed, std::move(layers), std::nullopt,
                                 std::move(mutant), wait_ms_max, ipc_missing_rank);
    return run_source(sim::BatchSource::from_batches(setting, std::move(batches)), py::none(), a);
  }, py::arg("setting"), py::arg("batches"), py::arg("variant") = "all", py::arg("ranks_as") = "threads", py::arg("schedule") = py::none(),
        py::arg("seed") = 1, py::arg("layers") = 4, py::arg("mutant") = "none", py::arg("wait_ms_max") = 20000, py::arg("ipc_missing_rank") = -1,
        "replay() over batches held in memory (for property tests): the same dict, with trace None.");
}

}  // namespace cpkv::python

// Bindings of the rank simulator (sim/include/cpkv/sim: backend.hpp, runner.hpp): replay a trace, or
// batches held in memory, through the one Backend interface, and return the report as the dict
// `cpkv replay --json` writes: the same functions build both (harness/replay_report.hpp), and the
// tests compare the two. Options are checked in the CLI's order with the CLI's reasons, named by
// the Python parameter.
#include <chrono>
#include <filesystem>

#include <fmt/format.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "request_error.hpp"
#include "cpkv/backends/register_all.hpp"
#include "cpkv/harness/model_replay.hpp"
#include "cpkv/harness/replay_report.hpp"
#include "cpkv/harness/request.hpp"
#include "cpkv/model/assert.hpp"
#include "cpkv/model/limits.hpp"
#include "cpkv/sim/backend.hpp"
#include "cpkv/traces/trace.hpp"

namespace cpkv::python {
namespace {

// The registry Python replays through: register_all's (backends/), the simulator and the model
// (this module links no GPU backend: the GPU runs through the cpkv command and the conformance harness).
const harness::Registry& python_backends() { return backends::registry(); }

std::optional<std::int32_t> checked_layers(const py::object& layers) {
  if (py::isinstance<py::str>(layers)) {
    if (layers.cast<std::string>() == "all") return std::nullopt;
    throw InputError("layers", fmt::format("'{}' is not a number or 'all'", layers.cast<std::string>()));
  }
  if (!PyLong_Check(layers.ptr()) || PyBool_Check(layers.ptr())) {  // 2.5 and None were pybind11's RuntimeError (issue 22, item 24)
    throw py::type_error(fmt::format("layers: expected an int or 'all', not {}", Py_TYPE(layers.ptr())->tp_name));
  }
  // An int beyond 64 bits (2**64) was pybind11's "Unable to cast" RuntimeError (issue 34, item 21).
  int overflow = 0;
  const long long value = PyLong_AsLongLongAndOverflow(layers.ptr(), &overflow);
  if (overflow != 0 || value < 1 || value > model::limits::layer_count_max) {
    const std::string text = py::str(layers).cast<std::string>();
    throw InputError("layers", fmt::format("{} is not 'all' or a number in 1..{}", text, model::limits::layer_count_max));
  }
  return static_cast<std::int32_t>(value);
}

// The run of a backend that moves content, its source validated (every batch, before any rank
// starts: check_source); the batches the overflow verdict rejects are listed as the CLI's report
// lists them (PROTOCOL.md section 4: a rejected batch is named).
py::dict run_source(const harness::BatchSource& source, const harness::ScannedSource& scanned, const py::object& trace_label,
                    const harness::CheckedRequest& checked) {
  const std::unique_ptr<harness::Backend> backend = as_input_error([&] { return checked.backend->replay(checked, source, scanned, {}); });
  nlohmann::json runs = nlohmann::json::array();
  run_interruptible([&] {  // ranks may be threads or forked processes: none touches Python
    harness::run_variants(checked, source, scanned, *backend, {}, [&](const harness::VariantRun& run) {
      runs.push_back(harness::run_json(run.report, run.seconds));
    });
  });
  py::dict out = to_python(harness::replay_json(checked, scanned, backend->name(), runs));
  out["trace"] = trace_label;
  return out;
}

struct PyRequest {
  std::string variant;
  std::optional<std::string> ranks_as;
  std::optional<std::string> schedule;
  std::uint64_t seed;
  py::object layers;
  std::string mutant;
  std::optional<std::int64_t> wait_ms_max;
  std::optional<std::int64_t> stuck_ms_max;
  bool swarm;
  std::int32_t ipc_missing_rank;
  std::optional<std::string> impl = std::nullopt;    // the torch backend's
  std::optional<std::string> device = std::nullopt;
  std::optional<std::int32_t> ranks = std::nullopt;
};

harness::CheckedRequest checked_request(std::string backend, std::string label, std::optional<std::int64_t> batch, const PyRequest& p,
                                        const harness::SourceFile& source_file) {
  harness::ReplayRequest r;
  r.backend = std::move(backend);
  r.trace_label = std::move(label);
  r.batch = batch;
  r.variant = p.variant;
  r.ranks_as = p.ranks_as;
  r.schedule = p.schedule;
  r.seed = p.seed;
  r.mutant = p.mutant;
  r.wait_ms_max = p.wait_ms_max;
  r.stuck_ms_max = p.stuck_ms_max;
  r.swarm = p.swarm;
  r.ipc_missing_rank = p.ipc_missing_rank;
  r.impl = p.impl;
  r.device = p.device;
  r.ranks = p.ranks;
  // Layers parsed first, as the CLI parses them; then the whole run in one check (harness check_run:
  // the options, then the trace from the file `source_file` names; a handed-off run's source with it).
  r.layers = checked_layers(p.layers);
  return as_input_error([&] { return harness::check_run(r, python_backends(), source_file); });
}

// A backend whose verb is the model replay ("model"): what `cpkv replay --backend model --json F`
// writes, with the nominal ceilings.
py::dict run_model(const harness::BackendEntry& entry, const std::string& read_path, const std::string& label, std::optional<std::int64_t> batch) {
  harness::ModelReplayOutput out;
  run_interruptible([&] { out = entry.model(harness::BatchSource::from_trace(read_path, batch), label, model::CostParameters{}, {}); });
  py::dict json = to_python(out.json);
  json["trace"] = path_text(label);  // as the simulator's dict names it
  return json;
}

// A backend whose verb is the handoff (torch: Python's conformance harness), its run checked whole by
// check_run: the command run in this process by the module it names (`-m cpkv.conformance ARGS`: its
// replay_command) with the checked run handed over, so it checks nothing again; it returns the
// report its --json writes.
py::dict run_handoff(const harness::CheckedRequest& checked) {
  const harness::HandedRun& handed = *checked.handed;
  const std::vector<std::string>& args = handed.arguments;
  CPKV_ASSERT(args.size() >= 2 && args[0] == "-m");
  py::list argv;
  for (std::size_t i = 2; i < args.size(); ++i) argv.append(args[i]);
  return py::module_::import(args[1].c_str()).attr("replay_command")(argv, to_python(handed.checked)).cast<py::dict>();
}

}  // namespace

void bind_sim(py::module_& m) {
  // The planted bugs, from the one table (harness/mutants.hpp): name -> (invariant, backends holding it).
  py::dict mutants;
  for (const harness::MutantInfo& row : harness::kMutantTable) {
    if (row.mutant == harness::Mutant::none) continue;
    py::list held;
    if (row.backends & harness::kSimulatorHolds) held.append("sim");
    if (row.backends & harness::kGpuHolds) held.append("cuda");
    if (row.backends & harness::kHarnessHolds) held.append("cuda-plugin");  // the harness around an --exchange plugin
    mutants[py::str(std::string(row.name))] = py::make_tuple(row.invariant, py::tuple(held));
  }
  m.attr("MUTANTS") = mutants;
  m.def("replay", [](const py::object& path_object, std::string backend, std::string variant, std::optional<std::string> ranks_as,
                     std::optional<std::string> schedule, std::uint64_t seed, py::object layers, std::optional<std::int64_t> batch, std::string mutant,
                     std::optional<std::int64_t> wait_ms_max, std::optional<std::int64_t> stuck_ms_max, bool swarm, std::int32_t ipc_missing_rank,
                     std::optional<std::string> impl, std::optional<std::string> device, std::optional<std::int32_t> ranks) {
    const PyRequest p{std::move(variant), std::move(ranks_as), std::move(schedule), seed, std::move(layers), std::move(mutant),
                      wait_ms_max, stuck_ms_max, swarm, ipc_missing_rank, std::move(impl), std::move(device), ranks};
    const std::string path = path_argument(path_object, "path");
    std::optional<SpooledInput> input;  // a pipe is read more than once: the scan, then every rank and variant
    try {
      // Option errors before the trace is opened (check_run asks for its file once they pass).
      const harness::CheckedRequest checked = checked_request(std::move(backend), path, batch, p, [&](const harness::CheckedRequest&) {
        input.emplace(path);
        return input->read_path();
      });
      if (checked.backend->handoff) return run_handoff(checked);
      if (checked.backend->model) return run_model(*checked.backend, input->read_path(), path, batch);
      return run_source(checked.source->source, checked.source->scanned, path_text(path), checked);  // opened and scanned by check_run
    } catch (const traces::TraceError& e) {
      if (!input || e.file() != input->read_path()) throw;
      throw traces::TraceError(path, e.line(), e.field(), e.reason());  // the name the caller gave, not the spool's
    }
  }, py::arg("path"), py::arg("backend") = "sim", py::arg("variant") = "all", py::arg("ranks_as") = py::none(), py::arg("schedule") = py::none(),
        py::arg("seed") = 1, py::arg("layers") = 4, py::arg("batch") = py::none(), py::arg("mutant") = "none", py::arg("wait_ms_max") = py::none(),
        py::arg("stuck_ms_max") = py::none(), py::arg("swarm") = false, py::arg("ipc_missing_rank") = -1, py::arg("impl") = py::none(),
        py::arg("device") = py::none(), py::arg("ranks") = py::none(),
        "Replay every batch of a trace through a backend with one variant, a comma-separated list or 'all', as `cpkv replay` "
        "does (the same request checks, in harness/request.hpp). backend='sim': the rank simulator, checking every dense "
        "byte; returns the dict `cpkv replay --json FILE` writes: trace, seed, layers, mode, mutant, and per variant run: "
        "passed, mismatches, violations, deadlock, failure, steps, seconds, per-rank totals, violation details. schedule: "
        "None (free-running ranks_as processes or threads; swarm draws every fault knob from the seed), 'random', "
        "'round-robin' or a schedule file. backend='model': the dict `cpkv replay --backend model --json FILE` writes "
        "(the nominal ceilings). backend='torch': impl ('module:Class' or 'module:Class(k=v, ...)') run under the conformance "
        "harness on device 'cpu' (gloo) or 'cuda', ranks (default: the trace's cp) rank processes; returns the dict "
        "`python3 -m cpkv.conformance --json FILE` writes (the run's totals, violations by invariant, failure and deadlock, "
        "the harness's own figures beside them and in a top-level `conformance` block).");
  m.def("replay_batches", [](const model::Setting& setting, std::vector<model::Batch> batches, std::string variant, std::string ranks_as,
                             std::optional<std::string> schedule, std::uint64_t seed, py::object layers, std::string mutant,
                             std::optional<std::int64_t> wait_ms_max, std::int32_t ipc_missing_rank) {
    require_valid(setting);
    if (batches.empty()) throw InputError("batches", "no batch given");
    for (std::size_t b = 0; b < batches.size(); ++b) require_valid(setting, batches[b], fmt::format("batch {}", b));
    const PyRequest p{std::move(variant), schedule ? std::nullopt : std::optional<std::string>(std::move(ranks_as)), std::move(schedule), seed,
                      std::move(layers), std::move(mutant), wait_ms_max, std::nullopt, false, ipc_missing_rank};
    const harness::CheckedRequest checked = checked_request("sim", "batches", std::nullopt, p, {});  // no file: the source is checked here
    const harness::BatchSource source = harness::BatchSource::from_batches(setting, std::move(batches));
    const harness::ScannedSource scanned = as_input_error([&] { return harness::check_source(checked, source); });
    return run_source(source, scanned, py::none(), checked);
  }, py::arg("setting"), py::arg("batches"), py::arg("variant") = "all", py::arg("ranks_as") = "threads", py::arg("schedule") = py::none(),
        py::arg("seed") = 1, py::arg("layers") = 4, py::arg("mutant") = "none", py::arg("wait_ms_max") = py::none(), py::arg("ipc_missing_rank") = -1,
        "replay() over batches held in memory (for property tests): the same dict, with trace None.");
}

}  // namespace cpkv::python

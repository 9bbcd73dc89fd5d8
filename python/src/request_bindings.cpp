// Bindings of the one replay request for the conformance harness (`python3 -m cpkv.conformance`,
// the torch backend's run): its options checked by harness::check_request and, against the trace,
// harness::check_source (the one checker of every front end), and what the harness builds from a
// checked request: the run header, the reproducer and the replay JSON's common part. Python keeps
// what needs Python (the ranks, the checks, the conformance-only figures).
#include <algorithm>
#include <array>
#include <limits>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "request_error.hpp"
#include "cpkv/backends/register_all.hpp"
#include "cpkv/harness/replay_report.hpp"
#include "cpkv/harness/request.hpp"
#include "cpkv/model/staging.hpp"
#include "cpkv/traces/text.hpp"

namespace cpkv::python {
namespace {

// A RequestError as InputError named as the command lines spell the option ("--wait-ms-max").
template <typename Function>
auto as_cli_error(Function&& function) {
  return as_input_error(std::forward<Function>(function), OptionNames::command_line);
}

// options[key] as a whole number of T's range (nullopt: absent or None); beyond it, one line naming the flag.
template <typename T>
std::optional<T> whole(const py::dict& options, const char* key) {
  if (!options.contains(key) || options[key].is_none()) return std::nullopt;
  const py::object value = options[key];
  if (!PyLong_Check(value.ptr()) || PyBool_Check(value.ptr())) throw py::type_error(fmt::format("{}: expected an int", key));
  int overflow = 0;
  const long long number = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
  if (overflow != 0 || number < static_cast<long long>(std::numeric_limits<T>::min()) || number > static_cast<long long>(std::numeric_limits<T>::max())) {
    throw InputError(harness::option_flag(key), fmt::format("{} is not in {}..{}", py::str(value).cast<std::string>(), std::numeric_limits<T>::min(),
                                               std::numeric_limits<T>::max()));
  }
  return static_cast<T>(number);
}

template <typename T>
std::optional<T> given(const py::dict& options, const char* key) {
  if (!options.contains(key) || options[key].is_none()) return std::nullopt;
  return options[key].cast<T>();
}

// The torch backend's request from the command's options, keyed by their Python spelling (the
// request's fields). The seed is the model's uint64, checked where the command parses it.
harness::ReplayRequest request_of(const std::string& trace, const py::dict& o) {
  harness::ReplayRequest r;
  r.trace_label = trace;
  r.backend = "torch";
  r.impl = given<std::string>(o, "impl");
  r.device = given<std::string>(o, "device");
  r.ranks = whole<std::int32_t>(o, "ranks");
  r.seed = given<std::uint64_t>(o, "seed").value_or(1);
  r.layers = whole<std::int32_t>(o, "layers");  // None: all of the trace's
  r.batch = whole<std::int64_t>(o, "batch");
  r.mutant = given<std::string>(o, "mutant").value_or("none");
  r.swarm = given<bool>(o, "swarm").value_or(false);
  r.wait_ms_max = whole<std::int64_t>(o, "wait_ms_max");
  r.ipc_missing_rank = whole<std::int32_t>(o, "ipc_missing_rank").value_or(-1);
  r.timeline = given<std::string>(o, "timeline");
  r.no_delays = given<bool>(o, "no_delays").value_or(false);
  r.time = given<bool>(o, "time").value_or(false);
  r.require_attention = given<bool>(o, "require_attention").value_or(false);
  r.attention_output = given<bool>(o, "attention_output").value_or(false);
  r.import_s_max = given<double>(o, "import_s_max");
  r.cpkv_bin = given<std::string>(o, "cpkv_bin");
  return r;
}

// A checked request, and once checked against its trace, the trace's scan (the layers run, the header's figures).
struct CheckedRun {
  harness::CheckedRequest checked;
  std::optional<harness::BatchSource> source;
  harness::ScannedSource scanned;
};

void check_against_trace(CheckedRun& run) {
  run.source = harness::BatchSource::from_trace(run.checked.request.trace_label, run.checked.request.batch);
  run.scanned = as_cli_error([&] { return harness::check_source(run.checked, *run.source); });
}

// The request checked, then (scan) against its trace, in one call: the options, then the input, as
// `cpkv replay` checks them.
CheckedRun check_run(const std::string& trace, const py::dict& options, bool scan) {
  harness::ReplayRequest request = request_of(trace, options);
  CheckedRun run{as_cli_error([&] { return harness::check_request(request, backends::registry()); }), std::nullopt, {}};
  if (scan) check_against_trace(run);
  return run;
}

const CheckedRun& scanned_run(const CheckedRun& run) {
  if (!run.source) throw std::logic_error("check_trace() first: the header and the JSON need the trace's scan");
  return run;
}

// The reproducer: the request's one line (`cpkv replay TRACE --backend torch --impl ...`); the
// layers are the run's (the trace's scan), else the request's.
std::string reproducer(const CheckedRun& run, std::optional<std::int32_t> layers) {
  const std::int32_t run_layers = run.source ? run.scanned.layers : layers.value_or(run.checked.request.layers.value_or(0));
  if (run_layers < 1) throw InputError("layers", "the reproducer needs the layers run (check_trace() first, or give them)");
  return harness::replay_line(run.checked, model::kAllVariants.front(), run_layers);  // the --impl class is the variant
}

// `cpkv replay --json`'s object for this run: its runs, and the batches the implementation's staging
// rejects, each (batch, current pages total, staging slots), given the verdict the model gives them.
py::object replay_json(const CheckedRun& run, const std::string& mode, const py::list& runs, const std::vector<std::array<std::int64_t, 3>>& rejected) {
  harness::ScannedSource scanned = scanned_run(run).scanned;
  scanned.scan.rejected.clear();
  for (const auto& [batch, total, slots] : rejected) scanned.scan.rejected.push_back({batch, model::overflow_verdict(total, slots)});
  const nlohmann::json runs_json = nlohmann::json::parse(py::module_::import("json").attr("dumps")(runs).cast<std::string>());
  return to_python(harness::replay_json(run.checked, scanned, mode, runs_json));
}

// One run's object (harness run_json) for a foreign exchange's run, from the figures the conformance
// harness counted (per rank: batches, layers, barriers, overflows, mismatches; the violations, by
// invariant; the failure): "passed" and every common key are the harness's; what it cannot observe
// of a foreign class is null (steps, collectives, the bytes, barriers where none were announced),
// its variant the class, its violation details the harness's located lines.
py::object foreign_run_json(const py::dict& figures) {
  harness::RunReport report;
  report.mode = figures["mode"].cast<std::string>();
  report.failure = figures["failure"].cast<std::string>();
  report.deadlock = figures["deadlock"].cast<bool>();
  report.violation_count = figures["violations"].cast<std::int64_t>();
  for (const auto& [key, count] : figures["violations_by_invariant"].cast<py::dict>()) {
    const int invariant = std::stoi(key.cast<std::string>());
    if (invariant < 1 || invariant > harness::kInvariants) throw InputError("violations_by_invariant", fmt::format("{} is not an invariant", invariant));
    report.violations_by_invariant[invariant] = count.cast<std::int64_t>();
  }
  const py::list ranks = figures["ranks"];
  for (const py::handle rank : ranks) {
    harness::Totals t;
    t.batches = rank["batches"].cast<std::int64_t>();
    t.layers = rank["layers"].cast<std::int64_t>();
    t.barriers = rank["barriers"].is_none() ? 0 : rank["barriers"].cast<std::int64_t>();
    t.overflows = rank["overflows"].cast<std::int64_t>();
    t.mismatches = rank["mismatches"].cast<std::int64_t>();
    report.ranks.push_back(t);
  }
  nlohmann::json run = harness::run_json(report, figures["seconds"].cast<double>());
  run["variant"] = figures["variant"].cast<std::string>();
  run["steps"] = nullptr;
  run["violation_details"] = figures["violation_details"].cast<std::vector<std::string>>();
  for (std::size_t i = 0; i < report.ranks.size(); ++i) {
    for (const char* unseen : {"collectives", "bytes_gathered_from_peers", "bytes_reduced"}) run["ranks"][i][unseen] = nullptr;
    if (ranks[i]["barriers"].is_none()) run["ranks"][i]["barriers"] = nullptr;
  }
  return to_python(run);
}

}  // namespace

void bind_request(py::module_& m) {
  py::class_<CheckedRun>(m, "CheckedRun", "A torch-backend replay request checked by the harness (harness/request.hpp: check_request).")
      .def("check_trace", &check_against_trace,
           "Check the request against its trace (harness check_source: the batch present, the IPC fault's rank and --ranks of its cp, every "
           "batch valid); InputError naming the option as the command lines spell it, or TraceError.")
      .def_property_readonly("layers", [](const CheckedRun& run) { return scanned_run(run).scanned.layers; }, "The layers run per batch.")
      .def_property_readonly("knobs", [](const CheckedRun& run) {
        py::dict out;
        for (const harness::ResolvedKnob& k : run.checked.knobs) out[py::str(k.option)] = py::make_tuple(k.value, k.origin);
        return out;
      }, "Every knob resolved (the option, else CPKV_*, else the default): option -> (value, origin).")
      .def_property_readonly("import_s_max", [](const CheckedRun& run) { return run.checked.request.import_s_max; })
      .def_property_readonly("cpkv_bin", [](const CheckedRun& run) { return run.checked.request.cpkv_bin; })
      .def("header", [](const CheckedRun& run, const std::string& mode) {
        return harness::run_header_lines("cpkv conformance", run.checked, *scanned_run(run).source, run.scanned, mode);
      }, py::arg("mode"), "The run header's lines, as `cpkv replay` prints them (harness run_header_lines).")
      .def("replay_line", &reproducer, py::arg("layers") = py::none(), "The reproducer (harness replay_line): `cpkv replay TRACE --backend torch ...`.")
      .def("replay_json", &replay_json, py::arg("mode"), py::arg("runs"), py::arg("rejected"),
           "`cpkv replay --json`'s object (harness replay_json) over these runs and rejected batches.");
  m.def("foreign_run_json", &foreign_run_json, py::arg("figures"),
        "`cpkv replay --json`'s run object (harness run_json) for a foreign exchange's run: variant, mode, failure, deadlock, violations, "
        "violations_by_invariant, violation_details, seconds and per-rank batches, layers, barriers, overflows, mismatches in; passed and "
        "every common key out, what the harness cannot observe null.");
  m.def("check_torch_request", &check_run, py::arg("trace"), py::arg("options"), py::arg("scan") = false,
        "The torch backend's replay request from options keyed by their Python spelling (impl, device, ranks, seed, layers, batch, mutant, "
        "swarm, wait_ms_max, ipc_missing_rank, timeline, no_delays, time, require_attention, attention_output, import_s_max, cpkv_bin), "
        "checked by harness check_request (the knobs' CPKV_* read there), and with scan=True against the trace (check_trace); InputError "
        "naming the option as `cpkv replay` spells it.");
}

}  // namespace cpkv::python

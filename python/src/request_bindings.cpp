// Bindings of the one replay request for the conformance harness (`python3 -m cpkv.conformance`,
// the torch backend's run): its options checked whole in one call by harness::check_run (the request,
// then against the trace: the one checker of every front end), which returns what the harness builds
// from the checked run (the run header, the reproducer, the replay JSON's common part) as the JSON
// the cpkv command hands over; Python keeps what needs Python (the ranks, the checks, the
// conformance-only figures).
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
#include "cpkv/harness/run.hpp"
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

// The run checked whole in one call (harness check_run: the request, then against its trace) as the
// JSON a handed-off run reads (harness HandedRun::checked): the conformance command typed alone
// checks through this, as the cpkv command's check hands the same object over.
py::object check_torch_run(const std::string& trace, const py::dict& options) {
  const harness::ReplayRequest request = request_of(trace, options);
  const harness::CheckedRequest checked = as_cli_error([&] { return harness::check_run(request, backends::registry()); });
  return to_python(checked.handed->checked);
}

// The request alone, checked without its trace (a case's reproducer: its batches may be no file's).
struct CheckedRequestOnly {
  harness::CheckedRequest checked;
};
CheckedRequestOnly check_request_only(const std::string& trace, const py::dict& options) {
  const harness::ReplayRequest request = request_of(trace, options);
  return {as_cli_error([&] { return harness::check_request(request, backends::registry()); })};
}

// `cpkv replay --json`'s object for a checked run (its "replay_json": the harness's common part) with
// this run's mode and runs, and the batches the implementation's staging rejected, each (batch,
// current pages total, staging slots), given the verdict the model gives them.
py::object replay_json(const py::dict& common, const std::string& mode, const py::list& runs, const std::vector<std::array<std::int64_t, 3>>& rejected) {
  std::vector<harness::RejectedBatch> batches;
  for (const auto& [batch, total, slots] : rejected) batches.push_back({batch, model::overflow_verdict(total, slots)});
  py::dict out = py::dict(common);
  out["mode"] = mode;
  out["runs"] = runs;
  out["rejected_batches"] = to_python(harness::rejected_json(batches));
  return out;
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
  // The registry is built at import, before any run's path, as the cpkv command builds it at start-up
  // (its --backend help): a run's check then enters each backend's file once, for its verbs.
  (void)backends::registry();
  py::class_<CheckedRequestOnly>(m, "CheckedRequest", "A torch-backend replay request checked by the harness without its trace (check_request).")
      .def("replay_line", [](const CheckedRequestOnly& c, std::int32_t layers) {
        return harness::replay_line(c.checked, model::kAllVariants.front(), layers);  // the --impl class is the variant
      }, py::arg("layers"), "The reproducer (harness replay_line): `cpkv replay TRACE --backend torch ...`.");
  m.def("check_torch_request", &check_request_only, py::arg("trace"), py::arg("options"),
        "The torch backend's replay request from options keyed by their Python spelling (impl, device, ranks, seed, layers, batch, mutant, "
        "swarm, wait_ms_max, ipc_missing_rank, timeline, no_delays, time, require_attention, attention_output, import_s_max, cpkv_bin), "
        "checked by harness check_request (the knobs' CPKV_* read there), its trace not read; InputError naming the option as `cpkv replay` "
        "spells it.");
  m.def("check_torch_run", &check_torch_run, py::arg("trace"), py::arg("options"),
        "The same request checked whole in one call (harness check_run: check_request, then check_source against the trace): the checked "
        "run as the cpkv command hands it to `python3 -m cpkv.conformance --request-fd` (format, arguments, layers, header by mode, "
        "replay_line, replay_json, import_s_max, cpkv_bin); InputError naming the option, or TraceError.");
  m.def("violation_line", &harness::violation_line, py::arg("invariant"), py::arg("rank") = -1, py::arg("batch") = -1, py::arg("layer") = -1,
        py::arg("slot") = -1, py::arg("step") = -1, py::arg("detail") = "",
        "One finding's line as every front end prints it (harness violation_line, describe's shape): "
        "'invariant 3 (overflow determinism): rank 1 batch 0: detail'; a field that does not apply is -1 and left out.");
  m.def("replay_json", &replay_json, py::arg("common"), py::arg("mode"), py::arg("runs"), py::arg("rejected"),
        "`cpkv replay --json`'s object: a checked run's replay_json with this mode, these runs and these rejected batches "
        "(batch, current pages total, staging slots).");
  m.def("foreign_run_json", &foreign_run_json, py::arg("figures"),
        "`cpkv replay --json`'s run object (harness run_json) for a foreign exchange's run: variant, mode, failure, deadlock, violations, "
        "violations_by_invariant, violation_details, seconds and per-rank batches, layers, barriers, overflows, mismatches in; passed and "
        "every common key out, what the harness cannot observe null.");
}

}  // namespace cpkv::python

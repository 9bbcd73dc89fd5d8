// cpkv replay: every batch of a trace through a backend and one or every variant, checked byte for
// byte against the model, with the protocol's invariants watched by the checkers.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backends.hpp"
#include "commands.hpp"
#include "files.hpp"
#include "model_replay.hpp"
#include "options.hpp"
#include "rejected.hpp"
#include "subprocess.hpp"
#include "cpkv/harness/interrupt.hpp"
#include "cpkv/harness/launch.hpp"
#include "cpkv/harness/replay_report.hpp"
#include "cpkv/harness/request.hpp"
#include "cpkv/harness/timeline.hpp"
#include "cpkv/model/limits.hpp"
#include "cpkv/model/plan.hpp"
#include "cpkv/sim/runner.hpp"

namespace cpkv::cli {
namespace {

struct ReplayOptions {
  std::string trace_path;
  harness::ReplayRequest request;  // every option but the files
  std::string layers = "4";
  std::optional<std::string> json_path;
  std::optional<std::string> event_log_path;
  std::optional<std::string> timeline_path;
  ModelReplayOptions model;  // --backend model
};

// Every option and file of a replay, checked in one pass for every backend before any work: options
// first (harness::check_request, shared with Python), then the inputs, then the outputs (nothing is
// created or opened for writing here), then the trace against the options (harness::check_run).
struct CheckedReplay {
  harness::CheckedRequest request;
  std::unique_ptr<InputFile> trace;
  std::unique_ptr<InputFile> schedule_file;
  std::unique_ptr<InputFile> ceilings_file;
  std::optional<model::CostParameters> ceilings;  // --backend model
  CeilingsShape ceilings_shape;
  std::unique_ptr<OutputFile> json;
  std::unique_ptr<OutputFile> event_log;
  std::unique_ptr<OutputFile> timeline;
  std::unique_ptr<OutputFile> chart;
  std::unique_ptr<OutputFile> per_batch;
};

std::optional<std::int32_t> parse_layers(const std::string& text) {
  if (text == "all") return std::nullopt;
  std::int32_t layers = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), layers);
  if (error != std::errc() || end != text.data() + text.size() || layers < 1 || layers > model::limits::layer_count_max) {
    throw OptionError(fmt::format("--layers: '{}' is not 'all' or a number in 1..{}", text, model::limits::layer_count_max));
  }
  return layers;
}

void refuse_model_options(const ReplayOptions& o, const harness::BackendEntry& backend) {
  if (!backend.model && o.model.given()) {
    throw OptionError("--ceilings, --peer-gbps, ..., --chart, --per-batch, --staging-mib, --staging-sweep, --repeat and --exact-model need --backend model");
  }
}

// What the command reads and writes, once the request's options pass: the model's options, the
// ceilings, the trace (a pipe spooled into a private file: every rank reopens it), the outputs
// (nothing is created or opened for writing here). Returns the file the trace is read from.
std::string check_files(const ReplayOptions& o, const harness::CheckedRequest& request, CheckedReplay& c) {
  refuse_model_options(o, *request.backend);
  if (o.model.ceilings_path) c.ceilings_file = std::make_unique<InputFile>("--ceilings", *o.model.ceilings_path);
  if (request.backend->model) c.ceilings = load_ceilings(o.model, c.ceilings_file.get(), &c.ceilings_shape);
  // Every rank reopens the trace: a pipe is read once, into a private spool file.
  c.trace = std::make_unique<InputFile>("trace", o.trace_path, /*spool=*/true);
  if (o.json_path) c.json = std::make_unique<OutputFile>("--json", *o.json_path);
  if (o.event_log_path) c.event_log = std::make_unique<OutputFile>("--event-log", *o.event_log_path);
  if (o.timeline_path) c.timeline = std::make_unique<OutputFile>("--timeline", *o.timeline_path);
  if (o.model.chart_path) c.chart = std::make_unique<OutputFile>("--chart", *o.model.chart_path);
  if (o.model.per_batch_path) c.per_batch = std::make_unique<OutputFile>("--per-batch", *o.model.per_batch_path);
  refuse_same_files({c.trace.get(), c.schedule_file.get(), c.ceilings_file.get()},
                    {c.json.get(), c.event_log.get(), c.timeline.get(), c.chart.get(), c.per_batch.get()});
  if (c.chart) check_chart_tools();
  return c.trace->path();
}

// The schedule file, then the whole run in one call (harness check_run): the request's options, the
// command's files (check_files), and the trace against the options for a backend that moves content
// (a handed-off run's source with it: run_handoff, whose front end checks its outputs).
void check_replay(ReplayOptions& o, CheckedReplay& c) {
  o.request.layers = parse_layers(o.layers);
  o.request.event_log = o.event_log_path;  // until the run: then the temporary file beside it (run_backend)
  o.request.timeline = o.timeline_path;
  o.request.trace_label = o.trace_path;
  if (o.model.staging_sweep) (void)parse_staging_sweep(*o.model.staging_sweep);  // bad input before any output
  if (o.request.schedule && !sim::named_schedule(*o.request.schedule, o.request.seed)) {
    c.schedule_file = std::make_unique<InputFile>("--schedule", *o.request.schedule);
  }
  c.request = harness::check_run(o.request, cpkv::backends::registry(), [&](const harness::CheckedRequest& request) { return check_files(o, request, c); });
  if (c.request.backend->handoff) refuse_model_options(o, *c.request.backend);
}

// The event log and the timeline are appended to by the run itself (sim/recording.hpp; the GPUs'
// ranks through part files merged after each variant, gpu/timeline.hpp), into the
// temporary files beside their targets; they are renamed once the runs end, also when a run failed
// or stopped (the files are complete up to there: the timeline gets its tail first).
struct StreamedOutputs {
  CheckedReplay& c;
  explicit StreamedOutputs(CheckedReplay& replay) : c(replay) {
    if (c.event_log) c.request.request.event_log = c.event_log->temporary();
    if (c.timeline) c.request.request.timeline = c.timeline->temporary();
    if (c.timeline) harness::begin_timeline(c.timeline->temporary());
  }
  void commit() {
    // The backend's clock (the scheduled simulator's steps, the GPUs' CUDA events on the host's
    // monotonic clock), else the host's wall clock: what its entry's check chose.
    if (c.timeline) harness::end_timeline(c.timeline->temporary(), c.request.timeline_clock);
    if (c.timeline) c.timeline->commit();
    if (c.event_log) c.event_log->commit();
  }
};

// A progress bar on a terminal (stderr), never in a pipe or a log.
struct ProgressBar {
  bool tty = ::isatty(STDERR_FILENO) != 0;
  std::int64_t total = 0;
  std::string label;
  void show(std::int64_t done) const {
    constexpr int width = 30;
    const int filled = total > 0 ? static_cast<int>(width * std::min(done, total) / total) : width;
    fmt::print(stderr, "\r  {:<16} [{}{}] {}/{} layers", label, std::string(filled, '#'), std::string(width - filled, ' '), std::min(done, total), total);
  }
};

// The byte columns differ from rank to rank (a rank's peers hold different shares of the batch):
// the most and the least any rank pulled, and the most any rank reduced. The others are equal on
// every rank of a run that ended.
struct ByteRange {
  std::uint64_t peer_max = 0, peer_min = 0, reduced_max = 0;
};
ByteRange byte_range(const std::vector<harness::Totals>& ranks) {
  ByteRange range;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    range.peer_max = std::max(range.peer_max, ranks[r].bytes_gathered_from_peers);
    range.peer_min = r == 0 ? ranks[r].bytes_gathered_from_peers : std::min(range.peer_min, ranks[r].bytes_gathered_from_peers);
    range.reduced_max = std::max(range.reduced_max, ranks[r].bytes_reduced);
  }
  return range;
}

constexpr const char* kRunRow = "{:<16} {:>7} {:>7} {:>14} {:>14} {:>14} {:>9} {:>11} {:>9} {:>10} {:>10}  {}";

// Through an exchange plugin, whose figure is whose (harness::Totals): the plugin's word beside
// the model's for the variant, and the ranks where they differ (a figure of 0: not counted).
void print_counted_by(const harness::RunReport& report) {
  std::uint64_t model_max = 0, model_min = 0;
  std::int64_t service = 0;
  std::string differ;
  bool plugin = false;
  for (std::size_t r = 0; r < report.ranks.size(); ++r) {
    const harness::Totals& t = report.ranks[r];
    plugin = plugin || t.counters_of_plugin != 0;
    model_max = std::max(model_max, t.model_bytes_gathered_from_peers);
    model_min = r == 0 ? t.model_bytes_gathered_from_peers : std::min(model_min, t.model_bytes_gathered_from_peers);
    service = std::max(service, t.service_barriers);
    if (t.bytes_gathered_from_peers != 0 && t.bytes_gathered_from_peers != t.model_bytes_gathered_from_peers) differ += fmt::format(" {}", r);
  }
  if (!plugin) return;
  fmt::print("  counters: peer_bytes and barriers are the plugin's own (ctx->counters); collectives and reduced are cpkv's count of all_reduce_sum "
             "and all_gather (and {} device barriers of its IPC collectives at most); the model's peer_bytes for the variant run ({}): max {} min {}{}\n",
             service, model::to_string(report.variant), model_max, model_min,
             differ.empty() ? "" : fmt::format(" -- the plugin's differ on rank(s){}", differ));
}

void print_run(const harness::VariantRun& run) {
  const harness::RunReport& report = run.report;
  const harness::Totals& r0 = report.ranks.empty() ? harness::Totals{} : report.ranks[0];
  const ByteRange bytes = byte_range(report.ranks);
  fmt::print(fmt::runtime(std::string(kRunRow) + " ({:.2f} s)\n"), model::to_string(run.variant), r0.batches, r0.layers, bytes.peer_max,
             bytes.peer_min, bytes.reduced_max, r0.barriers, r0.collectives, r0.overflows, report.mismatches(), report.violation_count,
             report.passed() ? "pass" : "FAIL", run.seconds);
  print_counted_by(report);
  if (!report.passed()) {
    for (const std::string& line : harness::failure_lines(report, run.replay_line)) fmt::print("  {}\n", line);
  }
  std::fflush(stdout);  // each variant's verdict is out as it ends (a stopped rank's report within its window), not at exit
}

void run_backend(CheckedReplay& c) {
  StreamedOutputs streamed(c);
  const harness::BatchSource& source = c.request.source->source;  // opened and scanned by the request check (check_replay)
  const harness::ScannedSource& scanned = c.request.source->scanned;
  ProgressBar bar;
  bar.total = scanned.scan.shape.batches * scanned.layers;  // moves per layer: a one-batch trace does not sit at 0/1
  harness::ProgressFunction progress;
  if (bar.tty) progress = [&bar](std::int64_t done) { bar.show(done); };
  // The one backend interface, built by the backend's registry entry.
  const std::unique_ptr<harness::Backend> backend = c.request.backend->replay(c.request, source, scanned, progress);
  const std::string mode = backend->name();
  for (const std::string& line : harness::run_header_lines("cpkv replay", c.request, source, scanned, mode)) fmt::print("{}\n", line);
  std::fflush(stdout);
  print_rejected("cpkv replay", scanned.scan.rejected);
  fmt::print("bytes over ranks: the most and the least any rank pulled from its peers, the most any rank reduced\n");
  fmt::print(fmt::runtime(std::string(kRunRow) + "\n"), "variant", "batches", "layers", "peer_bytes max", "peer_bytes min", "reduced max",
             "barriers", "collectives", "overflow", "mismatch", "violation", "result");
  nlohmann::json json_runs = nlohmann::json::array();
  bool failed = false;
  const auto on_start = [&](model::Variant variant) {
    bar.label = std::string(model::to_string(variant));
    if (bar.tty) bar.show(0);
  };
  try {
    harness::run_variants(c.request, source, scanned, *backend, on_start, [&](const harness::VariantRun& run) {
      if (bar.tty) fmt::print(stderr, "\r\033[K");
      print_run(run);
      failed = failed || !run.report.passed();
      json_runs.push_back(harness::run_json(run.report, run.seconds));
    });
  } catch (...) {
    try {
      streamed.commit();  // what was written up to the failure, kept whole
    } catch (const std::exception&) {
      // the run's own failure is the one to report
    }
    throw;
  }
  streamed.commit();
  if (c.json) c.json->write(harness::replay_json(c.request, scanned, mode, json_runs).dump(2) + "\n");
  exit_status() = failed ? kExitFailure : kExitOk;
}

// How long the interpreter may take to import what a handed-off run needs (torch: about 2.5 s on an
// idle machine, far more on a loaded one) before it counts as unable to.
constexpr std::chrono::milliseconds kHandoffProbeLimit{180'000};

// The checked run (harness::HandedRun::checked) in a memory file the interpreter inherits across
// the exec, read from its start: not a pipe, so nothing waits on its size, and not a path, so a
// command typed by hand cannot name one by accident (`--request-fd N`).
int handed_run_fd(const harness::BackendEntry& entry, const nlohmann::json& checked) {
  const std::string text = checked.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  const int fd = ::memfd_create("cpkv-checked-run", 0);  // no MFD_CLOEXEC: the interpreter inherits it
  std::size_t written = 0;
  while (fd >= 0 && written < text.size()) {
    const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    written += static_cast<std::size_t>(n);
  }
  if (fd < 0 || written != text.size() || ::lseek(fd, 0, SEEK_SET) != 0) {
    throw OptionError(fmt::format("--backend {}: cannot hand the checked run over: {}", entry.name, std::strerror(errno)));
  }
  return fd;
}

// A backend whose run is another front end's (torch: Python's conformance harness), checked whole
// by the request check (harness check_run: the source scanned, the header and reproducer built):
// the checked run handed over on a file descriptor, the interpreter probed in a bounded child, then
// this process becomes that run (exec): its output, its signals and its exit status are the run's.
// Where the interpreter cannot run it, one line names the Python command that would.
void run_handoff(const ReplayOptions& o, const CheckedReplay& c) {
  const harness::BackendEntry& entry = *c.request.backend;
  const harness::HandedRun& handed = *c.request.handed;
  std::vector<std::string> args = handed.arguments;
  if (o.json_path) args.insert(args.end(), {"--json", *o.json_path});
  const std::size_t typed = args.size();  // the command as typed by hand: without the descriptor
  args.insert(args.end(), {"--request-fd", std::to_string(handed_run_fd(entry, handed.checked))});
  const PythonRefusal refusal = exec_python(args, "import torch, cpkv.conformance", kHandoffProbeLimit);
  std::string command = "python3";
  for (std::size_t i = 0; i < typed; ++i) command += " " + harness::shell_word(args[i]);
  throw OptionError(fmt::format("--backend {}: {} ({}) cannot run the conformance harness ({}); the same run is `{}` under an interpreter that "
                                "imports torch and cpkv (Debian: python3-torch; PYTHONPATH=<build>/python), or set CPKV_PYTHON to one",
                                entry.name, refusal.program, refusal.origin, refusal.reason, command));
}

// The conformance harness's run modes and knobs (--backend torch; the request check refuses them elsewhere).
void add_conformance_options(CLI::App* cmd, harness::ReplayRequest& r) {
  cmd->add_flag("--no-delays", r.no_delays, "torch: no injected delays");
  cmd->add_flag("--time", r.time, "torch: checks, delays and event hooks off; each layer's compose time measured (median and p90)");
  cmd->add_flag("--require-attention", r.require_attention, "torch: fail an implementation whose compose_layer returns no \"attention\" plan");
  cmd->add_flag("--attention-output", r.attention_output,
                "torch: run cpkv.attention.reference over each rank's buffer and plan, compared bit for bit with the single device");
  cmd->add_option("--import-s-max", r.import_s_max, "torch: the bound on importing --impl in its probe child, in seconds (default: CPKV_IMPORT_S_MAX, else 120)");
  cmd->add_option("--cpkv-bin", r.cpkv_bin, "torch: the cpkv binary --time runs for the built-in staging_direct (default: CPKV_BIN, else the build's)");
}

void run_replay(ReplayOptions& o) {
  CheckedReplay c;
  check_replay(o, c);
  if (c.request.backend->handoff) return run_handoff(o, c);
  if (c.request.backend->model) {
    ModelReplayRun run{c.request.backend->model, o.trace_path, c.trace->path(), o.request.batch, *c.ceilings, c.json.get(), c.chart.get(), c.per_batch.get(), c.ceilings_shape};
    return run_model_replay(run, o.model);
  }
  run_backend(c);
}

}  // namespace

void register_replay(CLI::App& app) {
  auto o = std::make_shared<ReplayOptions>();
  CLI::App* cmd = app.add_subcommand("replay",
                                     "Replay every batch of a trace through a backend (--backend: the rank simulator, the GPUs, or the model) with "
                                     "one, several or every exchange variant, checking every dense byte against the model and the protocol's "
                                     "invariants (the model backend moves no content: it reports plans, verdicts, bytes and modelled time).");
  cmd->add_option("trace", o->trace_path, "batch trace (JSON Lines, format cpkv-batch-trace v1)")->required();
  cmd->add_option("--backend", o->request.backend, backends_help())->capture_default_str();
  cmd->add_option("--variant", o->request.variant, fmt::format("a variant ({}), a comma-separated list of them, or 'all'", model::variant_names()))->capture_default_str();
  cmd->add_option("--ranks-as", o->request.ranks_as, "sim, free-running: ranks as 'processes' (fork, the default) or 'threads'");
  cmd->add_option("--schedule", o->request.schedule,
                  "run the ranks as step machines under a schedule instead: 'random' (from --seed), 'round-robin', or a FILE of choices");
  cmd->add_option("--seed", o->request.seed, "the one seed of every random choice (content, schedule, injected delays)")->capture_default_str()->check(seed_value());
  cmd->add_option("--mutant", o->request.mutant, fmt::format("switch on a planted bug: {} (the simulator holds the protocol's; cuda: {}; around an --exchange plugin the harness holds: {})", harness::mutant_names(), harness::mutant_names(harness::kGpuHolds), harness::mutant_names(harness::kHarnessHolds)))->capture_default_str();
  cmd->add_option("--layers", o->layers, "layers simulated per batch: a number or 'all'")->capture_default_str();
  cmd->add_option("--batch", o->request.batch, "only this batch (0-based)")->check(whole_in<std::int64_t>(0, std::numeric_limits<std::int64_t>::max()));
  cmd->add_option("--wait-ms-max", o->request.wait_ms_max, "bound on any single wait of a rank (default: sim 20000, cuda 120000)")->check(whole_in<std::int64_t>(1, option_limits::wait_ms_max));
  cmd->add_option("--stuck-ms-max", o->request.stuck_ms_max,
                  "rank processes (sim and cuda): end the run when no rank made progress this long, naming the rank that did not "
                  "(default: cuda 30000, sim twice --wait-ms-max; at least 100: a shorter silence is a loaded machine's scheduling, not a hang)")
      ->check(whole_in<std::int64_t>(harness::kStuckMsFloor, option_limits::wait_ms_max));
  cmd->add_option("--ipc-missing-rank", o->request.ipc_missing_rank, "fault: this rank's IPC capability probe fails")->check(whole_in<std::int32_t>(0, model::limits::cp_max - 1));
  cmd->add_flag("--swarm", o->request.swarm,
                "free-running sim: draw every fault knob (delay probabilities and lengths, the slow rank, where it is slow and how it rotates, "
                "where ranks yield) from --seed and print them, instead of the fixed defaults; cuda: a rotating slow rank whose spin before its exchange is drawn from --seed");
  cmd->add_option("--exchange", o->request.exchange,
                  "cuda: run this exchange plugin (a shared object exporting cpkv_exchange_v1, include/cpkv/exchange_abi.h) instead of cpkv's own "
                  "fused compose, under the same checks; its own planted bugs and the harness's (stale_page_inverse, reused_plan, unzeroed_rows) "
                  "are taken by --mutant (default: CPKV_EXCHANGE, else builtin)");
  add_knob_options(cmd, o->request);
  cmd->add_option("--impl", o->request.impl,
                  "torch: the exchange class to run under the conformance harness, module:Class or path/to/file.py:Class, with constructor "
                  "arguments as 'module:Class(k=v, ...)' (docs/conformance.md); the run is `python3 -m cpkv.conformance` (CPKV_PYTHON picks the interpreter)");
  cmd->add_option("--device", o->request.device, "torch: the ranks' device, cpu (gloo; the default) or cuda (NCCL, CUDA IPC)")->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--ranks", o->request.ranks, "torch: the rank processes to spawn (default: the trace's cp, which it must be)")
      ->check(whole_in<std::int32_t>(1, model::limits::cp_max));
  add_conformance_options(cmd, o->request);
  cmd->add_option("--json", o->json_path, "also write the results as JSON to this file (a regular file, replaced only when the run completes)");
  cmd->add_option("--event-log", o->event_log_path,
                  "scheduled runs: write the event log (one step a line, docs/event-log.md) to this file as the run goes (a regular file)");
  cmd->add_option("--timeline", o->timeline_path,
                  "sim and cuda: write a timeline (Chrome trace event format, JSON: opens in Perfetto and chrome://tracing; one track per rank, "
                  "docs/event-log.md) to this file as the run goes; scheduled runs count scheduler steps, free-running ones microseconds, "
                  "cuda CUDA events around each layer's launches on the host's monotonic clock");
  add_model_replay_options(cmd, o->model);
  cmd->callback([o] { run_replay(*o); });
}

}  // namespace cpkv::cli

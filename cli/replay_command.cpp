// cpkv replay: every batch of a trace through a backend and one or every variant, checked byte for
// byte against the model, with the protocol's invariants watched by the checkers.
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "files.hpp"
#include "model_replay.hpp"
#include "options.hpp"
#include "rejected.hpp"
#include "cpkv/harness/interrupt.hpp"
#include "cpkv/harness/replay_report.hpp"
#include "cpkv/model/limits.hpp"
#include "cpkv/model/plan.hpp"
#include "cpkv/sim/backend.hpp"
#include "cpkv/sim/runner.hpp"
#if CPKV_HAVE_CUDA_BACKEND
#include "cuda_backend.hpp"
#endif
#include "cpkv/sim/shared_region.hpp"

namespace cpkv::cli {
namespace {

struct ReplayOptions {
  std::string trace_path;
  std::string backend = "sim";
  std::string variant = "all";
  std::string ranks_as = "processes";
  std::optional<std::string> schedule;
  std::uint64_t seed = 1;
  std::string mutant = "none";
  std::string layers = "4";
  std::optional<std::int64_t> batch;
  std::int64_t wait_ms_max = 20000;
  bool wait_ms_max_given = false;  // the GPU backend keeps its own longer default unless asked
  std::optional<std::int64_t> stuck_ms_max;
  std::int32_t ipc_missing_rank = -1;
  bool swarm = false;  // free-running: draw every fault knob from --seed instead of the fixed defaults
  std::optional<std::string> json_path;
  std::optional<std::string> event_log_path;
  ModelReplayOptions model;  // --backend model
};

// Every option and file of a replay, checked in one pass for every backend before any work: options
// first, then the inputs, then the outputs (nothing is created or opened for writing here).
struct CheckedReplay {
  std::vector<model::Variant> variants;
  sim::Mutant mutant = sim::Mutant::none;
  std::optional<std::int32_t> layers;  // nullopt: all
  std::optional<sim::Schedule> schedule;
  std::unique_ptr<InputFile> trace;
  std::unique_ptr<InputFile> schedule_file;
  std::unique_ptr<InputFile> ceilings_file;
  std::optional<Ceilings> ceilings;  // --backend model
  std::unique_ptr<OutputFile> json;
  std::unique_ptr<OutputFile> event_log;
  std::unique_ptr<OutputFile> chart;
};

std::vector<model::Variant> selected_variants(const std::string& name) {
  auto variants = harness::variants_named(name);
  if (!variants) throw OptionError(fmt::format("--variant: unknown variant '{}' (or 'all')", name));
  return *std::move(variants);
}

std::optional<std::int32_t> parse_layers(const std::string& text) {
  if (text == "all") return std::nullopt;
  std::int32_t layers = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), layers);
  if (error != std::errc() || end != text.data() + text.size() || layers < 1 || layers > model::limits::layer_count_max) {
    throw OptionError(fmt::format("--layers: '{}' is not 'all' or a number in 1..{}", text, model::limits::layer_count_max));
  }
  return layers;
}

void check_backend(const ReplayOptions& o) {
#if CPKV_HAVE_CUDA_BACKEND
  if (o.backend != "sim" && o.backend != "cuda" && o.backend != "model") throw OptionError(fmt::format("--backend: '{}' is not one of sim, cuda, model", o.backend));
#else
  if (o.backend != "sim" && o.backend != "model") {
    throw OptionError(fmt::format("--backend: '{}' is not available in this build (sim, model; cuda needs nvcc and NCCL at configure time)", o.backend));
  }
#endif
  if (o.backend != "model" && o.model.given()) throw OptionError("--ceilings, --peer-gbps, ..., --chart, --repeat and --exact-model need --backend model");
}

// The options that need no file.
void check_options(const ReplayOptions& o, CheckedReplay& c) {
  check_backend(o);
  c.variants = selected_variants(o.variant);
  const auto mutant = sim::parse_mutant(o.mutant);
  if (!mutant) throw OptionError(fmt::format("--mutant: unknown mutant '{}'", o.mutant));
  c.mutant = *mutant;
#if CPKV_HAVE_CUDA_BACKEND
  if (o.backend == "cuda" && !cuda::gpu_supports_mutant(c.mutant)) {
    throw OptionError(fmt::format("--mutant: '{}' exists in the simulator only; --backend cuda has single_half, no_barrier, skip_zero and "
                                  "barrier_passes_early", o.mutant));
  }
#endif
  if (o.backend == "model" && c.mutant != sim::Mutant::none) {
    throw OptionError(fmt::format("--mutant: planted bugs exist in the simulator and the GPU backend only; --backend {} moves no content", o.backend));
  }
  c.layers = parse_layers(o.layers);
  if (o.ranks_as != "processes" && o.ranks_as != "threads") throw OptionError(fmt::format("--ranks-as: '{}' is not processes or threads", o.ranks_as));
  if (o.swarm && (o.schedule || o.backend != "sim")) throw OptionError("--swarm: fault knobs exist only for free-running simulator ranks (no --schedule, --backend sim)");
  if (o.event_log_path && !o.schedule) throw OptionError("--event-log: only scheduled runs (--schedule) have an event log");
  if (o.event_log_path && c.variants.size() != 1) throw OptionError("--event-log: give one --variant (the log is one run's)");
}

// The inputs (trace, schedule file, ceilings file), then the outputs, then what needs the trace.
void check_files(const ReplayOptions& o, CheckedReplay& c) {
  if (o.schedule) c.schedule = sim::named_schedule(*o.schedule, o.seed);
  if (o.schedule && !c.schedule) {
    c.schedule_file = std::make_unique<InputFile>("--schedule", *o.schedule);
    try {
      c.schedule = sim::read_schedule_file(c.schedule_file->path());
    } catch (const std::exception& e) {
      throw OptionError(fmt::format("--schedule: {}", e.what()));
    }
  }
  if (c.schedule && o.backend != "sim") throw OptionError(fmt::format("--schedule: scheduled runs exist in the simulator only, not --backend {}", o.backend));
  if (o.model.ceilings_path) c.ceilings_file = std::make_unique<InputFile>("--ceilings", *o.model.ceilings_path);
  if (o.backend == "model") c.ceilings = load_ceilings(o.model, c.ceilings_file.get());
  // Every rank reopens the trace: a pipe is read once, into a private spool file.
  c.trace = std::make_unique<InputFile>("trace", o.trace_path, /*spool=*/true);
  if (o.json_path) c.json = std::make_unique<OutputFile>("--json", *o.json_path);
  if (o.event_log_path) c.event_log = std::make_unique<OutputFile>("--event-log", *o.event_log_path);
  if (o.model.chart_path) c.chart = std::make_unique<OutputFile>("--chart", *o.model.chart_path);
  refuse_same_files({c.trace.get(), c.schedule_file.get(), c.ceilings_file.get()}, {c.json.get(), c.event_log.get(), c.chart.get()});
  if (c.chart) check_chart_tools();
}

std::string replay_line(const ReplayOptions& o, model::Variant variant, std::int32_t layers) {
  std::string line = fmt::format("cpkv replay {} --backend {} --variant {} --seed {} --layers {}", o.trace_path, o.backend,
                                 model::to_string(variant), o.seed, layers);
  if (o.backend == "cuda") {
  } else if (o.schedule) {
    line += fmt::format(" --schedule {}", *o.schedule);
  } else {
    line += fmt::format(" --ranks-as {}", o.ranks_as);
    if (o.swarm) line += " --swarm";
  }
  if (o.mutant != "none") line += fmt::format(" --mutant {}", o.mutant);
  if (o.batch) line += fmt::format(" --batch {}", *o.batch);
  if (o.ipc_missing_rank >= 0) line += fmt::format(" --ipc-missing-rank {}", o.ipc_missing_rank);
  return line;
}

void print_failure(const sim::RunReport& report, const std::string& line) {
  if (!report.failure.empty()) fmt::print("  {}\n", report.failure);
  for (const sim::Violation& v : report.violations) fmt::print("  {}\n", sim::describe(v));
  for (const auto& t : report.ranks) {
    if (t.first_mismatch[0] != '\0') {
      fmt::print("  {}\n", t.first_mismatch);
      break;
    }
  }
  fmt::print("  replay: {}\n", line);
}

// Free-running ranks: the fixed default fault knobs, or (--swarm) every knob drawn from --seed.
sim::FaultOptions fault_options(const ReplayOptions& o) {
  if (o.swarm) return sim::swarm_faults(o.seed);
  sim::FaultOptions faults;
  faults.seed = o.seed;
  return faults;
}

std::unique_ptr<sim::Backend> make_backend(const ReplayOptions& o, const CheckedReplay& c, const sim::RunLimits& limits) {
  if (o.backend == "cuda") {
#if CPKV_HAVE_CUDA_BACKEND
    if (cuda::gpu_count() == 0) throw OptionError("--backend cuda: no CUDA device is visible on this machine");
    cuda::CudaOptions cuda_options;
    if (o.stuck_ms_max) cuda_options.stuck_ms_max = *o.stuck_ms_max;
    if (o.wait_ms_max_given) cuda_options.wait_ms_max = o.wait_ms_max;
    cuda_options.on_progress = limits.on_progress;
    return cuda::make_cuda_backend(cuda_options);
#endif
  }
  if (c.schedule) return sim::make_scheduled_backend(*c.schedule, limits, c.event_log != nullptr);
  const sim::FaultOptions faults = fault_options(o);
  return sim::make_free_backend(o.ranks_as == "threads" ? sim::RanksAs::threads : sim::RanksAs::processes, faults, limits);
}

// The source and its scan, validated before any rank starts.
struct ReplaySource {
  sim::BatchSource source;
  harness::SourceScan trace;
  std::int32_t layer_count = 0;
  std::int32_t layers = 0;  // simulated per batch
  int stale = 0;            // stale shared-memory regions removed
};

ReplaySource replay_source(const ReplayOptions& o, const CheckedReplay& c) {
  // One pass before any rank starts: every line validated (a bad line late in the file is bad input),
  // the largest batch measured (the world is carved once), every batch's overflow verdict.
  ReplaySource r{sim::BatchSource::from_trace(c.trace->path(), o.batch)};
  r.trace = harness::scan(r.source);
  if (o.batch && r.trace.shape.batches == 0) throw OptionError(fmt::format("--batch: {} is not in {}", *o.batch, o.trace_path));
  r.layer_count = r.source.setting.layer_count();
  r.layers = std::min(c.layers.value_or(r.layer_count), r.layer_count);
  if (o.ipc_missing_rank >= r.source.setting.cp) {
    throw OptionError(fmt::format("--ipc-missing-rank: {} is not a rank of cp = {}", o.ipc_missing_rank, r.source.setting.cp));
  }
  r.stale = sim::sweep_stale_regions();
  if (o.backend == "sim") {  // a /dev/shm too small is one line before any output, not a SIGBUS mid-run
    sim::SimOptions sized;
    sized.layers = r.layers;
    sim::World::check_space(sim::world_geometry(r.source, sized, r.trace.shape));
  }
  return r;
}

void write_event_log(const CheckedReplay& c, const sim::RunReport& report) {
  if (!c.event_log) return;
  std::string text;
  for (const std::string& e : report.event_log) text += e + "\n";
  c.event_log->write(text);
}

void run_backend(const ReplayOptions& o, CheckedReplay& c) {
  const ReplaySource rs = replay_source(o, c);
  const sim::BatchSource& source = rs.source;
  const harness::SourceScan& trace = rs.trace;
  const std::int32_t layers = rs.layers;
  sim::RunLimits limits;
  limits.wait_ms_max = o.wait_ms_max;
  if (o.stuck_ms_max) limits.stuck_ms_max = *o.stuck_ms_max;
  // A progress bar on a terminal (stderr), never in a pipe or a log.
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  std::string progress_label;
  if (tty) {
    limits.on_progress = [&, total = trace.shape.batches](std::int64_t done) {
      constexpr int width = 30;
      const int filled = total > 0 ? static_cast<int>(width * std::min(done, total) / total) : width;
      fmt::print(stderr, "\r  {:<16} [{}{}] {}/{} batches", progress_label, std::string(filled, '#'), std::string(width - filled, ' '), done, total);
    };
  }
  // The one backend interface: the simulator (free-running or scheduled) or the GPUs.
  std::unique_ptr<sim::Backend> backend = make_backend(o, c, limits);
  const std::string mode = backend->name();
  fmt::print("cpkv replay: {} | cp {} page {} | {} batches | {} of {} layers | mode {} | seed {}{}\n", o.trace_path, source.setting.cp,
             source.setting.page_size, trace.shape.batches, layers, rs.layer_count, mode, o.seed,
             rs.stale > 0 ? fmt::format(" | removed {} stale shared-memory regions", rs.stale) : "");
  if (o.backend == "sim" && !c.schedule) fmt::print("{}: {}\n", o.swarm ? "swarm knobs" : "fault knobs", sim::describe(fault_options(o)));
  if (c.mutant != sim::Mutant::none) fmt::print("MUTANT ACTIVE: {} (a planted bug; this run is expected to fail)\n", sim::to_string(c.mutant));
  std::fflush(stdout);
  print_rejected("cpkv replay", trace.rejected);

  nlohmann::json json_runs = nlohmann::json::array();
  std::vector<std::string> failures;
  fmt::print("{:<16} {:>7} {:>7} {:>14} {:>14} {:>9} {:>11} {:>9} {:>10} {:>10}  {}\n", "variant", "batches", "layers", "peer_bytes/rank",
             "reduced/rank", "barriers", "collectives", "overflow", "mismatch", "violation", "result");
  for (model::Variant variant : c.variants) {
    progress_label = std::string(model::to_string(variant));
    if (tty) limits.on_progress(0);
    sim::SimOptions options;
    options.variant = variant;
    options.layers = layers;
    options.seed = o.seed;
    options.mutant = c.mutant;
    options.ipc_missing_rank = o.ipc_missing_rank;
    harness::set_activity(fmt::format("cpkv replay {} variant {} ({})", o.trace_path, model::to_string(variant), mode));
    const auto start = std::chrono::steady_clock::now();
    const sim::RunReport report = backend->run(source, options);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (tty) fmt::print(stderr, "\r\033[K");
    const sim::Totals& r0 = report.ranks.empty() ? sim::Totals{} : report.ranks[0];
    fmt::print("{:<16} {:>7} {:>7} {:>14} {:>14} {:>9} {:>11} {:>9} {:>10} {:>10}  {} ({:.2f} s)\n", model::to_string(variant), r0.batches,
               r0.layers, r0.bytes_gathered_from_peers, r0.bytes_reduced, r0.barriers, r0.collectives, r0.overflows, report.mismatches(),
               report.violation_count, report.passed() ? "pass" : "FAIL", seconds);
    if (!report.passed()) {
      failures.push_back(replay_line(o, variant, layers));
      print_failure(report, failures.back());
    }
    std::fflush(stdout);  // each variant's verdict is out as it ends (a stopped rank's report within its window), not at exit
    write_event_log(c, report);
    json_runs.push_back(harness::run_json(report, seconds));
  }
  if (c.json) {
    const nlohmann::json out = {{"trace", o.trace_path}, {"seed", o.seed}, {"layers", layers}, {"mode", mode}, {"mutant", o.mutant},
                                {"rejected_batches", rejected_json(trace.rejected)}, {"runs", json_runs}};
    c.json->write(out.dump(2) + "\n");
  }
  exit_status() = failures.empty() ? kExitOk : kExitFailure;
}

void run_replay(const ReplayOptions& o) {
  CheckedReplay c;
  check_options(o, c);
  check_files(o, c);
  if (o.backend == "model") {
    ModelReplayRun run{o.trace_path, c.trace->path(), o.batch, *c.ceilings, c.json.get(), c.chart.get()};
    return run_model_replay(run, o.model);
  }
  run_backend(o, c);
}

}  // namespace

void register_replay(CLI::App& app) {
  auto o = std::make_shared<ReplayOptions>();
  CLI::App* cmd = app.add_subcommand("replay",
                                     "Replay every batch of a trace through the rank simulator (cp fake ranks over shared memory) with one or "
                                     "every exchange variant, checking every dense byte against the model and the protocol's invariants.");
  cmd->add_option("trace", o->trace_path, "batch trace (JSON Lines, format cpkv-batch-trace v1)")->required();
  cmd->add_option("--backend", o->backend, "sim (the rank simulator), cuda (one process per GPU rank, CUDA IPC and NCCL) or model (plans, verdicts, bytes and modelled time of every batch, no content)")->capture_default_str();
  cmd->add_option("--variant", o->variant, "a variant name or 'all'")->capture_default_str();
  cmd->add_option("--ranks-as", o->ranks_as, "free-running ranks as 'processes' (fork) or 'threads'")->capture_default_str();
  cmd->add_option("--schedule", o->schedule,
                  "run the ranks as step machines under a schedule instead: 'random' (from --seed), 'round-robin', or a FILE of choices");
  cmd->add_option("--seed", o->seed, "the one seed of every random choice (content, schedule, injected delays)")->capture_default_str()->check(seed_value());
  cmd->add_option("--mutant", o->mutant, "switch on a planted bug (none, single_half, no_barrier, ...)")->capture_default_str();
  cmd->add_option("--layers", o->layers, "layers simulated per batch: a number or 'all'")->capture_default_str();
  cmd->add_option("--batch", o->batch, "only this batch (0-based)")->check(whole_in<std::int64_t>(0, std::numeric_limits<std::int64_t>::max()));
  cmd->add_option("--wait-ms-max", o->wait_ms_max, "bound on any single wait of a free-running rank")->capture_default_str()->each([o](const std::string&) { o->wait_ms_max_given = true; })->check(whole_in<std::int64_t>(1, option_limits::wait_ms_max));
  cmd->add_option("--stuck-ms-max", o->stuck_ms_max,
                  "rank processes (sim and cuda): end the run when no rank made progress this long, naming the rank that did not "
                  "(default: cuda 30000, sim twice --wait-ms-max)")
      ->check(whole_in<std::int64_t>(1, option_limits::wait_ms_max));
  cmd->add_option("--ipc-missing-rank", o->ipc_missing_rank, "fault: this rank's IPC capability probe fails")->check(whole_in<std::int32_t>(0, model::limits::cp_max - 1));
  cmd->add_flag("--swarm", o->swarm,
                "free-running: draw every fault knob (delay probabilities and lengths, the slow rank, where it is slow and how it rotates, "
                "where ranks yield) from --seed and print them, instead of the fixed defaults");
  cmd->add_option("--json", o->json_path, "also write the results as JSON to this file (a regular file, replaced only when the run completes)");
  cmd->add_option("--event-log", o->event_log_path, "scheduled runs: write the event log (one step a line) to this file (a regular file)");
  add_model_replay_options(cmd, o->model);
  cmd->callback([o] { run_replay(*o); });
}

}  // namespace cpkv::cli

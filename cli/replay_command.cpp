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
#include "model_replay.hpp"
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
  std::int32_t ipc_missing_rank = -1;
  bool swarm = false;  // free-running: draw every fault knob from --seed instead of the fixed defaults
  std::optional<std::string> json_path;
  std::optional<std::string> event_log_path;
  ModelReplayOptions model;  // --backend model
};

std::vector<model::Variant> selected_variants(const std::string& name) {
  if (name == "all") return {model::kAllVariants.begin(), model::kAllVariants.end()};
  const auto variant = model::parse_variant(name);
  if (!variant) throw OptionError(fmt::format("--variant: unknown variant '{}' (or 'all')", name));
  return {*variant};
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

void run_replay(const ReplayOptions& o) {
  if (o.backend == "model") return run_model_replay(o.trace_path, o.batch, o.json_path, o.model);
  if (o.model.given()) throw OptionError("--ceilings, --peer-gbps, ..., --chart, --repeat and --exact-model need --backend model");
#if CPKV_HAVE_CUDA_BACKEND
  if (o.backend != "sim" && o.backend != "cuda") throw OptionError(fmt::format("--backend: '{}' is not one of sim, cuda, model", o.backend));
#else
  if (o.backend != "sim") {
    throw OptionError(fmt::format("--backend: '{}' is not available in this build (sim, model; cuda needs nvcc and NCCL at configure time)", o.backend));
  }
#endif
  const auto mutant = sim::parse_mutant(o.mutant);
  if (!mutant) throw OptionError(fmt::format("--mutant: unknown mutant '{}'", o.mutant));
  const std::vector<model::Variant> variants = selected_variants(o.variant);
  if (o.backend == "cuda" && *mutant != sim::Mutant::none) {
    throw OptionError(fmt::format("--mutant: planted bugs exist in the simulator only; --backend cuda runs the correct protocol"));
  }
  // Output files are opened before any work, so an unwritable path is bad input, not a late failure.
  const auto check_writable = [](const std::optional<std::string>& path, const char* option) {
    if (!path) return;
    std::FILE* f = std::fopen(path->c_str(), "w");
    if (f == nullptr) throw OptionError(fmt::format("{}: cannot write {}", option, *path));
    std::fclose(f);
  };
  check_writable(o.json_path, "--json");
  check_writable(o.event_log_path, "--event-log");
  if (o.event_log_path && !o.schedule) throw OptionError("--event-log: only scheduled runs (--schedule) have an event log");
  if (o.event_log_path && variants.size() != 1) throw OptionError("--event-log: give one --variant (the log is one run's)");
  if (o.swarm && (o.schedule || o.backend == "cuda")) throw OptionError("--swarm: fault knobs exist only for free-running simulator ranks (no --schedule, --backend sim)");
  if (o.ranks_as != "processes" && o.ranks_as != "threads") throw OptionError(fmt::format("--ranks-as: '{}' is not processes or threads", o.ranks_as));

  // Validate the whole trace before any rank starts (a bad line late in the file is bad input).
  sim::BatchSource source = sim::BatchSource::from_trace(o.trace_path, o.batch);
  const sim::SourceShape shape = sim::measure(source);
  if (o.batch && shape.batches == 0) throw OptionError(fmt::format("--batch: {} is not in {}", *o.batch, o.trace_path));
  const std::int32_t layer_count = source.setting.layer_count();
  std::int32_t layers = layer_count;
  if (o.layers != "all") {
    const auto [end, error] = std::from_chars(o.layers.data(), o.layers.data() + o.layers.size(), layers);
    if (error != std::errc() || end != o.layers.data() + o.layers.size()) {
      throw OptionError(fmt::format("--layers: '{}' is not a number or 'all'", o.layers));
    }
    if (layers < 1) throw OptionError(fmt::format("--layers: {} is less than 1", layers));
    layers = std::min(layers, layer_count);
  }
  if (o.ipc_missing_rank >= source.setting.cp) throw OptionError(fmt::format("--ipc-missing-rank: {} is not a rank of cp = {}", o.ipc_missing_rank, source.setting.cp));
  std::optional<sim::Schedule> schedule;
  if (o.schedule) {
    if (*o.schedule == "random") {
      schedule = sim::Schedule{sim::ScheduleKind::random, {}, o.seed};
    } else if (*o.schedule == "round-robin") {
      schedule = sim::Schedule{sim::ScheduleKind::round_robin, {}, o.seed};
    } else {
      try {
        schedule = sim::read_schedule_file(*o.schedule);
      } catch (const std::exception& e) {
        throw OptionError(fmt::format("--schedule: {}", e.what()));
      }
    }
  }
  const int stale = sim::sweep_stale_regions();
  // The one backend interface: the simulator (free-running or scheduled) or the GPUs.
  std::unique_ptr<sim::Backend> backend;
  std::string fault_knobs;  // free-running: the knobs in force, printed in the header
  sim::RunLimits limits;
  limits.wait_ms_max = o.wait_ms_max;
  // A progress bar on a terminal (stderr), never in a pipe or a log.
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  std::string progress_label;
  if (tty) {
    limits.on_progress = [&, total = shape.batches](std::int64_t done) {
      constexpr int width = 30;
      const int filled = total > 0 ? static_cast<int>(width * std::min(done, total) / total) : width;
      fmt::print(stderr, "\r  {:<16} [{}{}] {}/{} batches", progress_label, std::string(filled, '#'), std::string(width - filled, ' '), done, total);
    };
  }
  if (o.backend == "cuda") {
#if CPKV_HAVE_CUDA_BACKEND
    if (cuda::gpu_count() == 0) throw OptionError("--backend cuda: no CUDA device is visible on this machine");
    backend = cuda::make_cuda_backend(cuda::CudaOptions{});
#endif
  } else if (schedule) {
    backend = sim::make_scheduled_backend(*schedule, limits, o.event_log_path.has_value());
  } else {
    sim::FaultOptions faults;
    faults.seed = o.seed;
    if (o.swarm) faults = sim::swarm_faults(o.seed);
    fault_knobs = sim::describe(faults);
    backend = sim::make_free_backend(o.ranks_as == "threads" ? sim::RanksAs::threads : sim::RanksAs::processes, faults, limits);
  }
  const std::string mode = backend->name();
  fmt::print("cpkv replay: {} | cp {} page {} | {} batches | {} of {} layers | mode {} | seed {}{}\n", o.trace_path, source.setting.cp,
             source.setting.page_size, shape.batches, layers, layer_count, mode, o.seed,
             stale > 0 ? fmt::format(" | removed {} stale shared-memory regions", stale) : "");
  if (!fault_knobs.empty()) fmt::print("{}: {}\n", o.swarm ? "swarm knobs" : "fault knobs", fault_knobs);
  if (*mutant != sim::Mutant::none) fmt::print("MUTANT ACTIVE: {} (a planted bug; this run is expected to fail)\n", sim::to_string(*mutant));
  std::fflush(stdout);

  nlohmann::json json_runs = nlohmann::json::array();
  std::vector<std::string> failures;
  fmt::print("{:<16} {:>7} {:>7} {:>14} {:>14} {:>9} {:>11} {:>9} {:>10} {:>10}  {}\n", "variant", "batches", "layers", "peer_bytes/rank",
             "reduced/rank", "barriers", "collectives", "overflow", "mismatch", "violation", "result");
  for (model::Variant variant : variants) {
    progress_label = std::string(model::to_string(variant));
    if (tty) limits.on_progress(0);
    sim::SimOptions options;
    options.variant = variant;
    options.layers = layers;
    options.seed = o.seed;
    options.mutant = *mutant;
    options.ipc_missing_rank = o.ipc_missing_rank;
    const auto start = std::chrono::steady_clock::now();
    const sim::RunReport report = backend->run(source, options);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (tty) fmt::print(stderr, "\r\033[K");
    const sim::SharedTotals& r0 = report.ranks.empty() ? sim::SharedTotals{} : report.ranks[0];
    fmt::print("{:<16} {:>7} {:>7} {:>14} {:>14} {:>9} {:>11} {:>9} {:>10} {:>10}  {} ({:.2f} s)\n", model::to_string(variant), r0.batches,
               r0.layers, r0.bytes_gathered_from_peers, r0.bytes_reduced, r0.barriers, r0.collectives, r0.overflows, report.mismatches(),
               report.violation_count, report.passed() ? "pass" : "FAIL", seconds);
    if (!report.passed()) {
      if (!report.failure.empty()) fmt::print("  {}\n", report.failure);
      for (const sim::Violation& v : report.violations) fmt::print("  {}\n", sim::describe(v));
      for (const auto& t : report.ranks) {
        if (t.first_mismatch[0] != '\0') {
          fmt::print("  {}\n", t.first_mismatch);
          break;
        }
      }
      const std::string line = replay_line(o, variant, layers);
      fmt::print("  replay: {}\n", line);
      failures.push_back(line);
    }
    if (o.event_log_path && schedule) {
      std::FILE* f = std::fopen(o.event_log_path->c_str(), "w");
      if (f == nullptr) throw OptionError(fmt::format("--event-log: cannot write {}", *o.event_log_path));
      for (const std::string& e : report.event_log) std::fprintf(f, "%s\n", e.c_str());
      std::fclose(f);
    }
    nlohmann::json run = {{"variant", model::to_string(variant)}, {"mode", report.mode}, {"passed", report.passed()},
                          {"mismatches", report.mismatches()}, {"violations", report.violation_count}, {"deadlock", report.deadlock},
                          {"failure", report.failure}, {"steps", report.steps}, {"seconds", seconds}};
    nlohmann::json ranks = nlohmann::json::array();
    for (const auto& t : report.ranks) {
      ranks.push_back({{"batches", t.batches}, {"layers", t.layers}, {"barriers", t.barriers}, {"collectives", t.collectives},
                       {"overflows", t.overflows}, {"mismatches", t.mismatches}, {"bytes_gathered_from_peers", t.bytes_gathered_from_peers},
                       {"bytes_reduced", t.bytes_reduced}});
    }
    run["ranks"] = ranks;
    nlohmann::json violations = nlohmann::json::array();
    for (const sim::Violation& v : report.violations) violations.push_back(sim::describe(v));
    run["violation_details"] = violations;
    json_runs.push_back(run);
  }
  if (o.json_path) {
    std::FILE* f = std::fopen(o.json_path->c_str(), "w");
    if (f == nullptr) throw OptionError(fmt::format("--json: cannot write {}", *o.json_path));
    nlohmann::json out = {{"trace", o.trace_path}, {"seed", o.seed}, {"layers", layers}, {"mode", mode}, {"mutant", o.mutant}, {"runs", json_runs}};
    if (!fault_knobs.empty()) out["faults"] = fault_knobs;
    std::fprintf(f, "%s\n", out.dump(2).c_str());
    std::fclose(f);
  }
  exit_status() = failures.empty() ? kExitOk : kExitFailure;
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
  cmd->add_option("--seed", o->seed, "the one seed of every random choice (content, schedule, injected delays)")->capture_default_str();
  cmd->add_option("--mutant", o->mutant, "switch on a planted bug (none, single_half, no_barrier, ...)")->capture_default_str();
  cmd->add_option("--layers", o->layers, "layers simulated per batch: a number or 'all'")->capture_default_str();
  cmd->add_option("--batch", o->batch, "only this batch (0-based)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--wait-ms-max", o->wait_ms_max, "bound on any single wait of a free-running rank")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--ipc-missing-rank", o->ipc_missing_rank, "fault: this rank's IPC capability probe fails")->check(CLI::NonNegativeNumber);
  cmd->add_flag("--swarm", o->swarm,
                "free-running: draw every fault knob (delay probabilities and lengths, the slow rank, where it is slow and how it rotates, "
                "where ranks yield) from --seed and print them, instead of the fixed defaults");
  cmd->add_option("--json", o->json_path, "also write the results as JSON to this file");
  cmd->add_option("--event-log", o->event_log_path, "scheduled runs: write the event log (one step a line) to this file");
  add_model_replay_options(cmd, o->model);
  cmd->callback([o] { run_replay(*o); });
}

}  // namespace cpkv::cli

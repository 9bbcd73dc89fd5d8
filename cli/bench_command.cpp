// cpkv bench: parsing only. The options become a harness::BenchRequest (a ReplayRequest and the
// bench's own), checked in harness before any file or rank; the backend's registry entry runs it
// (BackendEntry::bench: the cuda backend's, gpu/bench_report.cpp) and hands back the JSON and the
// markdown, which this prints and writes.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "backends.hpp"
#include "commands.hpp"
#include "cpkv/harness/request.hpp"
#include "cpkv/harness/timeline.hpp"
#include "cpkv/model/limits.hpp"
#include "cpkv/model/plan.hpp"
#include "files.hpp"
#include "options.hpp"
#include "rejected.hpp"

namespace cpkv::cli {
namespace {

struct BenchOptions {
  std::string trace_path;
  harness::BenchRequest request;
  std::int32_t layers = 4;
  std::optional<std::string> json_path;
  std::optional<std::string> markdown_path;
  std::optional<std::string> timeline_path;
};

// --timeline: the checked layers of every variant (gpu/timeline.hpp; not the timed graph replays),
// appended to the temporary file beside the target as the runs go, and renamed over it once they
// end, also when one failed (the file is complete up to there); a refusal before any run writes none.
harness::BenchReport benched_with_timeline(harness::CheckedBench checked, const InputFile& trace, OutputFile& timeline, const harness::BenchPrint& print) {
  checked.checked.request.timeline = timeline.temporary();
  harness::begin_timeline(timeline.temporary());
  const auto commit = [&] {
    // The backend's clock, as its entry's check chose it for a replay's timeline.
    harness::end_timeline(timeline.temporary(), checked.checked.timeline_clock);
    timeline.commit();
  };
  try {
    harness::BenchReport report = checked.checked.backend->bench(checked, harness::BatchSource::from_trace(trace.path()), print);
    commit();
    return report;
  } catch (const harness::RequestError&) {
    throw;  // the bench's refusal before any run (no GPU, too few): no file is written
  } catch (...) {
    try {
      commit();
    } catch (const std::exception&) {
      // the run's own failure is the one to report
    }
    throw;
  }
}

void run_bench(BenchOptions& o) {
  o.request.replay.layers = o.layers;
  o.request.replay.trace_label = o.trace_path;
  o.request.replay.timeline = o.timeline_path;  // until the run: then the temporary file beside it
  // The request (an --exchange plugin loaded and checked), then the inputs, then the outputs, before
  // any work: nothing is opened for writing until the results exist.
  const harness::CheckedBench checked = harness::check_bench_request(o.request, cpkv::backends::registry());
  const InputFile trace("trace", o.trace_path, /*spool=*/true);
  std::unique_ptr<OutputFile> json = o.json_path ? std::make_unique<OutputFile>("--json", *o.json_path) : nullptr;
  std::unique_ptr<OutputFile> markdown = o.markdown_path ? std::make_unique<OutputFile>("--markdown", *o.markdown_path) : nullptr;
  std::unique_ptr<OutputFile> timeline = o.timeline_path ? std::make_unique<OutputFile>("--timeline", *o.timeline_path) : nullptr;
  refuse_same_files({&trace}, {json.get(), markdown.get(), timeline.get()});
  harness::BenchPrint print;
  print.line = [](const std::string& line) {
    fmt::print("{}\n", line);
    std::fflush(stdout);
  };
  print.rejected = [](const std::vector<harness::RejectedBatch>& rejected) { print_rejected("cpkv bench", rejected); };
  const harness::BenchReport report = timeline ? benched_with_timeline(checked, trace, *timeline, print) : checked.checked.backend->bench(checked, harness::BatchSource::from_trace(trace.path()), print);
  fmt::print("{}", report.markdown);
  if (json) json->write(report.json.dump(2) + "\n");
  if (markdown) markdown->write(report.markdown);
  exit_status() = report.exact ? kExitOk : kExitFailure;
}

}  // namespace

void register_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  // The default backend: the first of the registry whose entry benches (none: the first, refused by the check).
  o->request.replay.backend = cpkv::backends::registry().entries().front().name;
  for (const harness::BackendEntry& e : cpkv::backends::registry().entries()) {
    if (e.bench) {
      o->request.replay.backend = e.name;
      break;
    }
  }
  CLI::App* cmd = app.add_subcommand("bench",
                                     "Time every exchange variant per layer on the GPUs, byte-exact checked first: each batch's layer loop is "
                                     "captured once into a CUDA graph and replayed (CUDA events, median/min/max over replays after a "
                                     "warm-up), the compose exchange alone and with the fill, against ceilings measured in the same run "
                                     "and the cost model's prediction with those ceilings.");
  cmd->add_option("trace", o->trace_path, "batch trace")->required();
  cmd->add_option("--backend", o->request.replay.backend, "a backend that benches (the default: the first that does)")->capture_default_str();
  cmd->add_option("--variant", o->request.replay.variant, "a variant or 'all'")->capture_default_str();
  cmd->add_option("--layers", o->layers, "layers run (the timing cycles through them)")
      ->capture_default_str()
      ->check(whole_in<std::int32_t>(1, model::limits::layer_count_max));
  cmd->add_option("--reps", o->request.reps, "timed replays of the layer loop per batch and variant")
      ->capture_default_str()
      ->check(whole_in<std::int32_t>(1, static_cast<std::int32_t>(option_limits::repetitions_max)));
  cmd->add_option("--cp", o->request.cp, "override the trace's cp (one GPU per rank)")->check(whole_in<std::int32_t>(1, model::limits::cp_max));
  cmd->add_option("--exchange", o->request.replay.exchange,
                  "time this exchange plugin (a shared object exporting cpkv_exchange_v1, include/cpkv/exchange_abi.h) instead of cpkv's own "
                  "(builtin, the default), through the same path: its compose_layer per layer, and the bench parts it offers, its bytes "
                  "checked first; 'all' variants: the ones it implements");
  add_knob_options(cmd, o->request.replay);
  cmd->add_flag("--bulk,!--no-bulk", o->request.bulk,
                "also time the bulk-copy (TMA) gather in the ceilings' sweep (default: CPKV_BENCH_BULK set and not 0, else off)");
  cmd->add_flag("--time-sliced", o->request.time_sliced,
                "run even when ranks outnumber the GPUs (ranks time-slice a GPU): the bytes are checked, the timings measure nothing");
  cmd->add_option("--json", o->json_path, "write the results as JSON (a regular file, replaced only when the run completes)");
  cmd->add_option("--markdown", o->markdown_path, "write the Markdown table (a regular file)");
  cmd->add_option("--timeline", o->timeline_path,
                  "write a timeline of the checked layers of every variant (Chrome trace event format, one track per rank, docs/event-log.md; "
                  "not the timed graph replays) to this file as the runs go");
  cmd->callback([o] { run_bench(*o); });
}

}  // namespace cpkv::cli

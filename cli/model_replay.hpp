// cpkv replay TRACE --backend model: the plan, verdict, bytes and modelled time of every batch of a
// trace for every variant, without moving content (cli/model_replay.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "cpkv/model/costs.hpp"
#include "cpkv/harness/request.hpp"

namespace cpkv::cli {

struct ModelReplayOptions {
  std::optional<std::string> ceilings_path;
  std::optional<double> peer_gbps;
  std::optional<double> local_gbps;
  std::optional<double> barrier_us;
  std::optional<double> allreduce_gbps;
  std::optional<double> allreduce_latency_us;
  std::optional<double> launch_us;
  std::optional<double> gather_fixed_us;
  std::optional<std::string> chart_path;
  std::optional<std::string> per_batch_path;
  std::optional<std::int64_t> staging_mib;
  std::optional<std::string> staging_sweep;  // A:B:STEP (MiB)
  bool ceilings_any = false;
  std::int64_t repeat = 1;
  bool exact_model = false;
  bool given() const;  // any of these set (they mean something only with --backend model)
};

class InputFile;
class OutputFile;

// Adds the options above to the replay subcommand.
void add_model_replay_options(CLI::App* replay, ModelReplayOptions& options);

// The setting a --ceilings file was measured at, where it says (a cpkv bench JSON's "cp" and
// "page_size"; a flat file's, when it has them).
struct CeilingsShape {
  std::optional<std::int64_t> cp;
  std::optional<std::int64_t> page_size;
};

// The ceilings of the modelled time: the --ceilings file (already checked as an input) and the
// command-line values. Throws OptionError (exit 2) for a bad file or value. `shape`, when given,
// gets the file's setting.
model::CostParameters load_ceilings(const ModelReplayOptions& options, const InputFile* ceilings_file, CeilingsShape* shape = nullptr);

// --chart needs python3 with matplotlib: refused before any work when it is missing.
void check_chart_tools();

// What cpkv replay checked before the run.
struct ModelReplayRun {
  const decltype(harness::BackendEntry::model)& model;  // the entry's model verb
  std::string trace_name;               // as the user gave it (reports)
  std::string trace_path;               // what to open (a spool for a pipe)
  std::optional<std::int64_t> batch;
  model::CostParameters ceilings;
  OutputFile* json = nullptr;           // --json, checked
  OutputFile* chart = nullptr;          // --chart, checked
  OutputFile* per_batch = nullptr;      // --per-batch, checked
  CeilingsShape ceilings_shape;         // --ceilings: the file's cp and page size
};

void run_model_replay(ModelReplayRun& run, const ModelReplayOptions& options);

// --staging-sweep A:B:STEP: the sizes A, A+STEP, ... up to B (MiB). OptionError (exit 2) for
// anything else: not three whole numbers, a size outside --staging-mib's range, B < A, STEP < 1.
std::vector<std::int64_t> parse_staging_sweep(const std::string& text);

}  // namespace cpkv::cli

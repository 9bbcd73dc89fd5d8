// cpkv replay TRACE --backend model: for every batch the counts of its plan, the overflow verdict,
// the bytes every rank pulls under every variant and the modelled exchange time, without moving a
// byte of content. The per-batch work is the closed form of model/costs.hpp (via harness/model_replay.hpp); --exact-model also
// builds every rank's variant plan with the model and checks the two agree on every field.
#include "model_replay.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cerrno>
#include <filesystem>
#include <limits>
#include <optional>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "model_chart_script.hpp"
#include "files.hpp"
#include "cpkv/harness/interrupt.hpp"
#include "cpkv/harness/model_replay.hpp"
#include "cpkv/harness/spool.hpp"
#include "cpkv/harness/temp_files.hpp"
#include "cpkv/model/costs.hpp"
#include "options.hpp"
#include "rejected.hpp"
#include "subprocess.hpp"
#include "cpkv/model/batch.hpp"
#include "cpkv/traces/trace.hpp"

namespace cpkv::cli {
namespace {

using Clock = std::chrono::steady_clock;

// A --ceilings file is a few hundred bytes (flat) or a cpkv bench JSON of a few hundred KiB; its
// nesting is 4 levels. Past these bounds it is no ceilings file.
constexpr std::size_t kCeilingsFileBytesMax = std::size_t{16} << 20;
constexpr std::size_t kCeilingsFileDepthMax = 32;

// Importing matplotlib takes about a second on a cold cache; 30 s means python3 is stuck.
constexpr std::chrono::milliseconds kChartProbeLimit{30'000};
// Drawing a few thousand batches takes seconds; two minutes means the plotting process is stuck.
constexpr std::chrono::milliseconds kChartDrawLimit{120'000};

// The number at `key`: finite, at most `high`, and at least option_limits::positive_min (or, with
// zero_allowed, 0: "not measured"). Bandwidths and latencies get the ranges of their CLI options
// (cli/options.hpp): a file's barrier_us of 1e308 was accepted though --barrier-us caps at 1e6
// (issue 22, item 19). Sizes and counts (bytes, pages) have no option; their cap is the largest
// double, as before.
double ceiling_number(const nlohmann::json& j, const char* key, const std::string& file, double high, bool zero_allowed) {
  const auto it = j.find(key);
  const double value = it != j.end() && it->is_number() ? it->get<double>() : std::nan("");
  const bool ok = std::isfinite(value) && value <= high && (value >= option_limits::positive_min || (zero_allowed && value == 0));
  if (!ok) {
    throw OptionError(fmt::format("--ceilings: {}: \"{}\" must be a {} in [{}, {}]{}", file, key, zero_allowed ? "number" : "positive number",
                                  option_limits::positive_min, high, zero_allowed ? " or 0" : ""));
  }
  return value;
}
double gbps(const nlohmann::json& j, const char* key, const std::string& file) { return ceiling_number(j, key, file, option_limits::bandwidth_gbps_max, false); }
double micros(const nlohmann::json& j, const char* key, const std::string& file) { return ceiling_number(j, key, file, option_limits::latency_us_max, false); }
double positive(const nlohmann::json& j, const char* key, const std::string& file) {
  return ceiling_number(j, key, file, std::numeric_limits<double>::max(), false);
}
double non_negative_gbps(const nlohmann::json& j, const char* key, const std::string& file) {
  return ceiling_number(j, key, file, option_limits::bandwidth_gbps_max, true);
}
double non_negative_micros(const nlohmann::json& j, const char* key, const std::string& file) {
  return ceiling_number(j, key, file, option_limits::latency_us_max, true);
}

// {"peer_gbps":..,"local_gbps":..,"barrier_us":..[,"allreduce_busbw_gbps":..,"allreduce_latency_us":..,
// "launch_us":..,"gather_fixed_us":..]}: absent optional keys stay nominal and say so.
model::CostParameters flat_ceilings(const nlohmann::json& j, const std::string& file) {
  model::CostParameters c;
  c.peer_gbps = gbps(j, "peer_gbps", file);
  c.local_gbps = gbps(j, "local_gbps", file);
  c.barrier_us = micros(j, "barrier_us", file);
  c.source = file;
  std::vector<std::string> nominal;
  const auto optional_key = [&](const char* key, double& field) {
    if (j.contains(key)) {
      field = std::string_view(key).ends_with("_us") ? micros(j, key, file) : gbps(j, key, file);
    } else {
      nominal.push_back(key);
    }
  };
  optional_key("allreduce_busbw_gbps", c.allreduce_busbw_gbps);
  optional_key("allreduce_latency_us", c.allreduce_latency_us);
  optional_key("launch_us", c.launch_us);
  optional_key("gather_fixed_us", c.gather_fixed_us);
  if (!nominal.empty()) c.source += fmt::format(" ({} nominal)", fmt::join(nominal, ", "));
  return c;
}

// The "ceilings" object of a cpkv bench JSON (cli/bench_command.cpp add_ceilings).
model::CostParameters bench_ceilings(const nlohmann::json& m, const std::string& file) {
  const std::string where = file + " ceilings";
  model::MeasuredCeilings measured;
  measured.ce_peer_gbps = gbps(m, "ce_peer_gbps", where);
  measured.local_copy_gbps = gbps(m, "local_copy_gbps", where);
  measured.barrier_us = micros(m, "barrier_us", where);
  measured.barrier_us_graph = micros(m, "barrier_us_graph", where);
  measured.barrier_us_launch_free = micros(m, "barrier_us_launch_free", where);
  // 0: not measured (a run without NCCL, cp 1), as the bench itself reads it.
  measured.allreduce_busbw_gbps = m.contains("allreduce_busbw_gbps") ? non_negative_gbps(m, "allreduce_busbw_gbps", where) : 0.0;
  measured.allreduce_latency_us = m.contains("allreduce_latency_us") ? non_negative_micros(m, "allreduce_latency_us", where) : 0.0;
  if (m.contains("allreduce_curve")) {
    if (!m["allreduce_curve"].is_array()) throw OptionError(fmt::format("--ceilings: {}: \"allreduce_curve\" must be an array", where));
    for (const nlohmann::json& point : m["allreduce_curve"]) {
      const double bytes = positive(point, "bytes", where + " allreduce_curve");
      if (!measured.allreduce_curve.empty() && bytes <= measured.allreduce_curve.back().first) {
        throw OptionError(fmt::format("--ceilings: {} allreduce_curve: \"bytes\" must increase from point to point", where));
      }
      measured.allreduce_curve.emplace_back(bytes, micros(point, "us", where + " allreduce_curve"));
    }
  }
  if (m.contains("gather")) {
    if (!m["gather"].is_array()) throw OptionError(fmt::format("--ceilings: {}: \"gather\" must be an array", where));
    for (const nlohmann::json& g : m["gather"]) {
      const double page_bytes = positive(g, "page_bytes", where + " gather");
      const double pages = positive(g, "pages", where + " gather");
      measured.gather.push_back({static_cast<std::uint64_t>(page_bytes), static_cast<std::int64_t>(pages), gbps(g, "gbps", where + " gather")});
    }
  }
  model::CostParameters c = model::derive_ceilings(measured);
  c.source = fmt::format("{} (measured by cpkv bench{})", file, measured.gather.empty() ? "; gather_fixed_us nominal: no gather sweep" : "");
  return c;
}
}  // namespace

namespace {
// A whole number the file gives for `key` (cp, page_size), or none.
std::optional<std::int64_t> shape_number(const nlohmann::json& j, const char* key, const std::string& file) {
  if (!j.contains(key)) return std::nullopt;
  if (!j[key].is_number_integer() || j[key].get<std::int64_t>() < 1) throw OptionError(fmt::format("--ceilings: {}: \"{}\" must be a whole number >= 1", file, key));
  return j[key].get<std::int64_t>();
}
}  // namespace

model::CostParameters load_ceilings(const ModelReplayOptions& o, const InputFile* file, CeilingsShape* shape) {
  model::CostParameters c;
  if (o.ceilings_path) {
    // Bounded (issue 34, items 12-14): a regular file only, a key given twice refused, 1e400 out of range.
    const nlohmann::json j = read_json_input(*file, "--ceilings", JsonLimits{kCeilingsFileBytesMax, kCeilingsFileDepthMax, /*unique_keys=*/true});
    if (!j.is_object()) throw OptionError(fmt::format("--ceilings: {} is not one JSON object", *o.ceilings_path));
    if (shape != nullptr) *shape = {shape_number(j, "cp", *o.ceilings_path), shape_number(j, "page_size", *o.ceilings_path)};
    if (j.contains("ceilings") && j["ceilings"].is_object()) {
      c = bench_ceilings(j["ceilings"], *o.ceilings_path);  // a cpkv bench JSON: what it measured, derived as the bench derives it
    } else {
      c = flat_ceilings(j, *o.ceilings_path);
    }
  }
  const auto take = [&](const std::optional<double>& value, double& field, const char* flag) {
    if (!value) return;
    if (!(*value > 0) || !std::isfinite(*value)) throw OptionError(fmt::format("{}: {} is not a positive finite number", flag, *value));
    field = *value;
    c.source = o.ceilings_path ? *o.ceilings_path + " with command-line overrides" : "command line (other values: nominal defaults)";
  };
  take(o.peer_gbps, c.peer_gbps, "--peer-gbps");
  take(o.local_gbps, c.local_gbps, "--local-gbps");
  take(o.barrier_us, c.barrier_us, "--barrier-us");
  take(o.allreduce_gbps, c.allreduce_busbw_gbps, "--allreduce-gbps");
  take(o.allreduce_latency_us, c.allreduce_latency_us, "--allreduce-latency-us");
  take(o.launch_us, c.launch_us, "--launch-us");
  take(o.gather_fixed_us, c.gather_fixed_us, "--gather-fixed-us");
  return c;
}

void check_chart_tools() {
  const PythonInterpreter python = python_interpreter();
  const ChildOutcome probe = run_child({python.program, "-c", "import matplotlib"}, kChartProbeLimit);
  if (!probe.ran) {
    throw OptionError(fmt::format("--chart: the chart's interpreter {} ({}) cannot be started: {}", python.program, python.origin,
                                  probe.stderr_tail));
  }
  if (!probe.ok()) {
    throw OptionError(fmt::format("--chart: {} ({}) cannot import matplotlib ({}); install matplotlib for it (Debian/Ubuntu: apt-get "
                                  "install python3-matplotlib for /usr/bin/python3) or set CPKV_PYTHON to an interpreter that has it",
                                  python.program, python.origin, probe.describe()));
  }
}

namespace {

// One of the chart's inputs: a tracked temporary file in $TMPDIR, "cpkv-chart-<pid>-XXXXXX<ext>",
// removed by the destructor or, on interruption, by the watcher once it has killed python3's group.
// The private folder they lay in before was left behind by every SIGINT or SIGTERM (issue 22, item 14).
class ChartInput {
 public:
  ChartInput(std::string_view extension, std::string_view content) {
    const std::string folder = harness::temp_folder();
    harness::sweep_dead_temporaries(folder, kChartPrefix);  // the inputs of a chart whose cpkv was SIGKILLed
    path_ = fmt::format("{}/{}XXXXXX{}", folder, harness::temp_stem(kChartPrefix), extension);
    const int fd = harness::create_tracked_file(path_, static_cast<int>(extension.size()));
    if (fd < 0) throw std::runtime_error(fmt::format("--chart: cannot create a temporary file in {}: {}", folder, std::strerror(errno)));
    int error = harness::write_all(fd, content);
    if (::close(fd) != 0 && error == 0) error = errno;
    if (error != 0) {
      harness::remove_tracked_file(path_);
      throw std::runtime_error(fmt::format("--chart: cannot write {}: {}", path_, std::strerror(error)));
    }
  }
  ~ChartInput() { harness::remove_tracked_file(path_); }
  ChartInput(const ChartInput&) = delete;
  ChartInput& operator=(const ChartInput&) = delete;
  const std::string& path() const { return path_; }

 private:
  static constexpr std::string_view kChartPrefix = "cpkv-chart";
  std::string path_;
};

// The chart (scripts/model_chart.py: the ECDF of modelled time per variant and the per-batch speed-up
// over v2) as a PNG, drawn by the chart's interpreter + matplotlib from a CSV. The file names and the title reach it as arguments, never through a shell.
void write_chart(OutputFile& png, const std::string& title, const std::vector<std::int64_t>& batch_index,
                 const std::vector<std::array<double, model::kVariantCount>>& ms) {
  std::string csv = "batch";
  for (model::Variant v : model::kAllVariants) csv += fmt::format(",{}", model::to_string(v));
  csv += '\n';
  for (std::size_t b = 0; b < ms.size(); ++b) {
    csv += std::to_string(batch_index[b]);
    for (double t : ms[b]) csv += fmt::format(",{:.6f}", t);
    csv += '\n';
  }
  const ChartInput times(".csv", csv);
  const ChartInput script(".py", kChartScript);
  const PythonInterpreter python = python_interpreter();
  const ChildOutcome drawn = run_child({python.program, script.path(), times.path(), png.temporary(), title}, kChartDrawLimit);
  if (!drawn.ok()) throw std::runtime_error(fmt::format("--chart: {} failed to draw {} ({})", python.program, png.path(), drawn.describe()));
  png.commit();
}

}  // namespace

bool ModelReplayOptions::given() const {
  return ceilings_path || peer_gbps || local_gbps || barrier_us || allreduce_gbps || allreduce_latency_us || launch_us || gather_fixed_us || chart_path || per_batch_path ||
         staging_mib || staging_sweep || ceilings_any || repeat != 1 || exact_model;
}

void add_model_replay_options(CLI::App* cmd, ModelReplayOptions& o) {
  const char* group = "--backend model";
  cmd->add_option("--ceilings", o.ceilings_path,
                  "model: benchmark JSON {\"peer_gbps\",\"local_gbps\",\"barrier_us\",\"allreduce_busbw_gbps\"[,\"allreduce_latency_us\"]} "
                  "(GB/s and us) for the modelled time")->group(group);
  const CLI::Validator bandwidth = finite_in(0, option_limits::bandwidth_gbps_max, /*low_open=*/true);
  const CLI::Validator latency = finite_in(0, option_limits::latency_us_max, /*low_open=*/true);
  cmd->add_option("--peer-gbps", o.peer_gbps, "model: a rank's read bandwidth from peers' memory, GB/s (default 350, nominal)")->check(bandwidth)->group(group);
  cmd->add_option("--local-gbps", o.local_gbps, "model: local copy bandwidth, GB/s (default 2000, nominal)")->check(bandwidth)->group(group);
  cmd->add_option("--barrier-us", o.barrier_us, "model: the flag exchange of one IPC counting barrier, us (default 2, nominal)")->check(latency)->group(group);
  cmd->add_option("--allreduce-gbps", o.allreduce_gbps, "model: NCCL all-reduce bus bandwidth, GB/s (default 360, nominal)")->check(bandwidth)->group(group);
  cmd->add_option("--allreduce-latency-us", o.allreduce_latency_us, "model: fixed cost of one all-reduce call, us (default 20, nominal)")->check(latency)->group(group);
  cmd->add_option("--launch-us", o.launch_us, "model: one graph node that moves nothing itself (the dense zero's launch), us (default 1.5, nominal)")->check(latency)->group(group);
  cmd->add_option("--gather-fixed-us", o.gather_fixed_us, "model: the fixed part of one gather launch (launch, one page's latency, tail), us (default 9, nominal)")->check(latency)->group(group);
  cmd->add_option("--chart", o.chart_path, "model: write a PNG of the per-batch modelled time per variant (needs python3-matplotlib; a regular file)")->group(group);
  cmd->add_option("--per-batch", o.per_batch_path,
                  "model: write one record per batch (counts, verdict, and per variant its modelled time, bytes and time components): CSV when "
                  "the name ends .csv, else JSON Lines (a regular file)")->group(group);
  cmd->add_option("--staging-mib", o.staging_mib, "model: staging size in MiB for the overflow verdict (overrides the trace's caps and staging size)")
      ->check(whole_in<std::int64_t>(1, std::int64_t{1} << 30))->group(group);
  cmd->add_option("--staging-sweep", o.staging_sweep,
                  "model: A:B:STEP: count the overflow batches at each staging size A, A+STEP, ..., B MiB and name the smallest that admits "
                  "every batch (in the summary and --json's staging_sweep)")->group(group);
  cmd->add_flag("--ceilings-any", o.ceilings_any, "model: use a --ceilings file measured at another cp or page size than the trace's")->group(group);
  cmd->add_option("--repeat", o.repeat, "model: evaluate every batch N times (timing only; the summary counts each batch once)")
      ->check(whole_in<std::int64_t>(1, option_limits::repetitions_max))->capture_default_str()->group(group);
  cmd->add_flag("--exact-model", o.exact_model, "model: also build every rank's plan with the model and check the bytes agree (slow)")->group(group);
}

namespace {

// --ceilings measured at another setting than the trace's: refused unless --ceilings-any.
void check_ceilings_shape(const ModelReplayRun& run, const ModelReplayOptions& o, const model::Setting& setting) {
  const CeilingsShape& shape = run.ceilings_shape;
  const bool other_cp = shape.cp && *shape.cp != setting.cp;
  const bool other_page = shape.page_size && *shape.page_size != setting.page_size;
  if (o.ceilings_any || (!other_cp && !other_page)) return;
  const std::string page = shape.page_size ? std::to_string(*shape.page_size) : "not recorded";
  throw OptionError(fmt::format("--ceilings: {} was measured at cp {}, page size {}; the trace {} is cp {}, page size {} "
                                "(--ceilings-any uses it anyway)", *o.ceilings_path, shape.cp ? std::to_string(*shape.cp) : "not recorded", page,
                                run.trace_name, setting.cp, setting.page_size));
}

// The columns of a --per-batch record: the batch's, then per variant (model_replay.cpp variant_record).
constexpr const char* kBatchColumns[] = {"batch", "requests", "extend_tokens", "prefix_tokens", "current_pages", "slots", "staging_slots", "verdict"};
constexpr const char* kVariantColumns[] = {"ms",        "copies_ms", "barrier_ms", "allreduce_ms",   "allgather_ms",         "zero_ms",
                                           "fill_ms",   "launch_ms", "local_ms",   "peer_ms",        "peer_bytes_max",       "local_copy_bytes_max",
                                           "allreduce_bytes", "allgather_bytes"};

std::string csv_cell(const nlohmann::json& value) { return value.is_string() ? value.get<std::string>() : value.dump(); }

// --per-batch: CSV when the name ends .csv (a rejected variant's cells empty), else JSON Lines.
// Streamed into the output's temporary file as the replay makes each record (issue 34, item 8:
// every record was held until the end), and renamed over the target only when the whole replay
// and every write succeeded (files.hpp OutputFile).
class PerBatchWriter {
 public:
  explicit PerBatchWriter(OutputFile& file) : file_(file), out_(file.stream()), csv_(file.path().ends_with(".csv")) {
    if (!csv_) return;
    std::vector<std::string> header(std::begin(kBatchColumns), std::end(kBatchColumns));
    for (model::Variant v : model::kAllVariants) {
      for (const char* column : kVariantColumns) header.push_back(fmt::format("{}_{}", model::to_string(v), column));
    }
    out_ << fmt::format("{}\n", fmt::join(header, ","));
  }
  void add(const nlohmann::json& record) {
    errno = 0;
    if (!csv_) {
      out_ << record.dump() << '\n';
    } else {
      std::vector<std::string> cells;
      for (const char* column : kBatchColumns) cells.push_back(csv_cell(record[column]));
      for (model::Variant v : model::kAllVariants) {
        const nlohmann::json& costs = record["variants"][std::string(model::to_string(v))];
        for (const char* column : kVariantColumns) cells.push_back(costs.is_null() ? "" : csv_cell(costs[column]));
      }
      out_ << fmt::format("{}\n", fmt::join(cells, ","));
    }
    // A full disk stops the replay at once; the temporary goes, the old file stays.
    if (!out_) throw std::runtime_error(fmt::format("--per-batch: cannot write {}: {}; the file was left as it was", file_.path(), std::strerror(errno != 0 ? errno : EIO)));
  }
  void commit() { file_.commit(); }

 private:
  OutputFile& file_;
  std::ostream& out_;
  bool csv_;
};

}  // namespace

std::vector<std::int64_t> parse_staging_sweep(const std::string& text) {
  const auto bad = [&](const std::string& why) { return OptionError(fmt::format("--staging-sweep: '{}' {}", text, why)); };
  std::int64_t a = 0, b = 0, step = 0;
  char c1 = 0, c2 = 0, rest = 0;
  std::istringstream in(text);
  if (!(in >> a >> c1 >> b >> c2 >> step) || c1 != ':' || c2 != ':' || (in >> rest)) throw bad("is not A:B:STEP (whole MiB: 64:1024:64)");
  constexpr std::int64_t kMibMax = std::int64_t{1} << 30;  // --staging-mib's bound
  if (a < 1 || b > kMibMax) throw bad(fmt::format("has a size outside 1..{} MiB", kMibMax));
  if (b < a) throw bad("ends below its start (B < A)");
  if (step < 1) throw bad("has a STEP below 1");
  if ((b - a) / step >= 10000) throw bad("has more than 10000 sizes (a larger STEP)");
  std::vector<std::int64_t> sizes;
  for (std::int64_t mib = a; mib <= b; mib += step) sizes.push_back(mib);
  return sizes;
}

// The summary is composed in memory and printed only after every output file is written: a failed
// write leaves nothing on stdout but the error.
void run_model_replay(ModelReplayRun& run, const ModelReplayOptions& o) {
  const harness::BatchSource source = harness::BatchSource::from_trace(run.trace_path, run.batch);
  check_ceilings_shape(run, o, source.setting);
  harness::ModelReplayOptions options;
  options.repeat = o.repeat;
  options.exact_model = o.exact_model;
  options.staging_mib = o.staging_mib;
  if (o.staging_sweep) options.staging_sweep = parse_staging_sweep(*o.staging_sweep);
  options.per_batch = run.per_batch != nullptr;
  std::optional<PerBatchWriter> per_batch;
  if (run.per_batch) {
    per_batch.emplace(*run.per_batch);
    options.per_batch_sink = [&per_batch](const nlohmann::json& record) { per_batch->add(record); };
  }
  harness::ModelReplayOutput out = run.model(source, run.trace_name, run.ceilings, options);
  if (run.batch && out.json["batches"].get<std::int64_t>() == 0) throw OptionError(fmt::format("--batch: {} is not in {}", *run.batch, run.trace_name));
  if (run.json) run.json->write(out.json.dump(2) + "\n");
  if (per_batch) {
    per_batch->commit();
    out.text += fmt::format("  per batch: {}\n", run.per_batch->path());
  }
  if (run.chart) {
    const model::Setting& setting = source.setting;
    write_chart(*run.chart, fmt::format("{}: modelled exchange time per batch (cp {}, {} layers; ceilings: {})", run.trace_name, setting.cp,
                                        setting.layer_count(), run.ceilings.source),
                out.batch_index, out.batch_ms);
    out.text += fmt::format("  chart: {}\n", run.chart->path());
  }
  fmt::print("{}", out.text);
  std::fflush(stdout);
  print_rejected("cpkv replay", out.rejected);
  exit_status() = kExitOk;
}

}  // namespace cpkv::cli

// One replay request and the backend registry: what `cpkv replay`, `cpkv bench`, `cpkv mutants`, the
// property suite's replay lines and Python's replay() all go through. A front end only parses its
// own syntax into a ReplayRequest; every check, the backend's construction, the run of each variant
// and the one-line reproducer live here, so the front ends cannot drift apart.
//
// Adding a backend is one registration: a BackendEntry (its name, the options it takes, the planted
// bugs it holds, a factory) added to the Registry by the library that implements it
// (sim::register_backends, cuda::register_backend, harness::register_model_backend).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "cpkv/harness/exchange_plugin.hpp"
#include "cpkv/harness/model_replay.hpp"
#include "cpkv/harness/mutants.hpp"
#include "cpkv/harness/replay_report.hpp"
#include "cpkv/harness/run.hpp"
#include "cpkv/harness/source.hpp"
#include "cpkv/harness/timeline.hpp"
#include "cpkv/model/limits.hpp"

namespace cpkv::harness {

// A bad request, naming the option in its Python spelling ("stuck_ms_max"); the CLI prints it as
// "--stuck-ms-max". The source is named "trace".
class RequestError : public std::runtime_error {
 public:
  RequestError(std::string option, std::string reason);
  const std::string& option() const { return option_; }
  const std::string& reason() const { return reason_; }
  // "--stuck-ms-max" (the source: "trace"): the option as the command lines spell it.
  std::string cli_option() const;
  // "--stuck-ms-max: reason" (the source: "trace: reason").
  std::string cli_message() const;

 private:
  std::string option_;
  std::string reason_;
};

// An option's command-line spelling: "stuck_ms_max" -> "--stuck-ms-max" (every front end's flags
// and every message naming one).
std::string option_flag(std::string_view option);

// The options a backend takes beyond the ones every backend takes (variant, layers, seed, batch,
// mutant). Giving one a backend does not take is refused, naming the backend.
enum RequestOptionBits : std::uint32_t {
  kTakesRanksAs = 1u << 0,       // ranks_as: processes or threads
  kTakesSchedule = 1u << 1,      // schedule: step machines under a schedule
  kTakesSwarm = 1u << 2,         // swarm: fault knobs drawn from the seed
  kTakesWaitMsMax = 1u << 3,     // wait_ms_max
  kTakesStuckMsMax = 1u << 4,    // stuck_ms_max
  kTakesIpcFault = 1u << 5,      // ipc_missing_rank
  kTakesEventLog = 1u << 6,      // event_log (scheduled runs only)
  kTakesExchange = 1u << 7,      // exchange: a plugin shared object (include/cpkv/exchange_abi.h)
  kTakesTimeline = 1u << 8,      // timeline: Chrome trace events, appended as the run goes
  kTakesPoolMemory = 1u << 9,    // pool_memory: sparse or dense device pools
  kTakesComposeBlocks = 1u << 10,  // compose_blocks_per_sm: the compose grid's cap per SM
  kTakesImpl = 1u << 11,         // impl: a foreign exchange class, "module:Class(k=v, ...)"; its planted bugs (mutant) are its own
  kTakesDevice = 1u << 12,       // device: cpu or cuda
  kTakesRanks = 1u << 13,        // ranks: the rank processes to spawn (must be the source's cp)
  kTakesConformance = 1u << 14,  // no_delays, time, require_attention, attention_output: the conformance harness's run modes
};

struct ReplayRequest {
  std::string trace_label;                    // the source as the user named it (reports, the replay line)
  std::string backend = "sim";
  std::string variant = "all";                // a name, a comma-separated list of names, or "all"
  std::uint64_t seed = 1;
  std::string mutant = "none";
  std::optional<std::int32_t> layers = 4;     // nullopt: all of the setting's layers
  std::optional<std::int64_t> batch;          // only this batch (0-based)
  std::optional<std::string> ranks_as;        // default: the backend's
  std::optional<std::string> schedule;        // "random", "round-robin" or a schedule file
  bool swarm = false;
  std::optional<std::int64_t> wait_ms_max;    // default: the backend's
  std::optional<std::int64_t> stuck_ms_max;   // default: the backend's
  std::int32_t ipc_missing_rank = -1;         // -1: none
  // Files a run appends to as it goes (the front end makes them, writes a timeline's head and tail
  // around the runs, and renames them): the event log (docs/event-log.md) and the timeline.
  std::optional<std::string> event_log;
  std::optional<std::string> timeline;
  std::optional<std::string> exchange;        // an exchange plugin's path or "builtin" ("inprocess": refused, gone; default: the backend's, BackendEntry::default_exchange)
  // Knobs the environment may also set (kKnobTable): check_request reads the variable where the
  // option is not given and the backend takes it, and writes the value here, so the replay line
  // carries it. Unset: the default.
  std::optional<std::int64_t> exchange_load_ms_max;   // the plugin loader's bound (default kLoadMsMax)
  std::optional<std::string> pool_memory;             // "sparse" (the default) or "dense": how the GPU backend backs its pools
  std::optional<std::int32_t> compose_blocks_per_sm;  // the compose grid's cap per SM (default: the kernels' kComposeBlocksPerSm)
  // A foreign exchange (the torch backend, docs/conformance.md): the class as "module:Class" or
  // "path/file.py:Class", with constructor arguments as "module:Class(k=v, ...)" (Python literals);
  // the device its ranks run on (cpu or cuda; default cpu); the ranks to spawn (the source's cp).
  std::optional<std::string> impl;
  std::optional<std::string> device;
  std::optional<std::int32_t> ranks;
  // The conformance harness's run modes (kTakesConformance): no injected delays; --time (checks,
  // delays and event hooks off, each layer's compose time measured); every layer must return an
  // attention plan; the attention output checked against the single device (docs/attention.md).
  bool no_delays = false;
  bool time = false;
  bool require_attention = false;
  bool attention_output = false;
  // Knobs of the foreign exchange (kKnobTable, taken with kTakesImpl): the bound on importing --impl
  // in its probe child, in seconds; the cpkv binary --time runs for the built-in staging_direct.
  std::optional<double> import_s_max;
  std::optional<std::string> cpkv_bin;
};

// One knob of the resolved configuration: an option that a variable of the environment also sets,
// the backends that take it, and its default as the run header prints it. The environment is read
// only by check_request (and check_bench_request for the bench's own), which is the one place that
// knows every knob: a reproducer then names each non-default value as a flag.
struct KnobInfo {
  const char* option;       // the Python spelling ("pool_memory"); the CLI's is --pool-memory
  const char* environment;  // the variable that sets it where the option is not given
  std::uint32_t taken_by;   // RequestOptionBits of the backends that take it
  const char* default_text;
};
inline constexpr KnobInfo kKnobTable[] = {
    {"exchange", "CPKV_EXCHANGE", kTakesExchange, "the backend's"},
    {"exchange_load_ms_max", "CPKV_EXCHANGE_LOAD_MS", kTakesExchange, "30000"},
    {"pool_memory", "CPKV_POOL_MEMORY", kTakesPoolMemory, "sparse"},
    {"compose_blocks_per_sm", "CPKV_COMPOSE_BLOCKS_PER_SM", kTakesComposeBlocks, "the kernels'"},
    {"import_s_max", "CPKV_IMPORT_S_MAX", kTakesImpl, "120"},  // cpkv.conformance._impl_loader.IMPORT_S_MAX
    {"cpkv_bin", "CPKV_BIN", kTakesImpl, "the build's"},
};
static_assert(kLoadMsMax == 30000, "kKnobTable prints the loader's default bound");
// A knob's value in the resolved configuration and what chose it: "default", "--pool-memory" or
// "CPKV_POOL_MEMORY".
struct ResolvedKnob {
  std::string option;
  std::string value;
  std::string origin;
};

// Bounds of the numeric options, with their reasons (the CLI's and Python's alike).
namespace request_limits {
inline constexpr std::int64_t wait_ms_max = 3'600'000;  // an hour: longer is a hang, not a wait
inline constexpr std::int64_t exchange_load_ms_max = 600'000;  // ten minutes: a dlopen longer than that is a hang
inline constexpr std::int32_t compose_blocks_per_sm_max = 32;   // the most resident blocks an SM holds (every CUDA GPU cpkv runs on)
inline constexpr std::size_t impl_chars_max = 4096;             // an --impl longer than a page is a pasted file, not a class name
inline constexpr double import_s_max = 3600;                    // an hour: an import longer than that is a hang
}  // namespace request_limits

struct BackendEntry;
struct CheckedBench;
struct CheckedSource;
struct HandedRun;

// A request after check_request: the backend found, names parsed, every option in range.
struct CheckedRequest {
  ReplayRequest request;
  const BackendEntry* backend = nullptr;
  std::vector<model::Variant> variants;
  Mutant mutant = Mutant::none;
  std::shared_ptr<const void> backend_state;  // what the entry's check parsed (the simulator's schedule)
  std::shared_ptr<const ExchangePlugin> exchange;  // the plugin loaded and checked (null: the backend's in-process exchange, or none)
  bool exchange_by_default = false;                // the exchange is the backend's default, not named by --exchange or the environment
  // The run's whole configuration beyond the common options: every knob of kKnobTable the backend
  // takes, resolved (the option, else the environment, else the default), in the table's order.
  std::vector<ResolvedKnob> knobs;
  // What the entry's check derived for the run's outputs: the run header's line of the backend's own
  // configuration (the simulator's fault knobs, the GPUs' exchange), or empty; the clock a
  // --timeline of the run counts (default: the host's wall clock in microseconds).
  std::string backend_line;
  TimelineClock timeline_clock = TimelineClock::wall_us;
  // A backend whose run is another front end's (its handoff verb), checked whole by check_run: the
  // source's scan, the command, and what that front end prints and writes; null otherwise.
  std::shared_ptr<const HandedRun> handed;
  // A backend that moves content (its replay verb), checked with its source by check_run where the
  // front end named the file: the source opened and its scan; null otherwise.
  std::shared_ptr<const CheckedSource> source;
};

// What a backend's bench hands back: the `cpkv bench --json` object, the --markdown tables, and
// whether every timed run was byte-exact.
struct BenchReport {
  nlohmann::json json;
  std::string markdown;
  bool exact = true;
};
// What the bench tells the terminal as it goes: the run header, the batches the overflow verdict
// rejects (nothing of them is timed), a variant that failed its byte check.
struct BenchPrint {
  std::function<void(const std::string& line)> line;
  std::function<void(const std::vector<RejectedBatch>& rejected)> rejected;
};

// A progress callback: layers every rank has ended, summed over batches (of batches x layers run
// per batch; a rejected batch counts as its layers once every rank passed it). The simulator counts
// each layer; the GPU backend counts whole batches (batches done x layers).
using ProgressFunction = std::function<void(std::int64_t layers_done)>;

struct ScannedSource;

// What a backend whose run is another front end's says of a checked request and source: the
// arguments after the interpreter that run it there ("-m cpkv.conformance TRACE --impl ..."), the
// run header's front end and the modes the run may take there (the header of each is built here),
// and the header's line of the backend's own configuration.
struct Handoff {
  std::vector<std::string> arguments;
  std::string front_end;
  std::vector<std::string> modes;
  std::string backend_line;
};

// A backend's registry entry: what it is (name, summary), what it takes (option bits, planted bugs,
// its rank cap and default exchange), and its verbs. A front end asks which verbs an entry has,
// never which backend it is; each verb is empty where the backend does not do it.
struct BackendEntry {
  std::string name;                           // --backend NAME
  std::string summary;                        // one line for --help
  std::uint32_t options = 0;                  // RequestOptionBits it takes
  std::uint8_t mutants = 0;                   // BackendBits of the planted bugs it holds (0: none, moves no content)
  std::int32_t ranks_max = model::limits::cp_max;  // the most ranks it runs: a source of larger cp is refused
  // The exchange a request that names none runs (a backend that takes --exchange, where neither
  // the option nor CPKV_EXCHANGE names one): its spelling as --exchange would give it. Empty: the
  // backend's own exchange in process.
  std::string default_exchange;
  // check: options beyond the common ones (a schedule file parsed, ranks_as named), and what the run
  // header and the outputs take from them (CheckedRequest::backend_line, timeline_clock); may be empty.
  std::function<void(CheckedRequest&)> check;
  // replay: the backend for a checked request and source, whose runs move content through ranks,
  // after what needs the source (the simulator's /dev/shm space), before any rank starts; an
  // environment it cannot run in (no GPU) is a RequestError naming "backend".
  std::function<std::unique_ptr<Backend>(const CheckedRequest&, const BatchSource&, const ScannedSource&, const ProgressFunction&)> replay;
  // model: the model replay instead (no ranks, no Backend: plans, verdicts, bytes and modelled time
  // of every batch and variant under these ceilings, harness/model_replay.hpp).
  std::function<ModelReplayOutput(const BatchSource&, const std::string& label, const model::CostParameters&, const ModelReplayOptions&)> model;
  // handoff: the run is another front end's, in another process (the torch backend's is Python's
  // conformance harness), checked whole here first (check_run): what that front end needs of the
  // request checked against its source (Handoff).
  std::function<Handoff(const CheckedRequest&, const BatchSource&, const ScannedSource&)> handoff;
  // `cpkv bench`: every variant timed (empty: the backend does not bench), told to `print` as it
  // goes; an environment it cannot bench in (no GPU, too few) is a RequestError.
  std::function<BenchReport(const CheckedBench&, const BatchSource&, const BenchPrint& print)> bench;
};

class Registry {
 public:
  void add(BackendEntry entry);  // a second entry of one name is a programming error (asserted)
  const BackendEntry* find(std::string_view name) const;
  std::string names() const;     // "sim, cuda, model"
  const std::vector<BackendEntry>& entries() const { return entries_; }

 private:
  std::vector<BackendEntry> entries_;
};

// Registers "model": the model replay (plans, verdicts, bytes and modelled time; no ranks, no
// Backend: the front ends run harness/model_replay.hpp for it).
void register_model_backend(Registry& registry);

// Every option that needs no source, in one order (backend, variant, mutant, layers, the knobs
// with the environment's values, then the backend's own): throws RequestError naming the first bad
// one. The only reader of the environment's CPKV_* knobs (kKnobTable).
CheckedRequest check_request(const ReplayRequest& request, const Registry& registry);

// The file a front end reads the source from, asked by check_run once the options pass, with the
// request checked: the front end checks its own inputs and outputs there first (for a backend that
// moves content, nothing is read before a bad request option is refused), and spools a pipe into a
// private file (every rank reopens it). A handed-off run never asks: its source is checked with the
// request, and the CLI refuses a model-only option for it after that check.
using SourceFile = std::function<std::string(const CheckedRequest&)>;

// check_request, then the rest of the run's checks in the same call. For a backend whose run is
// another front end's (BackendEntry::handoff): the source (request.trace_label, a regular file: each
// of that run's processes opens it) by check_source, and the HandedRun that front end reads instead
// of checking again (CheckedRequest::handed). For every other backend, where `source_file` is given,
// the file it names: for a backend that moves content (BackendEntry::replay), opened and checked by
// check_source (CheckedRequest::source); the model replay reads its file itself. Without
// `source_file`, check_request alone for those.
CheckedRequest check_run(const ReplayRequest& request, const Registry& registry, const SourceFile& source_file = {});

// The knobs of kKnobTable a backend takes, resolved into `request` (the environment's value where
// the option is not given) and checked; for a front end that runs a backend without a whole
// request (cpkv mutants --backend cuda). Throws RequestError naming the option or the variable.
std::vector<ResolvedKnob> resolve_knobs(ReplayRequest& request, const BackendEntry& backend);

// The run header's configuration line: "knobs: pool_memory dense (CPKV_POOL_MEMORY) | ..." (every
// resolved knob, the CLI's spelling), or empty where the backend takes none.
std::string knobs_line(const CheckedRequest& checked);

// `cpkv bench`: a replay request (backend, variant, layers, exchange) and what only timing needs.
// Checked by check_bench_request: the replay request as check_request checks it (an --exchange
// plugin loaded and its variants taken), then a backend that benches, then the bench's own options.
struct BenchRequest {
  ReplayRequest replay;
  std::int32_t reps = 50;                     // timed replays per batch and variant
  std::optional<std::int32_t> cp;             // the trace's cp overridden
  bool time_sliced = false;                   // more ranks than GPUs allowed (the path checked, its timings meaningless)
  std::optional<bool> bulk;                   // also time the bulk-copy (TMA) gather (default: CPKV_BENCH_BULK set, else no)
};
struct CheckedBench {
  CheckedRequest checked;
  std::int32_t reps = 0;
  std::optional<std::int32_t> cp;
  bool time_sliced = false;
  bool bulk = false;
  std::string bulk_origin = "default";  // "--bulk", "CPKV_BENCH_BULK" or "default"
};
namespace request_limits {
inline constexpr std::int32_t bench_reps_max = 1'000'000;
}  // namespace request_limits
inline constexpr const char* kBenchBulkEnvironment = "CPKV_BENCH_BULK";
CheckedBench check_bench_request(const BenchRequest& request, const Registry& registry);

// The variants a name or comma-separated list of names selects ("all": every variant in the
// table's order); nullopt with the first unknown name in `unknown`.
std::optional<std::vector<model::Variant>> parse_variant_list(std::string_view text, std::string* unknown = nullptr);

// The source checked against the request before any rank starts: every batch validated and its
// overflow verdict taken (one pass), the batch asked for present, ipc_missing_rank a rank of the
// setting, stale shared memory swept, the backend's resources checked.
struct ScannedSource {
  SourceScan scan;
  std::int32_t layer_count = 0;  // the setting's
  std::int32_t layers = 0;       // run per batch
  int stale_regions = 0;         // removed by the sweep
};
ScannedSource check_source(const CheckedRequest& checked, const BatchSource& source);

// A content-moving backend's source as check_run opened and checked it (CheckedRequest::source).
struct CheckedSource {
  BatchSource source;
  ScannedSource scanned;
};

// A run checked whole in one process and run in another (the torch backend's: the cpkv command, or
// Python's replay(), hands it to `python3 -m cpkv.conformance`): the source's scan, the command, and
// `checked`, the JSON that front end reads in place of its own check (kCheckedRunFormat): "layers"
// (run per batch), "header" (mode -> the run header's lines), "replay_line" (the reproducer),
// "replay_json" (`cpkv replay --json`'s object with no runs and no rejected batches: the front end
// adds its own), "import_s_max" and "cpkv_bin" (the knobs resolved), and "arguments" (the command).
struct HandedRun {
  ScannedSource scanned;
  std::vector<std::string> arguments;
  nlohmann::json checked;
};
inline constexpr const char* kCheckedRunFormat = "cpkv-checked-run v1";

// The run header's first line: "<front end>: TRACE | cp .. page .. | N batches | L of M layers | mode .. | seed S".
std::string run_header(std::string_view front_end, const CheckedRequest& checked, const BatchSource& source, const ScannedSource& scanned,
                       std::string_view mode);
// The whole run header, as every front end prints it: run_header, the knobs line (where the backend
// takes knobs), the backend's own line (where its check wrote one), and "MUTANT ACTIVE: ..." for a
// planted bug.
std::vector<std::string> run_header_lines(std::string_view front_end, const CheckedRequest& checked, const BatchSource& source,
                                          const ScannedSource& scanned, std::string_view mode);

// One variant's run, as the variant loop hands it to a front end.
struct VariantRun {
  model::Variant variant;
  RunReport report;
  double seconds = 0;
  std::string replay_line;  // empty when the run passed
};
// Every selected variant through one backend, in order; `on_variant_start` and `on_variant_end`
// (either may be empty) see each as it starts and ends, so a verdict is out as soon as it is known.
void run_variants(const CheckedRequest& checked, const BatchSource& source, const ScannedSource& scanned, Backend& backend,
                  const std::function<void(model::Variant)>& on_variant_start, const std::function<void(const VariantRun&)>& on_variant_end);

// A word as a POSIX shell reads it back: unchanged where it holds only safe characters, else in
// single quotes (an --impl with constructor arguments holds parentheses, spaces and quotes).
std::string shell_word(std::string_view text);

// The one-line reproducer of one variant's run: every option the request gave that changes what
// runs, in the CLI's spelling (`cpkv replay TRACE --backend B ...`; a foreign exchange's run, the
// torch backend's, is the same request: its line names the --impl class instead of a variant).
std::string replay_line(const CheckedRequest& checked, model::Variant variant, std::int32_t layers);

// The report's lines after a failed run: the failure, each kept violation, the first mismatch, then
// "replay: LINE".
std::vector<std::string> failure_lines(const RunReport& report, const std::string& replay_line);

// The JSON `cpkv replay --json` writes and Python's replay() returns.
nlohmann::json replay_json(const CheckedRequest& checked, const ScannedSource& scanned, std::string_view mode, const nlohmann::json& runs);

}  // namespace cpkv::harness

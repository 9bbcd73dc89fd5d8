#include "cpkv/harness/request.hpp"

#include "cpkv/harness/launch.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cpkv/harness/interrupt.hpp"
#include "cpkv/harness/shared_region.hpp"
#include "cpkv/model/assert.hpp"
#include "cpkv/model/limits.hpp"
#include "cpkv/traces/text.hpp"

namespace cpkv::harness {

RequestError::RequestError(std::string option, std::string reason)
    : std::runtime_error(fmt::format("{}: {}", option, reason)), option_(std::move(option)), reason_(std::move(reason)) {}

std::string option_flag(std::string_view option) {
  std::string flag = "--" + std::string(option);
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

std::string RequestError::cli_option() const { return option_ == "trace" ? option_ : option_flag(option_); }

std::string RequestError::cli_message() const { return fmt::format("{}: {}", cli_option(), reason_); }

void Registry::add(BackendEntry entry) {
  CPKV_ASSERT(find(entry.name) == nullptr);
  CPKV_ASSERT(entry.replay != nullptr || entry.model != nullptr || entry.handoff != nullptr);  // an entry does at least one of the verbs
  entries_.push_back(std::move(entry));
}

const BackendEntry* Registry::find(std::string_view name) const {
  for (const BackendEntry& e : entries_) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

std::string Registry::names() const {
  std::string out;
  for (const BackendEntry& e : entries_) out += (out.empty() ? "" : ", ") + e.name;
  return out;
}

std::optional<std::vector<model::Variant>> parse_variant_list(std::string_view text, std::string* unknown) {
  if (text == "all") return std::vector<model::Variant>(model::kAllVariants.begin(), model::kAllVariants.end());
  std::vector<model::Variant> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view name = text.substr(start, comma - start);
    const auto variant = model::parse_variant(name);
    if (!variant) {
      if (unknown) *unknown = std::string(name);
      return std::nullopt;
    }
    if (std::find(out.begin(), out.end(), *variant) == out.end()) out.push_back(*variant);
    start = comma + 1;
  }
  return out;
}

namespace {

const BackendEntry& checked_backend(const ReplayRequest& r, const Registry& registry) {
  if (const BackendEntry* entry = registry.find(r.backend)) return *entry;
  std::string reason = fmt::format("'{}' is not one of {}", r.backend, registry.names());
  if (registry.find("cuda") == nullptr) reason += " (this build has no cuda backend: it needs nvcc and NCCL at configure time)";
  throw RequestError("backend", reason);
}

std::string not_held(const ReplayRequest& r, const BackendEntry& backend) {
  return fmt::format("'{}' is not held by --backend {} (it holds: {})", r.mutant, backend.name, mutant_names(backend.mutants));
}

bool python_name(std::string_view text, bool dotted) {
  const auto head = [](char ch) { return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || ch == '_'; };
  const auto tail = [&](char ch) { return head(ch) || (ch >= '0' && ch <= '9') || (dotted && ch == '.'); };
  return !text.empty() && head(text.front()) && std::all_of(text.begin(), text.end(), tail) && text.back() != '.';
}

Mutant checked_mutant(const ReplayRequest& r, const BackendEntry& backend) {
  // A foreign exchange's planted bugs are its own (the reference implementations', named where they
  // live: Python's cpkv.conformance.reference checks the name); the harness's table has none of them.
  if ((backend.options & kTakesImpl) != 0) {
    if (r.mutant != "none" && !python_name(r.mutant, false)) throw RequestError("mutant", fmt::format("'{}' is not a planted bug's name", traces::escape_bytes(r.mutant)));
    return Mutant::none;
  }
  const auto mutant = parse_mutant(r.mutant);
  if (!mutant) throw RequestError("mutant", fmt::format("unknown mutant '{}' (one of: {})", r.mutant, mutant_names()));
  if (*mutant == Mutant::none) return *mutant;
  if (backend.mutants == 0) {
    throw RequestError("mutant", fmt::format("--backend {} moves no content: planted bugs live in the backends that do", backend.name));
  }
  // A backend that runs exchange plugins also runs the planted bugs a plugin holds itself (any bug
  // of an exchange, exchange_plugin.cpp: check_held_mutants): check_exchange decides with the plugin.
  if (!held_by(*mutant, backend.mutants) && !((backend.options & kTakesExchange) != 0 && held_by(*mutant, kSimulatorHolds | kGpuHolds))) {
    throw RequestError("mutant", not_held(r, backend));
  }
  return *mutant;
}

// An option the backend does not take is refused, naming the backend.
void check_taken(const ReplayRequest& r, const BackendEntry& backend) {
  const struct {
    bool given;
    std::uint32_t bit;
    const char* option;
  } given[] = {{r.ranks_as.has_value(), kTakesRanksAs, "ranks_as"},       {r.schedule.has_value(), kTakesSchedule, "schedule"},
               {r.swarm, kTakesSwarm, "swarm"},                           {r.wait_ms_max.has_value(), kTakesWaitMsMax, "wait_ms_max"},
               {r.stuck_ms_max.has_value(), kTakesStuckMsMax, "stuck_ms_max"}, {r.ipc_missing_rank >= 0, kTakesIpcFault, "ipc_missing_rank"},
               {r.event_log.has_value(), kTakesEventLog, "event_log"},    {r.timeline.has_value(), kTakesTimeline, "timeline"},
               {r.exchange.has_value(), kTakesExchange, "exchange"},      {r.exchange_load_ms_max.has_value(), kTakesExchange, "exchange_load_ms_max"},
               {r.pool_memory.has_value(), kTakesPoolMemory, "pool_memory"}, {r.compose_blocks_per_sm.has_value(), kTakesComposeBlocks, "compose_blocks_per_sm"},
               {r.impl.has_value(), kTakesImpl, "impl"},                  {r.device.has_value(), kTakesDevice, "device"},
               {r.ranks.has_value(), kTakesRanks, "ranks"},                {r.no_delays, kTakesConformance, "no_delays"},
               {r.time, kTakesConformance, "time"},                       {r.require_attention, kTakesConformance, "require_attention"},
               {r.attention_output, kTakesConformance, "attention_output"}, {r.import_s_max.has_value(), kTakesImpl, "import_s_max"},
               {r.cpkv_bin.has_value(), kTakesImpl, "cpkv_bin"}};
  for (const auto& g : given) {
    if (g.given && (backend.options & g.bit) == 0) throw RequestError(g.option, fmt::format("--backend {} does not take it", backend.name));
  }
}

void check_numbers(const ReplayRequest& r) {
  if (r.layers && (*r.layers < 1 || *r.layers > model::limits::layer_count_max)) {
    throw RequestError("layers", fmt::format("{} is not 'all' or a number in 1..{}", *r.layers, model::limits::layer_count_max));
  }
  if (r.batch && *r.batch < 0) throw RequestError("batch", fmt::format("{} is negative", *r.batch));
  if (r.wait_ms_max && (*r.wait_ms_max < 1 || *r.wait_ms_max > request_limits::wait_ms_max)) {
    throw RequestError("wait_ms_max", fmt::format("{} is not in 1..{}", *r.wait_ms_max, request_limits::wait_ms_max));
  }
  // Below the launcher's floor a correct run's scheduling jitter would read as a deadlock (launch.hpp).
  if (r.stuck_ms_max && (*r.stuck_ms_max < kStuckMsFloor || *r.stuck_ms_max > request_limits::wait_ms_max)) {
    throw RequestError("stuck_ms_max", fmt::format("{} is not in {}..{} (a shorter silence is a loaded machine's scheduling, not a hang)", *r.stuck_ms_max,
                                                   kStuckMsFloor, request_limits::wait_ms_max));
  }
  if (r.ipc_missing_rank < -1 || r.ipc_missing_rank >= model::limits::cp_max) {
    throw RequestError("ipc_missing_rank", fmt::format("{} is not a rank in 0..{} (-1: none)", r.ipc_missing_rank, model::limits::cp_max - 1));
  }
}

// A foreign exchange's options (kTakesImpl, kTakesDevice, kTakesRanks), in range: the class named as
// Python imports it ("module:Class" or "path/file.py:Class", constructor arguments in parentheses,
// which Python reads: cpkv.conformance._impl_spec), a device of the two, ranks of the model's cap.
void check_foreign(const ReplayRequest& r) {
  if (r.impl) {
    const std::string& text = *r.impl;
    const std::size_t open = text.size() > 1 && text.back() == ')' ? text.find('(') : std::string::npos;
    const std::string_view head = std::string_view(text).substr(0, open);
    const std::size_t colon = head.rfind(':');
    const std::string_view module = colon == std::string_view::npos ? std::string_view() : head.substr(0, colon);
    const bool file = module.size() > 3 && module.substr(module.size() - 3) == ".py";
    const bool printable = std::none_of(text.begin(), text.end(), [](char ch) { return static_cast<unsigned char>(ch) < 0x20; });
    if (text.size() > request_limits::impl_chars_max || !printable || colon == std::string_view::npos || !(file || python_name(module, true)) ||
        !python_name(head.substr(colon + 1), true)) {
      throw RequestError("impl", fmt::format("'{}' is not module:Class or path/to/file.py:Class (constructor arguments: 'module:Class(k=v, ...)')",
                                             traces::escape_bytes(text.substr(0, 200))));
    }
  }
  if (r.device && *r.device != "cpu" && *r.device != "cuda") {
    throw RequestError("device", fmt::format("'{}' is neither cpu nor cuda", traces::escape_bytes(*r.device)));
  }
  if (r.ranks && (*r.ranks < 1 || *r.ranks > model::limits::cp_max)) {
    throw RequestError("ranks", fmt::format("{} is not in 1..{}", *r.ranks, model::limits::cp_max));
  }
}

// `cpkv replay --json`'s keys that are the request's: the trace (the name as the user gave it, its
// non-UTF-8 bytes written \\xNN: JSON holds only UTF-8, issue 22 item 7), seed, layers run, mutant.
nlohmann::json replay_json_common(const CheckedRequest& checked, std::int32_t layers) {
  const ReplayRequest& r = checked.request;
  return {{"trace", traces::escape_bytes(r.trace_label)}, {"seed", r.seed}, {"layers", layers}, {"mutant", r.mutant}};
}

// A backend that runs a foreign class (kTakesImpl) runs that class and nothing else: the class is
// required, and it is the run's only variant.
void check_foreign_class(const ReplayRequest& r, const BackendEntry& backend) {
  if ((backend.options & kTakesImpl) == 0) return;
  if (!r.impl) throw RequestError("impl", fmt::format("required by --backend {}: the exchange class to run, module:Class", backend.name));
  if (r.variant != "all") throw RequestError("variant", fmt::format("--backend {} runs the --impl class, which is its own variant: give none", backend.name));
}

// A whole number of the environment's text, or nullopt (not all digits, out of range).
std::optional<std::int64_t> whole_number(const std::string& text, std::int64_t low, std::int64_t high) {
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < low || value > high) return std::nullopt;
  return value;
}

// A knob's value as the request holds it, as its flag takes it (nullopt: not given).
std::optional<std::string> knob_text(const ReplayRequest& r, std::string_view option) {
  if (option == "exchange") return r.exchange;
  if (option == "exchange_load_ms_max" && r.exchange_load_ms_max) return std::to_string(*r.exchange_load_ms_max);
  if (option == "pool_memory") return r.pool_memory;
  if (option == "compose_blocks_per_sm" && r.compose_blocks_per_sm) return std::to_string(*r.compose_blocks_per_sm);
  if (option == "import_s_max" && r.import_s_max) return fmt::format("{:g}", *r.import_s_max);
  if (option == "cpkv_bin") return r.cpkv_bin;
  return std::nullopt;
}

// Sets a knob from the environment's text, checked as its option is: a bad value names the variable.
void set_knob(ReplayRequest& r, const KnobInfo& knob, const std::string& text) {
  const std::string_view option = knob.option;
  const auto refuse = [&](std::string_view what) {
    throw RequestError(knob.option, fmt::format("{}={} is not {}", knob.environment, traces::escape_bytes(text), what));
  };
  if (option == "exchange") {
    r.exchange = text;
  } else if (option == "exchange_load_ms_max") {
    const auto ms = whole_number(text, 1, request_limits::exchange_load_ms_max);
    if (!ms) refuse(fmt::format("a number of milliseconds in 1..{}", request_limits::exchange_load_ms_max));
    r.exchange_load_ms_max = *ms;
  } else if (option == "pool_memory") {
    if (text != "sparse" && text != "dense") throw RequestError(knob.option, fmt::format("{}='{}' is neither sparse nor dense", knob.environment, traces::escape_bytes(text)));
    r.pool_memory = text;
  } else if (option == "compose_blocks_per_sm") {
    const auto blocks = whole_number(text, 1, request_limits::compose_blocks_per_sm_max);
    if (!blocks) refuse(fmt::format("a number of blocks in 1..{}", request_limits::compose_blocks_per_sm_max));
    r.compose_blocks_per_sm = static_cast<std::int32_t>(*blocks);
  } else if (option == "import_s_max") {
    char* end = nullptr;
    const double seconds = std::strtod(text.c_str(), &end);
    if (end != text.c_str() + text.size() || !(seconds > 0 && seconds <= request_limits::import_s_max)) {
      refuse(fmt::format("a number of seconds in (0, {:g}]", request_limits::import_s_max));
    }
    r.import_s_max = seconds;
  } else if (option == "cpkv_bin") {
    r.cpkv_bin = text;
  }
}

// The knobs' values as the options gave them, in range (the environment's are checked as they are read).
void check_knob_values(const ReplayRequest& r) {
  if (r.pool_memory && *r.pool_memory != "sparse" && *r.pool_memory != "dense") {
    throw RequestError("pool_memory", fmt::format("'{}' is neither sparse nor dense", traces::escape_bytes(*r.pool_memory)));
  }
  if (r.exchange_load_ms_max && (*r.exchange_load_ms_max < 1 || *r.exchange_load_ms_max > request_limits::exchange_load_ms_max)) {
    throw RequestError("exchange_load_ms_max", fmt::format("{} is not in 1..{}", *r.exchange_load_ms_max, request_limits::exchange_load_ms_max));
  }
  if (r.compose_blocks_per_sm && (*r.compose_blocks_per_sm < 1 || *r.compose_blocks_per_sm > request_limits::compose_blocks_per_sm_max)) {
    throw RequestError("compose_blocks_per_sm",
                       fmt::format("{} is not in 1..{}", *r.compose_blocks_per_sm, request_limits::compose_blocks_per_sm_max));
  }
  if (r.exchange && r.exchange->empty()) throw RequestError("exchange", "is empty (give a plugin's path or builtin)");
  // NaN fails both comparisons, so the range is written to let only (0, max] through.
  if (r.import_s_max && !(*r.import_s_max > 0 && *r.import_s_max <= request_limits::import_s_max)) {
    throw RequestError("import_s_max", fmt::format("{:g} is not a number of seconds in (0, {:g}]", *r.import_s_max, request_limits::import_s_max));
  }
  if (r.cpkv_bin && r.cpkv_bin->empty()) throw RequestError("cpkv_bin", "is empty (give the cpkv binary's path)");
}

const ResolvedKnob* find_knob(const CheckedRequest& c, std::string_view option) {
  for (const ResolvedKnob& k : c.knobs) {
    if (k.option == option) return &k;
  }
  return nullptr;
}

// The plugin loaded and checked against the request: the variants asked for are ones it implements
// ("all": every one it implements), a planted bug is one it holds itself or one of the harness's
// that reaches what it reads. Without a plugin the harness's own planted bugs have nothing to reach.
void check_exchange(CheckedRequest& c) {
  ReplayRequest& r = c.request;
  const std::uint32_t needs = input_corrupted_by(c.mutant);
  std::optional<std::string> spelled = r.exchange;
  // What chose the exchange, for refusals that name something the user did not type.
  std::string chosen_by = spelled ? "--exchange " + *spelled : "";
  if (const ResolvedKnob* knob = find_knob(c, "exchange"); knob != nullptr && knob->origin == "default") {
    if (!c.backend->default_exchange.empty()) spelled = c.backend->default_exchange;
    c.exchange_by_default = true;
    chosen_by = fmt::format("the default, {}", c.backend->default_exchange);
  } else if (knob != nullptr && knob->origin != "--exchange") {
    chosen_by = fmt::format("{}={}", knob->origin, *spelled);  // the replay line names what the environment chose
  }
  if (spelled && *spelled == kInProcessExchange) throw RequestError("exchange", fmt::format("{} ({})", kInProcessGone, chosen_by));
  if (!spelled) {
    if (c.mutant != Mutant::none && !held_by(c.mutant, c.backend->mutants)) {
      throw RequestError("mutant", fmt::format("{}; a plugin may hold it, and this run runs none", not_held(r, *c.backend)));
    }
    if (needs != 0) {
      throw RequestError("mutant", fmt::format("'{}' corrupts what the harness hands an exchange plugin, and this backend runs no plugin: give --exchange", r.mutant));
    }
    return;
  }
  c.exchange = find_exchange(*spelled, std::chrono::milliseconds(r.exchange_load_ms_max.value_or(kLoadMsMax)));
  const ExchangePlugin& plugin = *c.exchange;
  // The plugin as refusals name it; one the user did not name says what chose it.
  const std::string who = r.exchange && !c.exchange_by_default && chosen_by.rfind("--exchange", 0) == 0 ? fmt::format("'{}'", plugin.name)
                                                                                                      : fmt::format("'{}' ({})", plugin.name, chosen_by);
  std::string implemented;
  for (model::Variant v : plugin.variants) implemented += (implemented.empty() ? "" : ", ") + std::string(model::to_string(v));
  std::vector<model::Variant> chosen;
  for (model::Variant v : c.variants) {
    if (plugin.implements(v)) {
      chosen.push_back(v);
    } else if (r.variant != "all") {
      throw RequestError("variant", fmt::format("exchange plugin {} does not implement {} (it implements: {})", who, model::to_string(v), implemented));
    }
  }
  c.variants = chosen;
  if (needs != 0 && (plugin.uses & needs) == 0) {
    throw RequestError("mutant", fmt::format("'{}' cannot reach exchange plugin {}: it does not read that input (cpkv_exchange_v1.uses)", r.mutant, who));
  }
  if (c.mutant != Mutant::none && needs == 0 && !plugin.holds(r.mutant)) {
    throw RequestError("mutant", fmt::format("exchange plugin {} does not hold planted bug '{}' (it holds: {}; the harness holds: {})", who, r.mutant,
                                             plugin.mutants.empty() ? std::string("none") : fmt::format("{}", fmt::join(plugin.mutants, ", ")),
                                             mutant_names(kHarnessHolds)));
  }
}

}  // namespace

std::vector<ResolvedKnob> resolve_knobs(ReplayRequest& r, const BackendEntry& backend) {
  std::vector<ResolvedKnob> knobs;
  for (const KnobInfo& knob : kKnobTable) {
    if ((backend.options & knob.taken_by) == 0) continue;  // the environment's value for a backend that does not take it is not this run's
    std::string origin = "default";
    if (knob_text(r, knob.option)) {
      origin = option_flag(knob.option);
    } else if (const char* text = std::getenv(knob.environment); text != nullptr && text[0] != '\0') {
      set_knob(r, knob, text);
      origin = knob.environment;
    }
    knobs.push_back({knob.option, knob_text(r, knob.option).value_or(knob.default_text), origin});
  }
  check_knob_values(r);
  return knobs;
}

std::string knobs_line(const CheckedRequest& checked) {
  std::string line;
  for (const ResolvedKnob& k : checked.knobs) {
    const std::string value = k.option == "exchange" && k.origin == "default" && !checked.backend->default_exchange.empty() ? checked.backend->default_exchange
                                                                                                                          : k.value;
    line += fmt::format("{}{} {} ({})", line.empty() ? "knobs: " : " | ", option_flag(k.option), traces::escape_bytes(value), k.origin);
  }
  return line;
}

CheckedRequest check_request(const ReplayRequest& request, const Registry& registry) {
  CheckedRequest c;
  c.request = request;
  c.backend = &checked_backend(request, registry);
  std::string unknown;
  auto variants = parse_variant_list(request.variant, &unknown);
  if (!variants) throw RequestError("variant", fmt::format("unknown variant '{}' (one of: {}; a comma-separated list, or 'all')", unknown, model::variant_names()));
  c.variants = *std::move(variants);
  c.mutant = checked_mutant(request, *c.backend);
  check_numbers(request);
  check_taken(request, *c.backend);
  check_foreign(request);
  c.knobs = resolve_knobs(c.request, *c.backend);
  check_exchange(c);
  if (request.event_log && c.variants.size() != 1) throw RequestError("event_log", "give one variant (the log is one run's)");
  check_foreign_class(request, *c.backend);
  if (c.backend->check) c.backend->check(c);
  return c;
}

namespace {

// The source a handed-off run reads: a regular file (each of the other front end's processes opens
// it by name; a pipe would be read once), checked before it is opened.
BatchSource handed_source(const CheckedRequest& c) {
  const std::string& path = c.request.trace_label;
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) {
    const bool exists = std::filesystem::exists(path, error);
    throw RequestError("trace", fmt::format("{} {} (--backend {}: each rank process opens it)", traces::escape_bytes(path),
                                            exists ? "is not a regular file" : "does not exist", c.backend->name));
  }
  return BatchSource::from_trace(path, c.request.batch);
}

// The run checked against its source and what the other front end reads instead of checking again
// (HandedRun): the header of each mode it may run in, the reproducer, the replay JSON's common part.
HandedRun handed_run(CheckedRequest& c) {
  const BatchSource source = handed_source(c);
  HandedRun h;
  h.scanned = check_source(c, source);
  Handoff handoff = c.backend->handoff(c, source, h.scanned);
  c.backend_line = std::move(handoff.backend_line);
  // The run as that front end runs it, its defaults stated (the ranks the source's cp, the device
  // cpu: ReplayRequest), so the header and the reproducer say what ran.
  ReplayRequest& r = c.request;
  if ((c.backend->options & kTakesRanks) != 0 && !r.ranks) r.ranks = source.setting.cp;
  if ((c.backend->options & kTakesDevice) != 0 && !r.device) r.device = "cpu";
  h.arguments = std::move(handoff.arguments);
  nlohmann::json header = nlohmann::json::object();
  for (const std::string& mode : handoff.modes) header[mode] = run_header_lines(handoff.front_end, c, source, h.scanned, mode);
  h.checked = {{"format", kCheckedRunFormat},
               {"arguments", h.arguments},
               {"layers", h.scanned.layers},
               {"header", std::move(header)},
               {"replay_line", replay_line(c, model::kAllVariants.front(), h.scanned.layers)},  // the class is the variant
               // The mode, the runs and the rejected batches (its implementation's staging's) are the other front end's.
               {"replay_json", replay_json_common(c, h.scanned.layers)},
               {"import_s_max", r.import_s_max ? nlohmann::json(*r.import_s_max) : nlohmann::json(nullptr)},
               {"cpkv_bin", r.cpkv_bin ? nlohmann::json(*r.cpkv_bin) : nlohmann::json(nullptr)}};
  return h;
}

}  // namespace

CheckedRequest check_run(const ReplayRequest& request, const Registry& registry, const SourceFile& source_file) {
  CheckedRequest c = check_request(request, registry);
  if (c.backend->handoff) {
    c.handed = std::make_shared<const HandedRun>(handed_run(c));
  } else if (source_file) {
    const std::string path = source_file(c);
    if (c.backend->replay) {
      BatchSource source = BatchSource::from_trace(path, c.request.batch);
      ScannedSource scanned = check_source(c, source);
      c.source = std::make_shared<const CheckedSource>(CheckedSource{std::move(source), std::move(scanned)});
    }
  }
  return c;
}

CheckedBench check_bench_request(const BenchRequest& request, const Registry& registry) {
  CheckedBench c;
  c.checked = check_request(request.replay, registry);
  if (!c.checked.backend->bench) {
    std::string benches;
    for (const BackendEntry& e : registry.entries()) {
      if (e.bench) benches += (benches.empty() ? "" : ", ") + e.name;
    }
    throw RequestError("backend", fmt::format("'{}': benchmarks run on {} only", c.checked.backend->name, benches.empty() ? "none of this build's backends" : benches));
  }
  if (request.reps < 1 || request.reps > request_limits::bench_reps_max) {
    throw RequestError("reps", fmt::format("{} is not in 1..{}", request.reps, request_limits::bench_reps_max));
  }
  if (request.cp && (*request.cp < 1 || *request.cp > model::limits::cp_max)) {
    throw RequestError("cp", fmt::format("{} is outside 1..{}", *request.cp, model::limits::cp_max));
  }
  c.reps = request.reps;
  c.cp = request.cp;
  c.time_sliced = request.time_sliced;
  // The bench's own knob: the option, else the environment (set, not empty and not 0), else off.
  if (request.bulk) {
    c.bulk = *request.bulk;
    c.bulk_origin = "--bulk";
  } else if (const char* text = std::getenv(kBenchBulkEnvironment); text != nullptr && text[0] != '\0') {
    c.bulk = std::string_view(text) != "0";
    c.bulk_origin = kBenchBulkEnvironment;
  }
  return c;
}

ScannedSource check_source(const CheckedRequest& checked, const BatchSource& source) {
  const ReplayRequest& r = checked.request;
  if (source.setting.cp > checked.backend->ranks_max) {
    throw RequestError("backend", fmt::format("{}: cp {} of {} exceeds this backend's cap of {} ranks", checked.backend->name, source.setting.cp,
                                              r.trace_label, checked.backend->ranks_max));
  }
  ScannedSource s;
  s.scan = scan(source);
  if (r.batch && s.scan.shape.batches == 0) throw RequestError("batch", fmt::format("{} is not in {}", *r.batch, r.trace_label));
  s.layer_count = source.setting.layer_count();
  s.layers = std::min(r.layers.value_or(s.layer_count), s.layer_count);
  if (r.ipc_missing_rank >= source.setting.cp) {
    throw RequestError("ipc_missing_rank", fmt::format("{} is not a rank of cp = {}", r.ipc_missing_rank, source.setting.cp));
  }
  if (r.ranks && *r.ranks != source.setting.cp) {
    throw RequestError("ranks", fmt::format("{} ranks for a trace of cp = {} (one rank per context-parallel rank)", *r.ranks, source.setting.cp));
  }
  s.stale_regions = sweep_stale_regions();
  return s;
}

std::string run_header(std::string_view front_end, const CheckedRequest& checked, const BatchSource& source, const ScannedSource& scanned,
                       std::string_view mode) {
  return fmt::format("{}: {} | cp {} page {} | {} batches | {} of {} layers | mode {} | seed {}{}", front_end, checked.request.trace_label,
                     source.setting.cp, source.setting.page_size, scanned.scan.shape.batches, scanned.layers, scanned.layer_count, mode,
                     checked.request.seed,
                     scanned.stale_regions > 0 ? fmt::format(" | removed {} stale shared-memory regions", scanned.stale_regions) : "");
}

std::vector<std::string> run_header_lines(std::string_view front_end, const CheckedRequest& checked, const BatchSource& source,
                                          const ScannedSource& scanned, std::string_view mode) {
  std::vector<std::string> lines = {run_header(front_end, checked, source, scanned, mode)};
  if (std::string knobs = knobs_line(checked); !knobs.empty()) lines.push_back(std::move(knobs));  // the resolved configuration
  if (!checked.backend_line.empty()) lines.push_back(checked.backend_line);
  // A foreign exchange's planted bug is its own (checked.mutant stays none): the request names it.
  if (checked.request.mutant != "none") {
    lines.push_back(fmt::format("MUTANT ACTIVE: {} (a planted bug; this run is expected to fail)", checked.request.mutant));
  }
  return lines;
}

void run_variants(const CheckedRequest& checked, const BatchSource& source, const ScannedSource& scanned, Backend& backend,
                  const std::function<void(model::Variant)>& on_variant_start, const std::function<void(const VariantRun&)>& on_variant_end) {
  for (model::Variant variant : checked.variants) {
    if (stop_requested() != 0) return;  // a front end's stop (interrupt.hpp): no further variant
    if (on_variant_start) on_variant_start(variant);
    RunOptions options;
    options.variant = variant;
    options.layers = scanned.layers;
    options.seed = checked.request.seed;
    options.mutant = checked.mutant;
    options.ipc_missing_rank = checked.request.ipc_missing_rank;
    set_activity(fmt::format("{} variant {} ({})", checked.request.trace_label, model::to_string(variant), backend.name()));
    const auto start = std::chrono::steady_clock::now();
    VariantRun run{variant, backend.run(source, options), 0, {}};
    run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!run.report.passed()) run.replay_line = replay_line(checked, variant, scanned.layers);
    if (on_variant_end) on_variant_end(run);
  }
}

std::string shell_word(std::string_view text) {
  const bool plain = !text.empty() && std::all_of(text.begin(), text.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) != 0 || std::string_view("_.:/,=+-@%").find(ch) != std::string_view::npos;
  });
  if (plain) return std::string(text);
  std::string out = "'";
  for (char ch : text) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

std::string replay_line(const CheckedRequest& checked, model::Variant variant, std::int32_t layers) {
  const ReplayRequest& r = checked.request;
  // A foreign exchange is its own variant: the line names it (quoted: its arguments hold parentheses).
  const std::string what = r.impl ? fmt::format("--impl {}", shell_word(*r.impl)) : fmt::format("--variant {}", model::to_string(variant));
  // The trace path is a word of the line too: a space or a quote in it must not split or end it.
  std::string line = fmt::format("cpkv replay {} --backend {} {} --seed {} --layers {}", shell_word(r.trace_label), r.backend, what, r.seed, layers);
  if (r.ranks) line += fmt::format(" --ranks {}", *r.ranks);
  if (r.device) line += fmt::format(" --device {}", *r.device);
  if (r.schedule) line += fmt::format(" --schedule {}", *r.schedule);
  if (!r.schedule && (checked.backend->options & kTakesRanksAs) != 0) line += fmt::format(" --ranks-as {}", r.ranks_as.value_or("processes"));
  if (r.swarm) line += " --swarm";
  if (r.wait_ms_max) line += fmt::format(" --wait-ms-max {}", *r.wait_ms_max);
  if (r.stuck_ms_max) line += fmt::format(" --stuck-ms-max {}", *r.stuck_ms_max);
  if (r.mutant != "none") line += fmt::format(" --mutant {}", r.mutant);
  if (r.batch) line += fmt::format(" --batch {}", *r.batch);
  if (r.ipc_missing_rank >= 0) line += fmt::format(" --ipc-missing-rank {}", r.ipc_missing_rank);
  if (r.exchange) line += fmt::format(" --exchange {}", traces::escape_bytes(*r.exchange));
  if (r.exchange_load_ms_max) line += fmt::format(" --exchange-load-ms-max {}", *r.exchange_load_ms_max);
  if (r.pool_memory) line += fmt::format(" --pool-memory {}", *r.pool_memory);
  if (r.compose_blocks_per_sm) line += fmt::format(" --compose-blocks-per-sm {}", *r.compose_blocks_per_sm);
  if (r.no_delays) line += " --no-delays";
  if (r.time) line += " --time";
  if (r.require_attention) line += " --require-attention";
  if (r.attention_output) line += " --attention-output";
  if (r.import_s_max) line += fmt::format(" --import-s-max {:g}", *r.import_s_max);
  if (r.cpkv_bin) line += fmt::format(" --cpkv-bin {}", shell_word(*r.cpkv_bin));
  return line;
}

std::vector<std::string> failure_lines(const RunReport& report, const std::string& line) {
  std::vector<std::string> out;
  if (!report.failure.empty()) out.push_back(report.failure);
  for (const Violation& v : report.violations) out.push_back(describe(v));
  for (const Totals& t : report.ranks) {
    if (t.first_mismatch[0] != '\0') {
      out.emplace_back(t.first_mismatch);
      break;
    }
  }
  out.push_back("replay: " + line);
  return out;
}

nlohmann::json replay_json(const CheckedRequest& checked, const ScannedSource& scanned, std::string_view mode, const nlohmann::json& runs) {
  nlohmann::json json = replay_json_common(checked, scanned.layers);
  json["mode"] = mode;
  json["rejected_batches"] = rejected_json(scanned.scan.rejected);
  json["runs"] = runs;
  return json;
}

}  // namespace cpkv::harness

namespace cpkv::harness {

void register_model_backend(Registry& registry) {
  BackendEntry model;
  model.name = "model";
  model.summary = "plans, verdicts, bytes and modelled time of every batch and variant, no content moved (the cost model)";
  model.model = [](const BatchSource& source, const std::string& label, const model::CostParameters& parameters, const ModelReplayOptions& options) {
    return model_replay(source, label, parameters, options);
  };
  registry.add(std::move(model));
}

}  // namespace cpkv::harness

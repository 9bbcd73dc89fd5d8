// Bindings for cpkv.conformance, the harness that runs an engine's own exchange (PyTorch) under
// cpkv's checks: the plain oracle's byte check (model/oracle.hpp), pool and current-row content
// written straight into the harness's tensors (model/content.hpp), an explanation of a wrong row
// (which row of which token and layer the byte belongs to), the simulator's swarm fault knobs
// (sim/runner.hpp), and the simulator's own state checker fed by an implementation's events
// (sim/checkers.hpp). No model logic is restated here: every number comes from the model's headers.
#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <sstream>

#include <fmt/format.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "cpkv/harness/run.hpp"
#include "cpkv/model/content.hpp"
#include "cpkv/model/expected.hpp"
#include "cpkv/model/oracle.hpp"
#include "cpkv/sim/checkers.hpp"
#include "cpkv/sim/happens_before.hpp"
#include "cpkv/sim/runner.hpp"
#include "cpkv/sim/world.hpp"

namespace cpkv::python {
namespace {

// Freshly allocated staging is poisoned with this byte, as the simulator's world poisons its own
// (sim/src/world.cpp): a slot read before any fill shows as poison, not as plausible zeros.
constexpr std::uint8_t kPoisonByte = 0xA5;
// Pool rows explain_row also searches (every layer): beyond this a mismatch report would take seconds.
constexpr std::int64_t kPoolSearchRowsMax = 1 << 16;

// A writable C-contiguous uint8 buffer (a CPU tensor's .numpy()), checked to hold `bytes` bytes.
std::span<std::uint8_t> writable_bytes(const py::object& buffer, std::uint64_t bytes, const char* name) {
  py::array array = py::array::ensure(buffer);
  if (!array || array.itemsize() != 1) throw InputError(name, "is not a buffer of one-byte items");
  if (!(array.flags() & py::array::c_style)) throw InputError(name, "is not C-contiguous");
  if (!array.writeable()) throw InputError(name, "is read-only");
  if (static_cast<std::uint64_t>(array.nbytes()) != bytes) throw InputError(name, fmt::format("{} bytes, expected {}", array.nbytes(), bytes));
  return {static_cast<std::uint8_t*>(array.mutable_data()), static_cast<std::size_t>(array.nbytes())};
}

void write_row(std::uint64_t key, std::uint32_t row_bytes, std::uint8_t* out) {
  for (std::uint32_t b = 0; b < row_bytes; ++b) out[b] = model::content_byte(key, b);
}

// The rows of the owned prefix pages, for every layer, at the storage owner's local page g / cp
// (PROTOCOL.md sections 1 and 8). out: (layers, pool_pages_per_rank, P, row_bytes) uint8.
void populate_pool(const py::object& out, const model::Setting& s, std::uint64_t seed, const py::object& kind, std::int32_t rank,
                   std::int32_t layers, const std::vector<std::int64_t>& logical_pages) {
  const std::uint32_t k = require_kind(s, kind);
  require_rank(rank, s.cp);
  const std::uint32_t row_bytes = s.kinds[k].row_bytes;
  const std::uint64_t page_bytes = std::uint64_t{row_bytes} * s.page_size;
  const std::uint64_t layer_bytes = page_bytes * s.pool_pages_per_rank();
  const auto bytes = writable_bytes(out, layer_bytes * layers, "out");
  for (const std::int64_t g : logical_pages) {
    if (g < 0 || g >= s.pool_pages) throw InputError("logical_pages", fmt::format("{} is outside the pool [0, {})", g, s.pool_pages));
  }
  py::gil_scoped_release release;
  for (std::int32_t layer = 0; layer < layers; ++layer) {
    if (!s.kind_active(k, layer)) continue;
    for (const std::int64_t g : logical_pages) {
      if (g % s.cp != rank) continue;
      std::uint8_t* page = bytes.data() + layer * layer_bytes + (g / s.cp) * page_bytes;
      for (std::int32_t r = 0; r < s.page_size; ++r) write_row(model::prefix_row_key(seed, layer, k, g, r), row_bytes, page + r * row_bytes);
    }
  }
}

// The current rows of the given (request, token) pairs on one layer: what the model's KV write
// hands the exchange. out: (n, row_bytes) uint8.
void fill_current_rows(const py::object& out, const model::Setting& s, std::uint64_t seed, std::int32_t layer, const py::object& kind,
                       const std::vector<std::int64_t>& requests, const std::vector<std::int64_t>& tokens) {
  const std::uint32_t k = require_kind(s, kind);
  require_layer(s, layer);
  if (requests.size() != tokens.size()) throw InputError("tokens", fmt::format("{} tokens for {} requests", tokens.size(), requests.size()));
  const std::uint32_t row_bytes = s.kinds[k].row_bytes;
  const auto bytes = writable_bytes(out, std::uint64_t{row_bytes} * tokens.size(), "out");
  py::gil_scoped_release release;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    write_row(model::current_row_key(seed, layer, k, static_cast<std::uint32_t>(requests[i]), static_cast<std::uint64_t>(tokens[i])), row_bytes,
              bytes.data() + i * row_bytes);
  }
}

void poison(const py::object& out, std::uint64_t bytes) {
  const auto span = writable_bytes(out, bytes, "out");
  std::memset(span.data(), kPoisonByte, span.size());
}

// Whether the 8-byte word of `actual` around byte `byte` is that word of the row with `key`.
bool word_matches(std::uint64_t key, const std::uint8_t* actual, std::uint32_t row_bytes, std::uint32_t byte) {
  const std::uint32_t first = byte / 8 * 8;
  const std::uint64_t word = model::content_word(key, byte / 8);
  for (std::uint32_t b = first; b < std::min(first + 8, row_bytes); ++b) {
    if (actual[b] != static_cast<std::uint8_t>(word >> (8 * (b - first)))) return false;
  }
  return true;
}

std::string layer_relation(std::int32_t found, std::int32_t expected) {
  if (found == expected) return fmt::format("layer {}", found);
  const bool other_half = (found - expected) % 2 != 0;
  return fmt::format("layer {} instead of {} ({})", found, expected,
                     other_half ? "the other parity half's layer" : "the same half, an earlier or later layer");
}

// A row of some batch whose 8-byte word around the wrong byte is the wrong row's: its layer, request,
// token and whether it is a prefix row (then its logical page).
struct RowMatch {
  std::int32_t layer = 0;
  std::size_t request = 0;
  std::int64_t token = 0;
  bool prefix = false;
  std::int64_t page = -1;
};

// The first row of `batch` (every layer, every request, prefix and current tokens) whose word at
// `byte` is that of `actual`. Rows are keyed as section 8 says (no batch index in the key).
std::optional<RowMatch> find_batch_row(const model::Setting& s, const model::Batch& batch, std::uint64_t seed, std::uint32_t k,
                                       const std::uint8_t* actual, std::uint32_t row_bytes, std::uint32_t byte) {
  for (std::int32_t l = 0; l < s.layer_count(); ++l) {
    if (!s.kind_active(k, l)) continue;
    for (std::size_t r = 0; r < batch.requests.size(); ++r) {
      const model::Request& req = batch.requests[r];
      for (std::int64_t t = 0; t < req.prefix_len + req.extend_len; ++t) {
        const bool prefix = t < req.prefix_len;
        const std::int64_t page = prefix ? req.prefix_pages[t / s.page_size] : -1;
        const std::uint64_t key = prefix ? model::prefix_row_key(seed, l, k, page, t % s.page_size)
                                         : model::current_row_key(seed, l, k, static_cast<std::uint32_t>(r), t);
        if (word_matches(key, actual, row_bytes, byte)) return RowMatch{l, r, t, prefix, page};
      }
    }
  }
  return std::nullopt;
}

std::string describe_row(const RowMatch& m) {
  return fmt::format("request {} token {} ({})", m.request, m.token, m.prefix ? fmt::format("prefix page {}", m.page) : "current");
}

// A pool page the batch does not name (a stale or foreign plan), searched when the pool is small.
std::optional<std::string> find_pool_row(const model::Setting& s, std::uint64_t seed, std::uint32_t k, std::int32_t layer,
                                         const std::uint8_t* actual, std::uint32_t row_bytes, std::uint32_t byte) {
  if (s.pool_pages * s.page_size > kPoolSearchRowsMax) return std::nullopt;
  for (std::int32_t l = 0; l < s.layer_count(); ++l) {
    if (!s.kind_active(k, l)) continue;
    for (std::int64_t g = 0; g < s.pool_pages; ++g) {
      for (std::int32_t r = 0; r < s.page_size; ++r) {
        if (!word_matches(model::prefix_row_key(seed, l, k, g, r), actual, row_bytes, byte)) continue;
        return fmt::format("a pool row the batch does not name: logical page {} row {}, {} (a stale or foreign plan)", g, r, layer_relation(l, layer));
      }
    }
  }
  return std::nullopt;
}

// What the wrong byte is: the matching row of some token of the batch on some layer (searched over
// every layer), a row of the previous batch (a stale row: staging or a plan not rewritten for this
// batch), zeros, staging poison, a pool row, or nothing either batch holds.
std::string explain_row(const model::Setting& s, const model::Batch& batch, std::uint64_t seed, std::int32_t layer, const py::object& kind,
                        std::int64_t slot, std::int32_t row, std::uint32_t byte, const py::bytes& actual_row,
                        const std::optional<model::Batch>& previous, std::int64_t batch_index) {
  const std::uint32_t k = require_kind(s, kind);
  require_valid(s, batch);
  if (previous) require_valid(s, *previous);
  const std::string text = actual_row;
  const std::uint32_t row_bytes = s.kinds[k].row_bytes;
  if (text.size() != row_bytes || byte >= row_bytes) throw InputError("actual_row", fmt::format("{} bytes, expected {}", text.size(), row_bytes));
  const auto* actual = reinterpret_cast<const std::uint8_t*>(text.data());
  const std::uint32_t first = byte / 8 * 8;
  const std::uint32_t last = std::min(first + 8, row_bytes);
  if (std::all_of(actual + first, actual + last, [](std::uint8_t b) { return b == 0; })) return "zeros (a row never written, or zeroed and not filled)";
  if (std::all_of(actual + first, actual + last, [](std::uint8_t b) { return b == kPoisonByte; })) {
    return "0xa5 staging poison (read from staging no rank wrote)";
  }
  const model::spec::ByteOracle oracle(s.page_size, batch);
  const model::spec::DenseSlot& want = oracle.slot(slot);
  if (const auto m = find_batch_row(s, batch, seed, k, actual, row_bytes, byte)) {
    const bool same_token = static_cast<std::int32_t>(m->request) == want.request && m->token == want.first_token + row;
    if (same_token) return fmt::format("another layer's row: the right token, {}", layer_relation(m->layer, layer));
    return fmt::format("another token's row: {}, {}", describe_row(*m), layer_relation(m->layer, layer));
  }
  if (previous) {
    if (const auto m = find_batch_row(s, *previous, seed, k, actual, row_bytes, byte)) {
      return fmt::format("a row of batch {} (the previous batch, stale: not rewritten for this one): {}, {}",
                         batch_index >= 1 ? fmt::format("{}", batch_index - 1) : std::string("B-1"), describe_row(*m), layer_relation(m->layer, layer));
    }
  }
  if (const auto pool = find_pool_row(s, seed, k, layer, actual, row_bytes, byte)) return *pool;
  return "no row of this batch on any layer (garbage: a sum of several rows, or memory nobody wrote)";
}

void bind_oracle(py::module_& m) {
  py::class_<model::spec::ByteOracle>(m, "ByteOracle", "The plain oracle written from PROTOCOL.md (model/oracle.hpp): what every rank's dense buffer holds.")
      .def(py::init([](const model::Setting& s, const model::Batch& b) {
             require_valid(s, b);
             return model::spec::ByteOracle(s.page_size, b);
           }), py::arg("setting"), py::arg("batch"))
      .def_property_readonly("slot_count", &model::spec::ByteOracle::slot_count)
      .def_property_readonly("current_pages_total", &model::spec::ByteOracle::current_pages_total)
      .def("check", [](const model::spec::ByteOracle& o, const py::object& actual, const model::Setting& s, std::uint64_t seed, std::int32_t layer,
                       const py::object& kind) -> std::optional<model::Mismatch> {
        const std::uint32_t k = require_kind(s, kind);
        require_layer(s, layer);
        py::array a = py::array::ensure(actual, py::array::c_style);
        if (!a || a.itemsize() != 1) throw InputError("actual", "is not a buffer of one-byte items");
        const std::uint64_t want = static_cast<std::uint64_t>(o.slot_count()) * o.page_size() * s.kinds[k].row_bytes;
        if (static_cast<std::uint64_t>(a.nbytes()) != want) throw InputError("actual", fmt::format("{} bytes, expected {}", a.nbytes(), want));
        const std::span<const std::uint8_t> bytes(static_cast<const std::uint8_t*>(a.data()), static_cast<std::size_t>(a.nbytes()));
        py::gil_scoped_release release;
        return o.check(bytes, seed, layer, k, s.kinds[k].row_bytes);
      }, py::arg("actual"), py::arg("setting"), py::arg("seed"), py::arg("layer"), py::arg("kind"),
           "The first wrong byte of a dense buffer (a Mismatch), or None.")
      .def("row", [](const model::spec::ByteOracle& o, const model::Setting& s, std::uint64_t seed, std::int32_t layer, const py::object& kind,
                     std::int64_t slot, std::int32_t row) {
        const std::uint32_t k = require_kind(s, kind);
        if (slot < 0 || slot >= o.slot_count()) throw InputError("slot", fmt::format("{} is not a slot of {}", slot, o.slot_count()));
        std::vector<std::uint8_t> out(s.kinds[k].row_bytes);
        o.row(seed, require_layer(s, layer), k, slot, row, out);
        return to_numpy(std::move(out));
      }, py::arg("setting"), py::arg("seed"), py::arg("layer"), py::arg("kind"), py::arg("slot"), py::arg("row"))
      .def("dense", [](const model::spec::ByteOracle& o, const model::Setting& s, std::uint64_t seed, std::int32_t layer, const py::object& kind) {
        const std::uint32_t k = require_kind(s, kind);
        require_layer(s, layer);
        const std::uint32_t row_bytes = s.kinds[k].row_bytes;
        std::vector<std::uint8_t> out(static_cast<std::size_t>(o.slot_count()) * o.page_size() * row_bytes);
        {
          py::gil_scoped_release release;
          for (std::int64_t slot = 0; slot < o.slot_count(); ++slot) {
            for (std::int32_t r = 0; r < o.page_size(); ++r) {
              o.row(seed, layer, k, slot, r, std::span(out.data() + (slot * o.page_size() + r) * row_bytes, row_bytes));
            }
          }
        }
        return to_numpy(std::move(out), {static_cast<py::ssize_t>(o.slot_count()) * o.page_size(), static_cast<py::ssize_t>(row_bytes)});
      }, py::arg("setting"), py::arg("seed"), py::arg("layer"), py::arg("kind"),
           "The whole expected dense buffer (slot_count * P, row_bytes) uint8, from the plain oracle (uploaded once to a GPU for its check).");
  m.def("populate_pool", &populate_pool, py::arg("out"), py::arg("setting"), py::arg("seed"), py::arg("kind"), py::arg("rank"), py::arg("layers"),
        py::arg("logical_pages"), "Write every layer's rows of the rank's owned prefix pages into out (layers, pages_per_rank, P, row_bytes).");
  m.def("fill_current_rows", &fill_current_rows, py::arg("out"), py::arg("setting"), py::arg("seed"), py::arg("layer"), py::arg("kind"),
        py::arg("requests"), py::arg("tokens"), "Write the current rows of (request, token) pairs on a layer into out (n, row_bytes).");
  m.def("poison", &poison, py::arg("out"), py::arg("bytes"), "Fill a new buffer with the 0xa5 staging poison.");
  m.attr("POISON_BYTE") = kPoisonByte;
  m.def("explain_row", &explain_row, py::arg("setting"), py::arg("batch"), py::arg("seed"), py::arg("layer"), py::arg("kind"), py::arg("slot"),
        py::arg("row"), py::arg("byte"), py::arg("actual_row"), py::arg("previous") = py::none(), py::arg("batch_index") = -1,
        "What the wrong row holds: another token's or layer's row, a row of the previous batch (previous: that batch), zeros, poison.");
}

py::dict knobs(const sim::FaultOptions& f) {
  py::dict d;
  d["seed"] = f.seed;
  d["delay_us_max"] = f.delay_us_max;
  d["flag_write_delay_probability"] = f.flag_write_delay_probability;
  d["gather_delay_probability"] = f.gather_delay_probability;
  d["write_delay_probability"] = f.write_delay_probability;
  d["slow_producer_delay_us"] = f.slow_producer_delay_us;
  d["slow_reader_delay_us"] = f.slow_reader_delay_us;
  d["slow_rotation"] = f.slow_rotation == sim::SlowRotation::fixed ? "fixed" : f.slow_rotation == sim::SlowRotation::per_layer ? "per_layer" : "per_batch";
  d["slow_rank"] = f.slow_rank;
  d["slow_reader_offset"] = f.slow_reader_offset;
  d["describe"] = sim::describe(f);
  return d;
}

// The simulator's state checker over a World of its own, fed one event at a time in the order the
// ranks made them (the harness merges their logs by CLOCK_MONOTONIC). Each event also updates the
// shadow state the simulator's step machine keeps (stamps, read epochs) exactly as machine.cpp does,
// so the checker sees what it sees in a simulated run and prints the same violation lines.
class EventChecker {
 public:
  EventChecker(const model::Setting& s, std::int32_t layers, std::int64_t slot_count_max, std::int64_t current_pages_max)
      : setting_(s), geometry_(sim::geometry_for(s, layers, slot_count_max, current_pages_max)) {
    geometry_.staging_slots = current_pages_max;  // shadow stamps only: the world's own staging is never used
    geometry_.pool_pages_touched = std::vector<std::int64_t>{};
    world_ = std::make_unique<sim::World>(geometry_, 0);
    for (std::int32_t r = 0; r < s.cp; ++r) checkers_.emplace_back(*world_, setting_, r, 2);
  }
  void begin_batch(std::int64_t batch) {
    batch_ = batch;
    for (auto& c : checkers_) c.at(batch, steps_);
  }
  void layer_begin(std::int32_t rank, std::int32_t layer) { checker(rank, layer).on_layer_begin(layer, 1); }
  void write(std::int32_t rank, std::int32_t layer, std::int32_t half, std::int64_t current_index, bool fill) {
    auto& c = checker(rank, layer);
    require_half(half);
    require_index(current_index);
    c.on_shared_write(layer, half, current_index);
    sim::StagingStamp& stamp = world_->stamp(rank, half, current_index);
    stamp.layer.store(sim::layer_tag(batch_, layer));
    stamp.state.store(static_cast<std::int32_t>(fill ? sim::StampState::filled : sim::StampState::zeroed));
    if (fill) c.on_fill(half, layer, current_index, -1);
  }
  void read(std::int32_t rank, std::int32_t layer, std::int32_t peer, std::int32_t half, std::int64_t current_index) {
    auto& c = checker(rank, layer);
    require_rank(peer, setting_.cp);
    require_half(half);
    require_index(current_index);
    if (peer != rank) world_->reading_layer(rank).store(layer);
    c.on_staging_read(world_->stamp(peer, half, current_index), peer, layer, current_index);
  }
  // Section 12: this rank computed current row `current_row` (current index * P + row) for its
  // all-gather (invariant 1 per token row: a page may have several writers, a row one).
  void token_write(std::int32_t rank, std::int32_t layer, std::int64_t current_row) {
    auto& c = checker(rank, layer);
    if (current_row < 0 || current_row >= world_->current_capacity() * setting_.page_size) {
      throw InputError("row", fmt::format("current row {} is outside [0, {})", current_row, world_->current_capacity() * setting_.page_size));
    }
    c.on_token_fill(layer, current_row, -1);
  }
  void arrive(std::int32_t rank, std::int32_t layer) { checker(rank, layer).on_barrier_arrive(layer); }
  void passed(std::int32_t rank, std::int32_t layer, std::uint64_t phase) { checker(rank, layer).on_barrier_pass(layer, phase); }
  void layer_end(std::int32_t rank, std::int32_t layer) {
    checker(rank, layer);
    world_->reading_layer(rank).store(-1);
  }
  std::vector<std::string> violations() const {
    std::vector<std::string> lines;
    for (const harness::Violation& v : world_->violations()) lines.push_back(harness::describe(v));
    return lines;
  }
  std::vector<std::int32_t> invariants() const {
    std::vector<std::int32_t> out;
    for (const harness::Violation& v : world_->violations()) out.push_back(v.invariant);
    return out;
  }

 private:
  sim::StateChecker& checker(std::int32_t rank, std::int32_t layer) {
    require_rank(rank, setting_.cp);
    if (layer < 0 || layer >= geometry_.layers) throw InputError("layer", fmt::format("{} is not one of the {} layers run", layer, geometry_.layers));
    ++steps_;
    checkers_[rank].at(batch_, steps_);
    return checkers_[rank];
  }
  static void require_half(std::int32_t half) {
    if (half != 0 && half != 1) throw InputError("half", fmt::format("{} is not a parity half (0 or 1)", half));
  }
  void require_index(std::int64_t index) const {
    if (index < 0 || index >= world_->current_capacity()) {
      throw InputError("slot", fmt::format("current index {} is outside [0, {})", index, world_->current_capacity()));
    }
  }
  model::Setting setting_;
  sim::WorldGeometry geometry_;
  std::unique_ptr<sim::World> world_;
  std::vector<sim::StateChecker> checkers_;
  std::int64_t batch_ = -1;
  std::uint64_t steps_ = 0;
};

void bind_checker(py::module_& m) {
  py::class_<EventChecker>(m, "EventChecker", "The simulator's state checker (invariants 1, 2 and 4) fed by an implementation's events.")
      .def(py::init<const model::Setting&, std::int32_t, std::int64_t, std::int64_t>(), py::arg("setting"), py::arg("layers"),
           py::arg("slot_count_max"), py::arg("current_pages_max"))
      .def("begin_batch", &EventChecker::begin_batch, py::arg("batch"))
      .def("layer_begin", &EventChecker::layer_begin, py::arg("rank"), py::arg("layer"))
      .def("write", &EventChecker::write, py::arg("rank"), py::arg("layer"), py::arg("half"), py::arg("current_index"), py::arg("fill"))
      .def("read", &EventChecker::read, py::arg("rank"), py::arg("layer"), py::arg("peer"), py::arg("half"), py::arg("current_index"))
      .def("token_write", &EventChecker::token_write, py::arg("rank"), py::arg("layer"), py::arg("current_row"))
      .def("arrive", &EventChecker::arrive, py::arg("rank"), py::arg("layer"))
      .def("passed", &EventChecker::passed, py::arg("rank"), py::arg("layer"), py::arg("phase"))
      .def("layer_end", &EventChecker::layer_end, py::arg("rank"), py::arg("layer"))
      .def("violations", &EventChecker::violations, "The violation lines, as the simulator prints them.")
      .def("invariants", &EventChecker::invariants, "The invariant of each violation, in order.");
  m.def("swarm_knobs", [](std::uint64_t seed) { return knobs(sim::swarm_faults(seed)); }, py::arg("seed"),
        "The fault knobs `cpkv replay --swarm --seed S` draws, as a dict (with their one-line description).");
  m.def("default_knobs", [](std::uint64_t seed) {
    sim::FaultOptions f;
    f.seed = seed;
    return knobs(f);
  }, py::arg("seed"), "The fixed fault knobs of a plain `cpkv replay`.");
}

// Happens-before (sim/happens_before.hpp): the one implementation, for the harness's per-batch events
// (HbClocks) and the simulator's event log (judge_event_log).
void bind_happens_before(py::module_& m) {
  py::class_<sim::HbClocks>(m, "HbClocks", "Vector clocks over cp ranks and the staging locations they touch (sim/happens_before.hpp).")
      .def(py::init<std::int32_t>(), py::arg("cp"))
      .def("arrive", &sim::HbClocks::arrive, py::arg("rank"), py::arg("kind"), py::arg("phase"))
      .def("passed", &sim::HbClocks::pass, py::arg("rank"), py::arg("kind"), py::arg("phase"),
           "The pass joins every arrival of its phase seen so far.")
      .def("join_all", &sim::HbClocks::join_all, "A collective every rank takes part in.")
      .def("write", [](sim::HbClocks& c, std::int32_t rank, std::int32_t owner, std::int32_t half, std::int64_t slot, std::int32_t layer,
                       const std::string& what) { c.write(rank, {owner, half, slot}, layer, what); },
           py::arg("rank"), py::arg("owner"), py::arg("half"), py::arg("slot"), py::arg("layer"), py::arg("what"))
      .def("read", [](sim::HbClocks& c, std::int32_t rank, std::int32_t owner, std::int32_t half, std::int64_t slot, std::int32_t layer) {
             c.read(rank, {owner, half, slot}, layer);
           }, py::arg("rank"), py::arg("owner"), py::arg("half"), py::arg("slot"), py::arg("layer"))
      .def("race_lines", [](sim::HbClocks& c, std::int64_t batch) { return sim::race_lines(batch, c.take_races()); }, py::arg("batch"),
           "The invariant 2 lines of the races found since the last call (then forgotten).");
  m.def("judge_event_log", [](const std::string& text, std::int32_t cp, std::int32_t halves) {
          std::istringstream in(text);
          try {
            return sim::judge_event_log(in, cp, halves);
          } catch (const sim::EventLogError& e) {
            throw py::value_error(e.what());
          }
        }, py::arg("text"), py::arg("cp"), py::arg("halves") = 2,
        "Happens-before over a scheduled run's event log (docs/event-log.md): the race lines of each batch. ValueError names a bad line.");
}

}  // namespace

void bind_conformance(py::module_& m) {
  py::module_ sub = m.def_submodule("conformance", "The C++ side of cpkv.conformance.");
  bind_oracle(sub);
  bind_checker(sub);
  bind_happens_before(sub);
}

}  // namespace cpkv::python

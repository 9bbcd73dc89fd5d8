// Bindings of the deterministic test content and the expected dense buffers
// (model/include/cpkv/model: content.hpp, expected.hpp): the row keys and row bytes an engine's pool
// and fill use, the expected dense buffer as a NumPy array (no copy), and the located comparison.
#include <fmt/format.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "cpkv/model/limits.hpp"
#include "cpkv/model/content.hpp"
#include "cpkv/model/expected.hpp"

namespace cpkv::python {
namespace {

std::vector<std::uint8_t> row_bytes_of_key(std::uint64_t key, std::uint32_t row_bytes) {
  std::vector<std::uint8_t> row(row_bytes);
  for (std::uint32_t b = 0; b < row_bytes; ++b) row[b] = model::content_byte(key, b);
  return row;
}

void require_matching(const model::Setting& s, const model::BatchLayout& l) {
  if (l.cp != s.cp || l.page_size != s.page_size) {
    throw InputError("layout", fmt::format("built for cp {} page_size {}, not the setting's cp {} page_size {}", l.cp, l.page_size, s.cp, s.page_size));
  }
}

// The kind must exist on the layer: an indexer buffer has no rows on a shared ('S') layer.
std::uint32_t require_active_kind(const model::Setting& s, const py::object& kind, std::int32_t layer) {
  const std::uint32_t k = require_kind(s, kind);
  if (!s.kind_active(k, require_layer(s, layer))) {
    throw InputError("kind", fmt::format("{} is not active on layer {} ('{}'): it exists on 'F' layers only", s.kinds[k].name, layer, s.layer_pattern[layer]));
  }
  return k;
}

// The bytes of any NumPy-compatible buffer of one-byte items, C-contiguous (copied only if not).
py::array bytes_view(const py::object& buffer, const char* name) {
  py::array array = py::array::ensure(buffer);
  if (!array) throw InputError(name, "is not an array or buffer");
  if (array.itemsize() != 1) {
    throw InputError(name, fmt::format("items of {} bytes: pass the buffer's bytes (a uint8 view)", array.itemsize()));
  }
  if (!(array.flags() & py::array::c_style)) array = py::array::ensure(array, py::array::c_style);
  return array;
}

std::span<const std::uint8_t> span_of(const py::array& a) { return {static_cast<const std::uint8_t*>(a.data()), static_cast<std::size_t>(a.nbytes())}; }

std::optional<model::Mismatch> compare(const py::object& actual, const py::object& expected, std::int32_t page_size, std::uint32_t row_bytes) {
  const py::array a = bytes_view(actual, "actual");
  const py::array e = bytes_view(expected, "expected");
  if (a.nbytes() != e.nbytes()) throw InputError("actual", fmt::format("{} bytes, expected {}", a.nbytes(), e.nbytes()));
  if (page_size < 1 || row_bytes < 1 || e.nbytes() % (static_cast<py::ssize_t>(page_size) * row_bytes) != 0) {
    throw InputError("expected", fmt::format("{} bytes are not whole pages of {} rows of {} bytes", e.nbytes(), page_size, row_bytes));
  }
  py::gil_scoped_release release;
  return model::compare_dense(span_of(a), span_of(e), page_size, row_bytes);
}

py::array_t<std::uint8_t> expected_dense(const model::Setting& s, const model::BatchLayout& l, std::uint64_t seed, std::int32_t layer, const py::object& kind) {
  require_matching(s, l);
  const std::uint32_t k = require_active_kind(s, kind, layer);
  const std::uint32_t row_bytes = s.kinds[k].row_bytes;
  std::vector<std::uint8_t> dense;
  {
    py::gil_scoped_release release;
    dense = model::expected_dense(l, seed, layer, k, row_bytes);
  }
  return to_numpy(std::move(dense), {static_cast<py::ssize_t>(l.slot_count) * l.page_size, static_cast<py::ssize_t>(row_bytes)});
}

void bind_keys(py::module_& m) {
  m.def("prefix_row_key", &model::prefix_row_key, py::arg("seed"), py::arg("layer"), py::arg("kind"), py::arg("logical_page"), py::arg("row_in_page"),
        "The content key of a prefix row, keyed on its pool location (shared prefix pages read the same bytes).");
  m.def("current_row_key", &model::current_row_key, py::arg("seed"), py::arg("layer"), py::arg("kind"), py::arg("request"), py::arg("token"),
        "The content key of a current row: request and sequence position.");
  m.def("row_content", [](std::uint64_t key, std::uint32_t row_bytes) { return to_numpy(row_bytes_of_key(key, row_bytes)); }, py::arg("key"), py::arg("row_bytes"),
        "The bytes of the row with this key (uint8 array of row_bytes): byte b is byte b % 8 of mix(key, b // 8).");
  m.def("prefix_page_rows", [](const model::Setting& s, std::uint64_t seed, std::int32_t layer, const py::object& kind, std::int64_t logical_page) {
    const std::uint32_t k = require_active_kind(s, kind, layer);
    if (logical_page < 0 || logical_page >= s.pool_pages) throw InputError("logical_page", fmt::format("{} is outside the pool [0, {})", logical_page, s.pool_pages));
    std::vector<std::uint8_t> rows;
    for (std::int32_t r = 0; r < s.page_size; ++r) {
      const auto row = row_bytes_of_key(model::prefix_row_key(seed, layer, k, logical_page, r), s.kinds[k].row_bytes);
      rows.insert(rows.end(), row.begin(), row.end());
    }
    return to_numpy(std::move(rows), {s.page_size, static_cast<py::ssize_t>(s.kinds[k].row_bytes)});
  }, py::arg("setting"), py::arg("seed"), py::arg("layer"), py::arg("kind"), py::arg("logical_page"),
        "The P rows of a pool page, as the harness pre-populates it at its storage owner: (P, row_bytes) uint8.");
  m.def("current_rows", [](const model::Setting& s, std::uint64_t seed, std::int32_t layer, const py::object& kind, std::int32_t request, std::int64_t token_first, std::int64_t token_count) {
    const std::uint32_t k = require_active_kind(s, kind, layer);
    if (request < 0 || token_first < 0 || token_count < 0) throw InputError("token_count", "request, token_first and token_count must be non-negative");
    // Bounded by the model's limits before anything is allocated: 2**40 tokens allocated until memory ran out (issue 22, item 11).
    if (request >= model::limits::batch_requests_max) {
      throw InputError("request", fmt::format("{} is not a request of a batch (at most {} requests)", request, model::limits::batch_requests_max));
    }
    if (token_count > model::limits::request_tokens_max || token_first > model::limits::request_tokens_max - token_count) {
      throw InputError("token_count", fmt::format("tokens [{}, {} + {}) reach past the {} tokens a request may have", token_first, token_first,
                                                  token_count, model::limits::request_tokens_max));
    }
    std::vector<std::uint8_t> rows;
    for (std::int64_t t = token_first; t < token_first + token_count; ++t) {
      const auto row = row_bytes_of_key(model::current_row_key(seed, layer, k, request, t), s.kinds[k].row_bytes);
      rows.insert(rows.end(), row.begin(), row.end());
    }
    return to_numpy(std::move(rows), {static_cast<py::ssize_t>(token_count), static_cast<py::ssize_t>(s.kinds[k].row_bytes)});
  }, py::arg("setting"), py::arg("seed"), py::arg("layer"), py::arg("kind"), py::arg("request"), py::arg("token_first"), py::arg("token_count"),
        "The rows a writer computes for tokens [token_first, token_first + token_count) of a request: (count, row_bytes) uint8.");
}

void bind_expected(py::module_& m) {
  m.def("expected_row", [](const model::Setting& s, const model::BatchLayout& l, std::uint64_t seed, std::int32_t layer, const py::object& kind, std::int64_t slot, std::int32_t row) {
    require_matching(s, l);
    const std::uint32_t k = require_active_kind(s, kind, layer);
    if (slot < 0 || slot >= l.slot_count) throw InputError("slot", fmt::format("{} is not a slot of the layout's {}", slot, l.slot_count));
    if (row < 0 || row >= l.page_size) throw InputError("row", fmt::format("{} is not a row of a page of {}", row, l.page_size));
    std::vector<std::uint8_t> out(s.kinds[k].row_bytes);
    model::expected_row(l, seed, layer, k, slot, row, out);
    return to_numpy(std::move(out));
  }, py::arg("setting"), py::arg("layout"), py::arg("seed"), py::arg("layer"), py::arg("kind"), py::arg("slot"), py::arg("row"),
        "The expected bytes of one dense row (zeros past the end of a partial page).");
  m.def("expected_dense", &expected_dense, py::arg("setting"), py::arg("layout"), py::arg("seed"), py::arg("layer"), py::arg("kind"),
        "The expected dense buffer of a layer and buffer kind (index or name), the same on every rank: a (slot_count * P, "
        "row_bytes) uint8 array that owns the model's buffer (no copy).");

  py::class_<model::Mismatch>(m, "Mismatch", "The first difference between an actual and the expected dense buffer, located, with the count of wrong bytes.")
      .def(py::init([](std::int64_t wrong_bytes, std::int64_t slot, std::int32_t row, std::uint32_t byte, std::uint8_t expected, std::uint8_t actual) {
             return model::Mismatch{wrong_bytes, slot, row, byte, expected, actual};
           }),
           py::arg("wrong_bytes"), py::arg("slot"), py::arg("row"), py::arg("byte"), py::arg("expected"), py::arg("actual"),
           "A difference found elsewhere (a GPU tensor compared on the device), so that its line is describe()'s, the one format.")
      .def_readonly("wrong_bytes", &model::Mismatch::wrong_bytes, "Wrong bytes over the whole buffer (nccl-tests' #wrong).")
      .def_readonly("slot", &model::Mismatch::slot, "Slot of the first wrong byte.")
      .def_readonly("row", &model::Mismatch::row, "Row (within the slot) of the first wrong byte.")
      .def_readonly("byte", &model::Mismatch::byte, "Byte (within the row) of the first wrong byte.")
      .def_readonly("expected", &model::Mismatch::expected, "The expected value of that byte.")
      .def_readonly("actual", &model::Mismatch::actual, "The actual value of that byte.")
      .def("describe", [](const model::Mismatch& mm, std::int32_t rank, std::int32_t layer, const std::string& kind_name, std::optional<std::int64_t> batch) {
        return batch ? mm.describe(rank, *batch, layer, kind_name) : mm.describe(rank, layer, kind_name);
      }, py::arg("rank"), py::arg("layer"), py::arg("kind_name"), py::arg("batch") = py::none(),
           "The one-line report the simulator and the GPU backend print: rank, (batch,) layer, kind, slot, row, byte, values, #wrong.")
      .def("__repr__", [](const model::Mismatch& mm) {
        return fmt::format("Mismatch(slot={}, row={}, byte={}, expected=0x{:02x}, actual=0x{:02x}, wrong_bytes={})", mm.slot, mm.row, mm.byte, mm.expected, mm.actual, mm.wrong_bytes);
      });
  m.def("compare_dense", &compare, py::arg("actual"), py::arg("expected"), py::arg("page_size"), py::arg("row_bytes"),
        "Compare two dense buffers of one-byte items (any shape, NumPy or anything with the array interface): the first "
        "difference as a Mismatch, or None if they are equal.");
  m.def("check_dense", [](const py::object& actual, const model::Setting& s, const model::BatchLayout& l, std::uint64_t seed, std::int32_t layer, const py::object& kind) {
    const py::array expected = expected_dense(s, l, seed, layer, kind);
    return compare(actual, expected, l.page_size, s.kinds[require_kind(s, kind)].row_bytes);
  }, py::arg("actual"), py::arg("setting"), py::arg("layout"), py::arg("seed"), py::arg("layer"), py::arg("kind"),
        "Compare an actual dense buffer with the model's expected one: a Mismatch or None.");
}

}  // namespace

void bind_content(py::module_& m) {
  bind_keys(m);
  bind_expected(m);
}

}  // namespace cpkv::python

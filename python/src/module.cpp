// The extension module cpkv._cpkv: the errors and argument checks every binding file shares, and the
// module itself. The package cpkv (cpkv/__init__.py) re-exports what is public.
#include <fmt/format.h>

#include "bindings.hpp"
#include "cpkv/traces/trace.hpp"

namespace cpkv::python {

namespace {

std::string input_error_line(const std::string& field, const std::string& reason, const std::string& where) {
  return where.empty() ? fmt::format("{}: {}", field, reason) : fmt::format("{}: {}: {}", where, field, reason);
}

// Raises the Python class `name` of cpkv._errors built from `args`. The classes live in Python so
// that they carry docstrings and can be raised by the pure-Python parts too.
void raise_python(const char* name, const py::tuple& args) {
  try {
    const py::object cls = py::module_::import("cpkv._errors").attr(name);
    const py::object exception = cls(*args);
    PyErr_SetObject(cls.ptr(), exception.ptr());
  } catch (py::error_already_set& error) {
    error.restore();
  }
}

}  // namespace

InputError::InputError(std::string field, std::string reason, std::string where)
    : std::invalid_argument(input_error_line(field, reason, where)),
      field_(std::move(field)),
      reason_(std::move(reason)),
      where_(std::move(where)) {}

void require_valid(const model::Setting& setting) {
  if (const auto problem = model::validate(setting)) throw InputError(problem->field, problem->reason);
}

void require_valid(const model::Setting& setting, const model::Batch& batch, const std::string& where) {
  if (const auto problem = traces::check_batch(setting, batch)) throw InputError(problem->field, problem->reason, where);  // the reader's own check
}

std::int32_t require_rank(std::int32_t rank, std::int32_t cp) {
  if (rank < 0 || rank >= cp) throw InputError("rank", fmt::format("{} is not a rank of the cp = {} group", rank, cp));
  return rank;
}

std::int32_t require_layer(const model::Setting& setting, std::int32_t layer) {
  if (layer < 0 || layer >= setting.layer_count()) {
    throw InputError("layer", fmt::format("{} is not a layer of the setting's {} layers", layer, setting.layer_count()));
  }
  return layer;
}

model::Variant require_variant(const std::string& name) {
  const auto variant = model::parse_variant(name);
  if (!variant) throw InputError("variant", fmt::format("unknown variant '{}'", name));
  return *variant;
}

std::uint32_t require_kind(const model::Setting& setting, const py::object& kind) {
  if (py::isinstance<py::str>(kind)) {
    const auto name = kind.cast<std::string>();
    for (std::size_t k = 0; k < setting.kinds.size(); ++k) {
      if (setting.kinds[k].name == name) return static_cast<std::uint32_t>(k);
    }
    throw InputError("kind", fmt::format("'{}' is not a buffer kind of the setting", name));
  }
  if (!PyLong_Check(kind.ptr()) || PyBool_Check(kind.ptr())) {
    throw py::type_error(fmt::format("kind: expected an int (an index) or a str (a name), not {}", Py_TYPE(kind.ptr())->tp_name));
  }
  const auto index = kind.cast<std::int64_t>();
  if (index < 0 || index >= static_cast<std::int64_t>(setting.kinds.size())) {
    throw InputError("kind", fmt::format("{} is not a buffer kind index of the setting's {} kinds", index, setting.kinds.size()));
  }
  return static_cast<std::uint32_t>(index);
}

void bind_errors(py::module_& m) {
  py::register_exception_translator([](std::exception_ptr thrown) {
    try {
      if (thrown) std::rethrow_exception(thrown);
    } catch (const traces::TraceError& e) {
      // The file name and the line as Python spells file names: a name that is not UTF-8 could not be raised at all.
      raise_python("TraceError", py::make_tuple(path_text(e.file()), e.line(), path_text(e.field()), path_text(e.reason()), path_text(e.what())));
    } catch (const InputError& e) {
      raise_python("InputError", py::make_tuple(path_text(e.field()), path_text(e.reason()), path_text(e.where())));
    }
  });
  m.attr("LIMITS") = py::dict(py::arg("cp_max") = model::limits::cp_max, py::arg("page_size_max") = model::limits::page_size_max,
                                  py::arg("layer_count_max") = model::limits::layer_count_max,
                                  py::arg("batch_requests_max") = model::limits::batch_requests_max,
                                  py::arg("request_tokens_max") = model::limits::request_tokens_max,
                                  py::arg("pool_pages_max") = model::limits::pool_pages_max);
}

}  // namespace cpkv::python

PYBIND11_MODULE(_cpkv, m) {
  m.doc() =
      "The C++ core of the cpkv package: the protocol model (setting, batch, layout, staging, variant plans, "
      "content, expected dense buffers), the trace format v1 reader and writer, and the rank simulator. "
      "Import the package `cpkv`, not this module.";
  cpkv::python::bind_errors(m);
  cpkv::python::bind_model(m);
  cpkv::python::bind_attention(m);
  cpkv::python::bind_content(m);
  cpkv::python::bind_files(m);
  cpkv::python::bind_traces(m);
  cpkv::python::bind_sim(m);
  cpkv::python::bind_conformance(m);
  cpkv::python::bind_request(m);
}

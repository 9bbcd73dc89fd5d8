// The Python bindings of cpkv: one file per area (model, content, traces, sim), each over public
// headers only (model/include, traces/include, sim/include). The bindings add no model logic: they
// check arguments (so that bad input is a one-line Python exception, never an assert), convert, and
// call the C++ model.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/numpy.h>
#include <nlohmann/json.hpp>
#include <pybind11/pybind11.h>

#include "cpkv/model/batch.hpp"
#include "cpkv/model/plan.hpp"
#include "cpkv/model/setting.hpp"

namespace cpkv::python {

namespace py = pybind11;

// A JSON value as the Python object json.loads gives (dicts, lists, numbers, strings).
inline py::object to_python(const nlohmann::json& value) { return py::module_::import("json").attr("loads")(value.dump()); }

// Bad input from Python: raised as cpkv.InputError(ValueError) with .field and .reason; str() is
// "field: reason", or "where: field: reason" when `where` names the batch or call.
class InputError : public std::invalid_argument {
 public:
  InputError(std::string field, std::string reason, std::string where = {});
  const std::string& field() const { return field_; }
  const std::string& reason() const { return reason_; }
  const std::string& where() const { return where_; }

 private:
  std::string field_;
  std::string reason_;
  std::string where_;
};

// Throws InputError when the setting or the batch is not valid: model::validate, and for a batch
// traces::check_batch, the trace reader's own check (a page twice in one request is refused).
void require_valid(const model::Setting& setting);
void require_valid(const model::Setting& setting, const model::Batch& batch, const std::string& where = {});

// A batch from per-request columns (as a scheduler holds them); InputError if their lengths differ.
model::Batch batch_from_lists(const std::vector<std::int64_t>& prefix_lens, const std::vector<std::int64_t>& extend_lens,
                              const std::vector<std::vector<std::int64_t>>& prefix_pages);

// Argument checks shared by the binding files; each throws InputError naming the parameter.
std::int32_t require_rank(std::int32_t rank, std::int32_t cp);
std::int32_t require_layer(const model::Setting& setting, std::int32_t layer);
model::Variant require_variant(const std::string& name);
// A buffer kind given by index into setting.kinds or by name; returns the index.
std::uint32_t require_kind(const model::Setting& setting, const py::object& kind);

// A std::vector handed to NumPy without a copy: the array owns the vector through a capsule.
template <typename T>
py::array_t<T> to_numpy(std::vector<T>&& values, std::vector<py::ssize_t> shape) {
  auto* owned = new std::vector<T>(std::move(values));
  py::capsule owner(owned, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>(std::move(shape), owned->data(), owner);
}
template <typename T>
py::array_t<T> to_numpy(std::vector<T>&& values) {
  const auto size = static_cast<py::ssize_t>(values.size());
  return to_numpy(std::move(values), {size});
}

// Runs `work` (C++ only: it must not touch Python) on a thread of its own while the calling thread
// checks Python's signals; Ctrl-C (or a Python handler's exception) stops the run through
// harness::request_stop, waits for it to unwind and raises; SIGTERM with its default action does the
// same and then ends the process by SIGTERM. Exceptions of `work` are rethrown here.
void run_interruptible(const std::function<void()>& work);

// A path argument given as str, bytes or os.PathLike, as the bytes the OS sees (os.fsencode:
// surrogateescape); TypeError naming `parameter` for anything else.
std::string path_argument(const py::handle& path, const char* parameter);
// A file name's bytes as Python spells them (os.fsdecode: bytes that are not UTF-8 as surrogates).
py::str path_text(const std::string& bytes);

// A trace that can be read more than once: a pipe is spooled (harness/spool.hpp) and the copy
// removed on destruction; a file is read in place. Waiting for a pipe's writer releases the GIL and
// answers Ctrl-C.
class SpooledInput {
 public:
  explicit SpooledInput(std::string path);
  ~SpooledInput();
  SpooledInput(const SpooledInput&) = delete;
  SpooledInput& operator=(const SpooledInput&) = delete;
  const std::string& read_path() const { return read_path_; }
  void remove();

 private:
  std::string path_;
  std::string read_path_;
  bool spooled_ = false;
};

void bind_errors(py::module_& m);
void bind_files(py::module_& m);
void bind_model(py::module_& m);
void bind_attention(py::module_& m);
void bind_content(py::module_& m);
void bind_traces(py::module_& m);
void bind_sim(py::module_& m);
void bind_conformance(py::module_& m);
void bind_request(py::module_& m);

}  // namespace cpkv::python

// Paths and files from Python: a path argument of any spelling Python has for one (str, bytes,
// os.PathLike; a str's undecodable bytes as surrogateescape gives them), file names handed back
// with the same bytes, and pipes spooled as the cpkv command spools them (harness/spool.hpp), so
// that plan('/dev/stdin') and replay('/dev/stdin') read what was piped (issue 22, items 10 and 24).
#include <sys/stat.h>

#include <fmt/format.h>

#include "bindings.hpp"
#include "cpkv/harness/spool.hpp"
#include "cpkv/traces/trace.hpp"

namespace cpkv::python {

std::string path_argument(const py::handle& path, const char* parameter) {
  if (!py::isinstance<py::str>(path) && !py::isinstance<py::bytes>(path) && !py::hasattr(path, "__fspath__")) {
    throw py::type_error(fmt::format("{}: expected str, bytes or os.PathLike, not {}", parameter, Py_TYPE(path.ptr())->tp_name));
  }
  const py::object encoded = py::module_::import("os").attr("fsencode")(path);  // surrogateescape, as the OS gave the name
  std::string bytes = encoded.cast<std::string>();
  if (bytes.find('\0') != std::string::npos) throw InputError(parameter, "holds a NUL byte, which no file name can");
  return bytes;
}

py::str path_text(const std::string& bytes) {
  PyObject* text = PyUnicode_DecodeFSDefaultAndSize(bytes.data(), static_cast<Py_ssize_t>(bytes.size()));
  if (text == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(text);
}

SpooledInput::SpooledInput(std::string path) : path_(std::move(path)), read_path_(path_) {
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0 || !(S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))) return;  // files and errors: the reader's
  try {
    py::gil_scoped_release release;  // a pipe may wait for its writer: other Python threads run meanwhile
    read_path_ = harness::spool_input("file", path_, [] {
      const py::gil_scoped_acquire acquire;
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();  // Ctrl-C while waiting: the partial copy is removed
    });
  } catch (const harness::SpoolRefused& e) {  // a pipe with no writer, silent, too large: the trace's fault, as the CLI says
    const std::string line = e.what();
    throw traces::TraceError(path_, 0, "file", line.substr(line.find(": ") + 2));
  }
  spooled_ = true;
}

SpooledInput::~SpooledInput() { remove(); }

void SpooledInput::remove() {
  if (spooled_) harness::remove_tracked_file(read_path_);
  spooled_ = false;
}

void bind_files(py::module_& m) {
  py::class_<SpooledInput>(m, "_SpooledInput",
                           "A trace path readable more than once: a pipe is copied to a private temporary file (removed on exit), "
                           "a file is read where it is. Used as a context manager; .path is what to open.")
      .def(py::init([](const py::object& path) { return std::make_unique<SpooledInput>(path_argument(path, "path")); }), py::arg("path"))
      .def_property_readonly("path", [](const SpooledInput& s) { return py::bytes(s.read_path()); }, "What to open (bytes).")
      .def("__enter__", [](SpooledInput& s) -> SpooledInput& { return s; })
      .def("__exit__", [](SpooledInput& s, const py::object&, const py::object&, const py::object&) { s.remove(); });
}

}  // namespace cpkv::python

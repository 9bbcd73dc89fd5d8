// Bindings of the trace format v1 (traces/include/cpkv/traces/trace.hpp): the streaming reader and
// the writer. Both are the C++ classes themselves, so a trace written from Python is byte for byte
// what the C++ writer writes, and a bad trace raises cpkv.TraceError with the reader's own line.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include <fmt/format.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "cpkv/harness/temp_files.hpp"
#include "cpkv/traces/text.hpp"
#include "cpkv/traces/trace.hpp"

namespace cpkv::python {
namespace {


// A JSON value from Python's json module, as the trace format holds it: UTF-8 text and finite
// numbers. NaN reached nlohmann's parser as "NaN" and a lone surrogate as "\ud800", and both came
// back as RuntimeError with nlohmann's text (issue 22, item 24); an object json cannot write at all
// stays json's TypeError.
nlohmann::json python_to_json(const py::object& value, const char* parameter) {
  std::string text;
  try {
    const py::object dumped = py::module_::import("json").attr("dumps")(value, py::arg("allow_nan") = false, py::arg("ensure_ascii") = false);
    text = dumped.attr("encode")("utf-8").cast<std::string>();
  } catch (py::error_already_set& e) {
    if (e.matches(PyExc_UnicodeEncodeError)) throw InputError(parameter, "holds a string that is not UTF-8 text (a lone surrogate)");
    if (e.matches(PyExc_ValueError)) throw InputError(parameter, fmt::format("is not JSON: {}", py::str(e.value()).cast<std::string>()));
    throw;
  }
  return nlohmann::json::parse(text);
}

[[noreturn]] void raise_os_error(const std::string& path) {
  const int error = errno;
  const py::str name = path_text(path);
  PyErr_SetObject(PyExc_OSError, py::make_tuple(error, std::strerror(error), name).ptr());
  throw py::error_already_set();
}

// A trace that cannot be written where the caller asked: cpkv.InputError("path", ...) naming the
// path, the step and errno's text (a bare FileNotFoundError or PermissionError named no step).
[[noreturn]] void throw_unwritable(const std::string& path, const std::string& step, const std::string& tail = "") {
  const int error = errno;
  throw InputError("path", fmt::format("cannot write {}: {}: {}{}", traces::escape_bytes(path), step, std::strerror(error), tail));
}

// The files open for reading through TraceReader, by device and inode: a TraceWriter aimed at one
// truncated the reader's input under it (issue 22, item 9). Every change holds the GIL.
std::multiset<std::pair<dev_t, ino_t>>& open_inputs() {
  static std::multiset<std::pair<dev_t, ino_t>> inputs;
  return inputs;
}

// The C++ reader, its file counted among the open inputs while it lives.
class PyTraceReader : public traces::TraceReader {
 public:
  explicit PyTraceReader(const std::string& path) : traces::TraceReader(path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) key_ = open_inputs().emplace(st.st_dev, st.st_ino);
  }
  ~PyTraceReader() {
    if (key_) open_inputs().erase(*key_);
  }
  PyTraceReader(const PyTraceReader&) = delete;
  PyTraceReader& operator=(const PyTraceReader&) = delete;

 private:
  std::optional<std::multiset<std::pair<dev_t, ino_t>>::iterator> key_;
};

// The header read back by the reader, so that every limit the reader applies (the nesting and size
// of `source`) applies to what is written: the writer wrote a source nested deeper than its own
// reader accepts (issue 22, item 9).
void require_readable(const traces::TraceHeader& header) {
  try {
    traces::TraceReader(std::make_unique<std::istringstream>(traces::header_to_json(header).dump() + "\n"), "header");
  } catch (const traces::TraceError& e) {
    throw InputError(e.field(), e.reason());
  }
}

// Where a new trace may be written: not a file an open TraceReader reads, not a folder or device.
void require_writable_target(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return;  // a new file: its folder is checked by creating the temporary
  if (!S_ISREG(st.st_mode)) throw InputError("path", fmt::format("{} is not a regular file", traces::escape_bytes(path)));
  if (open_inputs().count({st.st_dev, st.st_ino}) > 0) {
    throw InputError("path", fmt::format("{} is the trace an open TraceReader is reading; write to another file", traces::escape_bytes(path)));
  }
}

// A trace file being written: the C++ writer into a hidden temporary beside the target
// (".cpkv-<pid>-XXXXXX.jsonl", the cpkv command's own outputs' name, swept once its creator is dead),
// renamed over the target by close(). Until then the target is untouched: a capture killed or ended
// by an exception leaves the old file (or none), never a half trace that reads back as a whole one
// (issue 22, item 9). Every write is checked.
class TraceFileWriter {
 public:
  TraceFileWriter(std::string path, const model::Setting& setting, const py::object& source) : path_(std::move(path)) {
    require_valid(setting);  // before any file exists: a refused setting leaves no file behind
    traces::TraceHeader header{setting, source.is_none() ? nlohmann::json::object() : python_to_json(source, "source")};
    if (!header.source.is_object()) throw InputError("source", "must be a dict (a JSON object)");
    require_readable(header);
    require_writable_target(path_);
    setting_ = setting;
    open_temporary();
    writer_ = std::make_unique<traces::TraceWriter>(buffer_, header);
    drain();
  }
  ~TraceFileWriter() { abandon(); }
  TraceFileWriter(const TraceFileWriter&) = delete;
  TraceFileWriter& operator=(const TraceFileWriter&) = delete;

  void add_batch(const model::Batch& batch) {
    if (!writer_) throw InputError("writer", fmt::format("{} is closed", traces::escape_bytes(path_)));
    require_valid(setting_, batch, fmt::format("batch {}", batches_written_));
    writer_->write(batch);
    drain();
    ++batches_written_;
  }

  // The trace complete: the temporary renamed over the target.
  void close() {
    if (!writer_) return;
    writer_.reset();
    const int fd = std::exchange(fd_, -1);
    const bool closed = ::close(fd) == 0;
    if (!closed || ::rename(temporary_.c_str(), path_.c_str()) != 0) {
      const int error = errno;
      ::unlink(temporary_.c_str());
      errno = error;
      throw_unwritable(path_, closed ? "rename" : "close", "; the file was left as it was");  // its folder removed meanwhile, say
    }
  }

  // The capture abandoned: the temporary removed, the target as it was.
  void abandon() {
    writer_.reset();
    if (fd_ < 0) return;
    ::close(std::exchange(fd_, -1));
    ::unlink(temporary_.c_str());
  }

  const std::string& path() const { return path_; }
  std::int64_t batches_written() const { return batches_written_; }

 private:
  void open_temporary();
  void drain() {
    const int error = harness::write_all(fd_, buffer_.view());
    buffer_.str({});
    if (error != 0) {
      abandon();
      errno = error;
      raise_os_error(path_);
    }
  }

  std::string path_;
  std::string temporary_;
  int fd_ = -1;
  model::Setting setting_;
  std::ostringstream buffer_;  // what the writer wrote since the last drain
  std::unique_ptr<traces::TraceWriter> writer_;
  std::int64_t batches_written_ = 0;
};

void TraceFileWriter::open_temporary() {
  const std::filesystem::path target(path_);
  const std::string folder = target.has_parent_path() ? target.parent_path().string() : ".";
  harness::sweep_dead_temporaries(folder, ".cpkv");
  temporary_ = folder + "/" + harness::temp_stem(".cpkv") + "XXXXXX.jsonl";
  fd_ = ::mkostemps(temporary_.data(), 6, O_CLOEXEC);
  // A missing or read-only folder, /proc: the caller's path, one line (issue 34, item 21), as the CLI says it.
  if (fd_ < 0) throw_unwritable(path_, fmt::format("cannot create a file in {}", folder));
  struct stat st {};
  mode_t mode = 0;
  if (::stat(path_.c_str(), &st) == 0) {
    mode = st.st_mode & 07777;  // a replaced trace keeps its mode
  } else {
    mode = ::umask(0);
    ::umask(mode);
    mode = 0666 & ~mode;  // a new one gets what open(O_CREAT) would have given it
  }
  ::fchmod(fd_, mode);
}

void bind_reader(py::module_& m) {
  py::class_<traces::TraceHeader>(m, "TraceHeader", "A trace's header: the setting and where the trace came from.")
      .def_readonly("setting", &traces::TraceHeader::setting, "The trace's setting.")
      .def_property_readonly("source", [](const traces::TraceHeader& h) { return to_python(h.source); }, "The free-form source object, as a dict.")
      .def("to_json", [](const traces::TraceHeader& h) { return traces::header_to_json(h).dump(); }, "The header line the C++ writer writes.");

  py::class_<PyTraceReader>(m, "TraceReader",
                                  "A streaming, validating reader of a trace (format cpkv-batch-trace v1). Iterating yields one "
                                  "Batch at a time; a bad line raises cpkv.TraceError (file, line, field, reason).")
      .def(py::init([](const py::object& path) { return std::make_unique<PyTraceReader>(path_argument(path, "path")); }), py::arg("path"),
           "Open the trace (str, bytes or os.PathLike) and read and validate its header.")
      .def_property_readonly("header", &traces::TraceReader::header, py::return_value_policy::reference_internal, "The validated header: setting and source.")
      .def_property_readonly("setting", [](const PyTraceReader& r) { return r.header().setting; }, "The header's setting.")
      .def_property_readonly("batch_index", &traces::TraceReader::batch_index, "The last batch read (-1 before the first).")
      .def_property_readonly("line", &traces::TraceReader::line, "The last line read (1: the header).")
      .def("__iter__", [](PyTraceReader& r) -> PyTraceReader& { return r; })
      .def("__next__", [](PyTraceReader& r) {
        auto batch = r.next();
        if (!batch) throw py::stop_iteration();
        return std::move(*batch);
      });
  m.def("read_trace", [](const py::object& path) { return std::make_unique<PyTraceReader>(path_argument(path, "path")); }, py::arg("path"),
        "Open a trace for reading: returns a TraceReader (.header, .setting; iterate it for the batches). Raises "
        "cpkv.TraceError on a missing file or bad header, and on the first bad batch line while iterating.");
}

void bind_writer(py::module_& m) {
  py::class_<TraceFileWriter>(m, "TraceWriter",
                              "Writes a trace (format v1) with the C++ writer: the header at construction, one line per add_batch() "
                              "(batches numbered 0, 1, ...), each validated first as the reader validates it (cpkv.InputError names the "
                              "batch, field and reason). The lines go to a hidden temporary file beside path, which close() renames over "
                              "path: until then path is untouched, and a capture that is killed or leaves its with-block by an exception "
                              "leaves no half trace (the temporary is removed; one left by a killed process is swept later). Use as a "
                              "context manager or call close().")
      .def(py::init([](const py::object& path, const model::Setting& setting, const py::object& source) {
             return std::make_unique<TraceFileWriter>(path_argument(path, "path"), setting, source);
           }),
           py::arg("path"), py::arg("setting"), py::arg("source") = py::none(),
           "Start the trace (path: str, bytes or os.PathLike; not a file an open TraceReader reads). source: a dict of JSON "
           "values (finite numbers, UTF-8 text) saying where the trace came from, within the reader's limits.")
      .def("add_batch", &TraceFileWriter::add_batch, py::arg("batch"), "Write one scheduled batch (a Batch or a list of Request).")
      .def("add_batch", [](TraceFileWriter& w, const std::vector<std::int64_t>& prefix_lens, const std::vector<std::int64_t>& extend_lens,
                           const std::vector<std::vector<std::int64_t>>& prefix_pages) {
             w.add_batch(batch_from_lists(prefix_lens, extend_lens, prefix_pages));
           },
           py::arg("prefix_lens"), py::arg("extend_lens"), py::arg("prefix_pages"),
           "Write one scheduled batch from per-request columns: prefix lengths, extend lengths, prefix page ids.")
      .def("close", &TraceFileWriter::close, "Finish the trace: it replaces path whole (further add_batch calls raise).")
      .def("abandon", &TraceFileWriter::abandon, "Drop the trace: path is left as it was.")
      .def_property_readonly("path", [](const TraceFileWriter& w) { return path_text(w.path()); }, "The file being written.")
      .def_property_readonly("batches_written", &TraceFileWriter::batches_written, "Batches written so far (the next batch's number).")
      .def("__enter__", [](TraceFileWriter& w) -> TraceFileWriter& { return w; })
      .def("__exit__", [](TraceFileWriter& w, const py::object& type, const py::object&, const py::object&) {
        if (type.is_none()) {
          w.close();
        } else {
          w.abandon();  // an exception ended the capture: what it wrote is not a whole trace
        }
      });
}

}  // namespace

void bind_traces(py::module_& m) {
  bind_reader(m);
  bind_writer(m);
  m.attr("FORMAT_NAME") = std::string(traces::kFormatName);
  m.attr("FORMAT_VERSION") = traces::kFormatVersion;
}

}  // namespace cpkv::python

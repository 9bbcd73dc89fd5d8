// Bindings of the trace format v1 (traces/include/cpkv/traces/trace.hpp): the streaming reader and
// the writer. Both are the C++ classes themselves, so a trace written from Python is byte for byte
// what the C++ writer writes, and a bad trace raises cpkv.TraceError with the reader's own line.
#include <cerrno>
#include <fstream>
#include <memory>

#include <fmt/format.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "cpkv/traces/trace.hpp"

namespace cpkv::python {
namespace {


nlohmann::json python_to_json(const py::object& value) {
  const auto text = py::module_::import("json").attr("dumps")(value).cast<std::string>();
  return nlohmann::json::parse(text);
}

[[noreturn]] void raise_os_error(const std::string& path) {
  PyErr_SetFromErrnoWithFilename(PyExc_OSError, path.c_str());
  throw py::error_already_set();
}

// A trace file being written: the C++ writer over a file stream, flushed after every batch so that
// a capture that stops at any point leaves only whole, valid lines.
class TraceFileWriter {
 public:
  TraceFileWriter(std::string path, const model::Setting& setting, const py::object& source) : path_(std::move(path)) {
    require_valid(setting);  // before the file exists: a refused setting leaves no file behind
    traces::TraceHeader header{setting, source.is_none() ? nlohmann::json::object() : python_to_json(source)};
    if (!header.source.is_object()) throw InputError("source", "must be a dict (a JSON object)");
    setting_ = setting;
    out_.open(path_, std::ios::binary | std::ios::trunc);
    if (!out_.is_open()) raise_os_error(path_);
    writer_ = std::make_unique<traces::TraceWriter>(out_, header);
    flush();
  }

  void add_batch(const model::Batch& batch) {
    if (!writer_) throw InputError("writer", fmt::format("{} is closed", path_));
    require_valid(setting_, batch, fmt::format("batch {}", batches_written_));
    writer_->write(batch);
    flush();
    ++batches_written_;
  }

  void close() {
    writer_.reset();
    if (out_.is_open()) out_.close();
  }

  const std::string& path() const { return path_; }
  std::int64_t batches_written() const { return batches_written_; }

 private:
  void flush() {
    out_.flush();
    if (!out_) raise_os_error(path_);
  }

  std::string path_;
  model::Setting setting_;
  std::ofstream out_;
  std::unique_ptr<traces::TraceWriter> writer_;
  std::int64_t batches_written_ = 0;
};

void bind_reader(py::module_& m) {
  py::class_<traces::TraceHeader>(m, "TraceHeader", "A trace's header: the setting and where the trace came from.")
      .def_readonly("setting", &traces::TraceHeader::setting, "The trace's setting.")
      .def_property_readonly("source", [](const traces::TraceHeader& h) { return to_python(h.source); }, "The free-form source object, as a dict.")
      .def("to_json", [](const traces::TraceHeader& h) { return traces::header_to_json(h).dump(); }, "The header line the C++ writer writes.");

  py::class_<traces::TraceReader>(m, "TraceReader",
                                  "A streaming, validating reader of a trace (format cpkv-batch-trace v1). Iterating yields one "
                                  "Batch at a time; a bad line raises cpkv.TraceError (file, line, field, reason).")
      .def(py::init<const std::string&>(), py::arg("path"), "Open the trace and read and validate its header.")
      .def_property_readonly("header", &traces::TraceReader::header, py::return_value_policy::reference_internal, "The validated header: setting and source.")
      .def_property_readonly("setting", [](const traces::TraceReader& r) { return r.header().setting; }, "The header's setting.")
      .def_property_readonly("batch_index", &traces::TraceReader::batch_index, "The last batch read (-1 before the first).")
      .def_property_readonly("line", &traces::TraceReader::line, "The last line read (1: the header).")
      .def("__iter__", [](traces::TraceReader& r) -> traces::TraceReader& { return r; })
      .def("__next__", [](traces::TraceReader& r) {
        auto batch = r.next();
        if (!batch) throw py::stop_iteration();
        return std::move(*batch);
      });
  m.def("read_trace", [](const std::string& path) { return std::make_unique<traces::TraceReader>(path); }, py::arg("path"),
        "Open a trace for reading: returns a TraceReader (.header, .setting; iterate it for the batches). Raises "
        "cpkv.TraceError on a missing file or bad header, and on the first bad batch line while iterating.");
}

void bind_writer(py::module_& m) {
  py::class_<TraceFileWriter>(m, "TraceWriter",
                              "Writes a trace (format v1) with the C++ writer: the header at construction, one line per add_batch() "
                              "(batches numbered 0, 1, ...). Each batch is validated first (cpkv.InputError names the batch, field and "
                              "reason) and flushed after, so the file always reads back. Use as a context manager or call close().")
      .def(py::init<std::string, const model::Setting&, const py::object&>(), py::arg("path"), py::arg("setting"), py::arg("source") = py::none(),
           "Create (truncate) the file and write the header. source: a JSON-serialisable dict saying where the trace came from.")
      .def("add_batch", &TraceFileWriter::add_batch, py::arg("batch"), "Write one scheduled batch (a Batch or a list of Request).")
      .def("add_batch", [](TraceFileWriter& w, const std::vector<std::int64_t>& prefix_lens, const std::vector<std::int64_t>& extend_lens,
                           const std::vector<std::vector<std::int64_t>>& prefix_pages) {
             w.add_batch(batch_from_lists(prefix_lens, extend_lens, prefix_pages));
           },
           py::arg("prefix_lens"), py::arg("extend_lens"), py::arg("prefix_pages"),
           "Write one scheduled batch from per-request columns: prefix lengths, extend lengths, prefix page ids.")
      .def("close", &TraceFileWriter::close, "Close the file (further add_batch calls raise).")
      .def_property_readonly("path", &TraceFileWriter::path, "The file being written.")
      .def_property_readonly("batches_written", &TraceFileWriter::batches_written, "Batches written so far (the next batch's number).")
      .def("__enter__", [](TraceFileWriter& w) -> TraceFileWriter& { return w; })
      .def("__exit__", [](TraceFileWriter& w, const py::object&, const py::object&, const py::object&) { w.close(); });
}

}  // namespace

void bind_traces(py::module_& m) {
  bind_reader(m);
  bind_writer(m);
  m.attr("FORMAT_NAME") = std::string(traces::kFormatName);
  m.attr("FORMAT_VERSION") = traces::kFormatVersion;
}

}  // namespace cpkv::python

// The batch-trace format, version 1 (traces/README.md, traces/trace.schema.json): JSON Lines, a
// header object then one object per batch. The reader streams: it holds one batch at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <iosfwd>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cpkv/model/batch.hpp"
#include "cpkv/model/setting.hpp"

namespace cpkv::traces {

inline constexpr std::string_view kFormatName = "cpkv-batch-trace";
inline constexpr std::int64_t kFormatVersion = 1;

// Limits of the readers of untrusted lines (this reader and the Mooncake log reader), with reasons.
namespace limits {
// Nesting of objects and arrays in one line. A batch line needs 4 levels and the importer's
// `source` 3; a hand-written `source` has no business going deeper than this, and nlohmann's DOM
// copy and dump recurse per level (70,000 levels overflowed an 8 MiB stack).
inline constexpr std::size_t json_depth_max = 64;
// Error lines stay short (at most about 320 bytes beside the file name) whatever the input holds: a
// key or a value quoted from the input is cut to these many bytes, with its length appended ...
inline constexpr std::size_t quoted_key_bytes = 64;
inline constexpr std::size_t quoted_value_bytes = 40;
// ... and so are the FIELD and REASON of a TraceError as a whole (a path of 64 levels of keys; the
// longest of nlohmann's syntax messages, with its echo of the input already cut, is about 230).
inline constexpr std::size_t error_field_bytes = 100;
inline constexpr std::size_t error_reason_bytes = 220;
}  // namespace limits

struct TraceHeader {
  model::Setting setting;
  nlohmann::json source = nlohmann::json::object();  // where the trace came from (free-form)
};

// A trace that cannot be read: one line naming the file, the line number, the field and the reason.
class TraceError : public std::runtime_error {
 public:
  TraceError(std::string file, std::int64_t line, std::string field, std::string reason);
  const std::string& file() const { return file_; }
  std::int64_t line() const { return line_; }
  const std::string& field() const { return field_; }
  const std::string& reason() const { return reason_; }

 private:
  struct Clipped {};
  TraceError(std::string file, std::int64_t line, std::string field, std::string reason, Clipped);
  std::string file_;
  std::int64_t line_;
  std::string field_;
  std::string reason_;
};

namespace detail {
// The check for a request that names one prefix page twice (a corrupt trace, traces/README.md),
// the reader's and the writer's alike: a bitset over the pool's pages says in one pass whether a
// batch has one, and only then a sort names where. Its buffers are reused from batch to batch.
class RepeatedPages {
 public:
  void size_for(std::int64_t pool_pages);  // before the first batch
  std::optional<model::Problem> find(const model::Batch& batch);

 private:
  std::vector<std::int64_t> sorted_;  // the sort's scratch
  std::vector<std::uint64_t> bits_;   // one bit per pool page, all clear between batches; empty: the sort alone
};
}  // namespace detail

class TraceReader {
 public:
  // Opens the file and reads and validates the header; throws TraceError.
  explicit TraceReader(const std::string& path);
  // Reads from a stream; `name` is what errors call the file.
  TraceReader(std::unique_ptr<std::istream> in, std::string name);
  ~TraceReader();

  const TraceHeader& header() const { return header_; }
  // The next batch, fully validated against the header's setting, or nullopt at the end.
  // Throws TraceError. batch_index() is the value of the batch's "batch" field.
  std::optional<model::Batch> next();
  // The same into `batch`, reusing the capacity of its vectors (a replay loop allocates nothing per
  // batch); false at the end. After a TraceError `batch` holds nothing meaningful.
  bool next(model::Batch& batch);
  std::int64_t batch_index() const { return batch_index_; }
  std::int64_t line() const { return line_; }

 private:
  void read_header();
  std::unique_ptr<std::istream> in_;
  std::string name_;
  TraceHeader header_;
  std::int64_t line_ = 0;
  std::int64_t batch_index_ = -1;
  std::string text_;                        // the line being read, its capacity reused
  detail::RepeatedPages repeated_pages_;
};

namespace detail {
// For tests only: the reader's two readings of a batch line (trace.cpp explains them), so that
// tests can check they agree. Neither applies model::validate.
struct BatchLine {
  std::int64_t index = 0;  // the line's "batch"
  model::Batch batch;
};
// The fast reading: nullopt wherever the line is anything but plainly well formed.
std::optional<BatchLine> read_batch_line_fast(const std::string& text);
// The DOM reading, which names the field and reason of any problem of shape or batch number in a
// TraceError for `file` and `line`.
BatchLine read_batch_line_dom(const std::string& text, const std::string& file, std::int64_t line, std::int64_t expected_index);
}  // namespace detail

// Everything the reader checks of a batch once its line has the right shape: model::validate, then
// no request naming one prefix page twice. The one batch check of the front ends that take batches
// from memory (Python's validate(), replay_batches(), TraceWriter), so that none passes a batch the
// reader refuses (issue 22, item 10).
std::optional<model::Problem> check_batch(const model::Setting& setting, const model::Batch& batch);

nlohmann::json header_to_json(const TraceHeader& header);
nlohmann::json batch_to_json(const model::Batch& batch, std::int64_t batch_index);
// The same line as batch_to_json(batch, batch_index).dump(), byte for byte, written straight into
// `line` (cleared first, its capacity reused) with no DOM in between: an imported trace repeats each
// chunked request's whole prefix page table on every chunk, so batch lines are most of an import's
// output, and a DOM costs a node and an allocation per page id.
void append_batch_line(const model::Batch& batch, std::int64_t batch_index, std::string& line);

class TraceWriter {
 public:
  TraceWriter(std::ostream& out, const TraceHeader& header);
  void write(const model::Batch& batch);  // batches are numbered 0, 1, 2, ...
 private:
  std::ostream& out_;
  model::Setting setting_;  // batches are checked against it: what is written always reads back
  std::int64_t next_index_ = 0;
  std::string line_;  // the line being written, its capacity reused
  detail::RepeatedPages repeated_pages_;
};

}  // namespace cpkv::traces

// The batch source and its cursors: a trace read as one snapshot (source.hpp says why).
#include "cpkv/harness/source.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <istream>
#include <mutex>
#include <streambuf>

#include <fmt/format.h>

#include "cpkv/model/batch.hpp"

namespace cpkv::harness {

namespace {

// What a file was: a change of any of these since the first reading is a changed trace.
struct FileStamp {
  dev_t device = 0;
  ino_t inode = 0;
  off_t size = 0;
  std::int64_t mtime_ns = 0;
  bool operator==(const FileStamp&) const = default;
};

FileStamp stamp_of(const struct stat& st) {
  return {st.st_dev, st.st_ino, st.st_size, std::int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec};
}

// Reads a file by offset (pread), so that cursors in threads and in forked rank processes, which
// share the one open file and so its file position, never move each other's.
class PreadBuffer : public std::streambuf {
 public:
  explicit PreadBuffer(int fd) : fd_(fd), buffer_(kBufferBytes) {}

 protected:
  int_type underflow() override {
    if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
    ssize_t n = -1;
    do {
      n = ::pread(fd_, buffer_.data(), buffer_.size(), offset_);
    } while (n < 0 && errno == EINTR);
    if (n < 0) throw std::ios_base::failure(fmt::format("read error: {}", std::strerror(errno)));
    if (n == 0) return traits_type::eof();
    offset_ += n;
    setg(buffer_.data(), buffer_.data(), buffer_.data() + n);
    return traits_type::to_int_type(*gptr());
  }

 private:
  static constexpr std::size_t kBufferBytes = std::size_t{1} << 16;  // as an ifstream's order of size
  int fd_;
  off_t offset_ = 0;
  std::vector<char> buffer_;
};

class PreadStream : public std::istream {
 public:
  explicit PreadStream(int fd) : std::istream(nullptr), buffer_(fd) { rdbuf(&buffer_); }

 private:
  PreadBuffer buffer_;
};

}  // namespace

class TraceSnapshot {
 public:
  explicit TraceSnapshot(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0 && (errno == EMFILE || errno == ENFILE || errno == ENOMEM)) {  // this process's limit, not bad input
      throw std::runtime_error(fmt::format("cannot open the trace {}: {} (a limit of this process or system)", path_, std::strerror(errno)));
    }
    if (fd_ < 0) throw traces::TraceError(path_, 0, "file", fmt::format("cannot open: {}", std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      const int error = errno;
      ::close(fd_);
      throw traces::TraceError(path_, 0, "file", fmt::format("cannot stat: {}", std::strerror(error)));
    }
    first_ = stamp_of(st);
  }
  ~TraceSnapshot() { ::close(fd_); }
  TraceSnapshot(const TraceSnapshot&) = delete;
  TraceSnapshot& operator=(const TraceSnapshot&) = delete;

  std::unique_ptr<std::istream> stream() const { return std::make_unique<PreadStream>(fd_); }

  // The open file as it was first read (in place: a truncation, an edit, a copy over it).
  void check_content() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw TraceChanged(path_, fmt::format("cannot stat the open trace: {}", std::strerror(errno)));
    const FileStamp now = stamp_of(st);
    if (now == first_) return;
    throw TraceChanged(path_, fmt::format("changed while cpkv read it ({} bytes, now {}{}); rerun on a file that stays as it is", first_.size, now.size,
                                          now.size == first_.size ? ", modified" : ""));
  }
  // The name still leads to the file first read (not one renamed over it, as `import -o` does).
  void check_name() const {
    struct stat st {};
    const bool same = ::stat(path_.c_str(), &st) == 0 && st.st_dev == first_.device && st.st_ino == first_.inode;
    if (!same) throw TraceChanged(path_, "was replaced or removed while cpkv read it; rerun on a file that stays as it is");
  }

  void check() const {
    check_content();
    check_name();
  }

  // The shape the world was last carved for; set by measure() before any rank starts.
  std::optional<SourceShape> measured;

 private:
  std::string path_;
  int fd_ = -1;
  FileStamp first_;
};

namespace {

// A batch a cursor yields may not exceed what the world was carved for: a rank would write past
// its dense buffers or staging slots, or read a pool page with no memory behind it.
void check_within(const std::string& path, const SourceShape& shape, std::int64_t index, const model::Setting& setting, const model::Batch& batch) {
  const model::BatchLayout layout = model::layout_batch(setting, batch);
  const auto refuse = [&](const std::string& what) {
    return TraceChanged(path, fmt::format("batch {} {}: the file changed while cpkv read it", index, what));
  };
  if (layout.slot_count > shape.slot_count_max) {
    throw refuse(fmt::format("has {} slots, more than the {} of the first reading", layout.slot_count, shape.slot_count_max));
  }
  if (layout.current_pages_total > shape.current_pages_max) {
    throw refuse(fmt::format("has {} current pages, more than the {} of the first reading", layout.current_pages_total, shape.current_pages_max));
  }
  for (const model::Request& request : batch.requests) {
    for (const std::int64_t page : request.prefix_pages) {
      if (!std::binary_search(shape.pool_pages_touched.begin(), shape.pool_pages_touched.end(), page)) {
        throw refuse(fmt::format("reads pool page {}, which no batch read at the first reading", page));
      }
    }
  }
}

}  // namespace

BatchCursor::BatchCursor(const BatchSource& source, bool held_to_last_measure) : source_(source), held_(held_to_last_measure) {
  if (source.trace_path.empty()) return;
  if (!source.snapshot) {
    reader_ = std::make_unique<traces::TraceReader>(source.trace_path);  // a source built by hand
    return;
  }
  source.snapshot->check();
  reader_ = std::make_unique<traces::TraceReader>(source.snapshot->stream(), source.trace_path);
}
BatchCursor::~BatchCursor() = default;

// A line cut by a truncation reads as bad JSON: said as the change it is, when the file changed.
std::optional<model::Batch> BatchCursor::read_next() {
  try {
    return reader_->next();
  } catch (const TraceChanged&) {
    throw;
  } catch (const traces::TraceError&) {
    if (source_.snapshot) source_.snapshot->check();
    throw;
  }
}

std::optional<model::Batch> BatchCursor::next() {
  const TraceSnapshot* snapshot = source_.snapshot.get();
  const SourceShape* shape = held_ && snapshot != nullptr && snapshot->measured ? &*snapshot->measured : nullptr;
  while (true) {
    std::optional<model::Batch> batch;
    if (reader_) {
      batch = read_next();
      index_ = reader_->batch_index();
    } else if (static_cast<std::size_t>(index_ + 1) < source_.batches.size()) {
      ++index_;
      batch = source_.batches[index_];
    }
    if (!batch) {
      if (snapshot != nullptr) snapshot->check();
      if (shape != nullptr && yielded_ != shape->batches) {
        throw TraceChanged(source_.trace_path, fmt::format("ended after {} batches, {} at the first reading: the file changed while cpkv read it",
                                                           yielded_, shape->batches));
      }
      return std::nullopt;
    }
    if (source_.only_batch && *source_.only_batch != index_) continue;
    if (shape != nullptr) {
      if (yielded_ >= shape->batches) throw TraceChanged(source_.trace_path, fmt::format("has more than the {} batches of the first reading: the file changed while cpkv read it", shape->batches));
      check_within(source_.trace_path, *shape, index_, source_.setting, *batch);
    }
    // Every batch, not only at the ends: a file cut or replaced mid-run ends the run at once, not
    // after tens of seconds of work on a file that is gone (two system calls per batch per rank).
    if (snapshot != nullptr) snapshot->check();
    ++yielded_;
    return batch;
  }
}

BatchSource BatchSource::from_trace(const std::string& path, std::optional<std::int64_t> only_batch) {
  BatchSource source;
  source.trace_path = path;
  source.only_batch = only_batch;
  source.snapshot = std::make_shared<TraceSnapshot>(path);
  traces::TraceReader reader(source.snapshot->stream(), path);
  source.setting = reader.header().setting;
  return source;
}

BatchSource BatchSource::from_batches(model::Setting setting, std::vector<model::Batch> batches) {
  BatchSource source;
  source.setting = std::move(setting);
  source.batches = std::move(batches);
  return source;
}

void check_unchanged(const BatchSource& source) {
  if (!source.snapshot) return;
  source.snapshot->check_content();
  source.snapshot->check_name();
}

SourceShape measure(const BatchSource& source,
                    const std::function<void(std::int64_t batch_index, const model::BatchLayout& layout)>& on_batch) {
  check_unchanged(source);  // a later variant must not run on the file renamed over the name
  SourceShape shape;
  BatchCursor cursor(source, /*held_to_last_measure=*/false);
  while (auto batch = cursor.next()) {
    ++shape.batches;
    const model::BatchLayout layout = model::layout_batch(source.setting, *batch);
    shape.slot_count_max = std::max(shape.slot_count_max, layout.slot_count);
    shape.current_pages_max = std::max(shape.current_pages_max, layout.current_pages_total);
    if (on_batch) on_batch(cursor.index(), layout);
    for (const model::Request& request : batch->requests) {
      shape.pool_pages_touched.insert(shape.pool_pages_touched.end(), request.prefix_pages.begin(), request.prefix_pages.end());
    }
  }
  std::vector<std::int64_t>& pages = shape.pool_pages_touched;
  std::sort(pages.begin(), pages.end());
  pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
  if (source.snapshot) source.snapshot->measured = shape;
  return shape;
}

}  // namespace cpkv::harness

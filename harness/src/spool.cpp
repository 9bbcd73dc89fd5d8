#include "cpkv/harness/spool.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "cpkv/harness/interrupt.hpp"
#include "cpkv/harness/temp_files.hpp"

namespace cpkv::harness {
namespace {

// A spooled trace larger than this is refused: traces worth piping are far smaller (the largest
// bundled import is a few MB), and a runaway producer must not fill $TMPDIR.
constexpr std::int64_t kSpoolBytesMax = std::int64_t{4} << 30;
// A pipe that sends nothing for this long is reported instead of waited on forever.
constexpr int kSpoolIdleMsMax = 600'000;
// A named pipe no process has opened for writing yet is waited for this long: a producer started
// beside cpkv opens it within moments; a pipe no one will ever write must not hold a run for 600 s.
constexpr int kFifoWriterMsMax = 5'000;
constexpr int kFifoWriterPollMs = 10;
// How often a wait hands control to `between_waits` (Python checks Ctrl-C there).
constexpr int kBetweenWaitsMs = 100;
constexpr std::string_view kSpoolPrefix = "cpkv-spool";  // followed by "-<creator pid>-" (temp_files.hpp)

using Clock = std::chrono::steady_clock;

std::string errno_text(int error) { return std::strerror(error); }

// Waits up to kSpoolIdleMsMax for `fd` to become readable, in slices that run `between_waits`.
void wait_readable(int fd, const std::string& label, const std::string& path, const std::function<void()>& between_waits) {
  const Clock::time_point idle_end = Clock::now() + std::chrono::milliseconds(kSpoolIdleMsMax);
  while (true) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, kBetweenWaitsMs) > 0) return;
    if (between_waits) between_waits();
    if (Clock::now() > idle_end) throw SpoolRefused(fmt::format("{}: {} sent no data for {} s", label, path, kSpoolIdleMsMax / 1000));
  }
}

// Copies everything readable from the non-blocking `fd` into `out_fd`; each wait is bounded. A read
// of 0 means no writer holds the pipe: the end, once data came; before, a named pipe's writer may
// not have opened it yet, and is waited for kFifoWriterMsMax (it blocked for 600 s: issue 22, item
// 18), while a pipe handed to cpkv (/dev/stdin, <(...)) has had its writer all along: empty.
void copy_all(int fd, int out_fd, const std::string& label, const std::string& path, bool named_pipe, const std::function<void()>& between_waits) {
  std::int64_t total = 0;
  std::vector<char> buffer(1 << 16);
  const Clock::time_point writer_deadline = Clock::now() + std::chrono::milliseconds(kFifoWriterMsMax);
  Clock::time_point next_check = Clock::now() + std::chrono::milliseconds(kBetweenWaitsMs);
  for (;;) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {  // a writer, no data yet
      wait_readable(fd, label, path, between_waits);
      continue;
    }
    if (n < 0) throw SpoolRefused(fmt::format("{}: cannot read {}: {}", label, path, errno_text(errno)));
    if (n == 0 && total == 0 && named_pipe) {
      if (Clock::now() > writer_deadline) {
        throw SpoolRefused(fmt::format("{}: no process wrote to the named pipe {} within {} s", label, path, kFifoWriterMsMax / 1000));
      }
      if (between_waits && Clock::now() > next_check) {
        between_waits();
        next_check = Clock::now() + std::chrono::milliseconds(kBetweenWaitsMs);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(kFifoWriterPollMs));
      continue;
    }
    if (n == 0) return;
    total += n;
    if (total > kSpoolBytesMax) throw SpoolRefused(fmt::format("{}: {} is larger than {} GiB through a pipe; give a regular file", label, path, kSpoolBytesMax >> 30));
    const int error = write_all(out_fd, std::string_view(buffer.data(), static_cast<std::size_t>(n)));
    if (error != 0) throw std::runtime_error(fmt::format("{}: cannot copy {} to a temporary file: {}", label, path, errno_text(error)));  // the disk's fault
  }
}

// A pipe with a name in a folder (mkfifo), not one cpkv was handed open (/dev/stdin, /dev/fd/N).
bool is_named_pipe(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISFIFO(st.st_mode)) return false;
  for (const char* handed : {"/dev/stdin", "/dev/fd/", "/proc/self/fd/", "/proc/"}) {
    if (path.rfind(handed, 0) == 0) return false;
  }
  return true;
}

}  // namespace

void remove_tracked_file(const std::string& path) {
  ::unlink(path.c_str());
  untrack_file(path);
}

std::string spool_input(const std::string& label, const std::string& path, const std::function<void()>& between_waits) {
  const std::string folder = temp_folder();
  // The creator's pid in the name: a spool left by a process that was SIGKILLed (up to 4 GiB) is
  // swept by the next one, as stale regions are.
  sweep_dead_temporaries(folder, kSpoolPrefix);
  std::string name = fmt::format("{}/{}XXXXXX.jsonl", folder, temp_stem(kSpoolPrefix));
  const int out_fd = create_tracked_file(name, 6);
  if (out_fd < 0) throw std::runtime_error(fmt::format("{}: cannot create a spool file for {} in {}: {}", label, path, folder, errno_text(errno)));
  // Non-blocking open: a named pipe with no writer yet must not block the open (copy_all waits for
  // one, bounded).
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  try {
    if (fd < 0) throw SpoolRefused(fmt::format("{}: cannot read {}: {}", label, path, errno_text(errno)));
    copy_all(fd, out_fd, label, path, is_named_pipe(path), between_waits);
    if (::close(out_fd) != 0) throw std::runtime_error(fmt::format("{}: cannot write the spool file {}: {}", label, name, errno_text(errno)));
  } catch (...) {
    if (fd >= 0) ::close(fd);
    remove_tracked_file(name);
    throw;
  }
  ::close(fd);
  return name;
}

}  // namespace cpkv::harness

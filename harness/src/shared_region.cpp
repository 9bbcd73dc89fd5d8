#include "cpkv/harness/shared_region.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <stdexcept>

#include <fmt/format.h>

#include "cpkv/harness/interrupt.hpp"

namespace cpkv::harness {

namespace bip = boost::interprocess;

namespace {
constexpr std::string_view kPrefix = "cpkv.";

std::string fresh_name() {
  static std::atomic<std::uint64_t> serial{0};
  return fmt::format("{}{}.{}", kPrefix, ::getpid(), serial.fetch_add(1));
}

// The pid encoded in a region name, or -1 if the name is not one of ours.
int creator_pid(const std::string& name) {
  if (name.rfind(kPrefix, 0) != 0) return -1;
  const std::size_t dot = name.find('.', kPrefix.size());
  if (dot == std::string::npos) return -1;
  try {
    return std::stoi(name.substr(kPrefix.size(), dot - kPrefix.size()));
  } catch (const std::exception&) {
    return -1;
  }
}
}  // namespace

namespace {
// Reservations of concurrent cpkv runs take turns (issue 22, item 17): two replays whose
// posix_fallocate calls interleaved each got part of /dev/shm and both failed, though either alone
// fit. An advisory lock (flock) on one file in /dev/shm makes each reservation whole before the
// next begins. It is held only while reserving, and waited for at most kReserveLockMsMax; after
// that (or when the file cannot be opened: another user's, mode 0600) the reservation goes ahead
// unlocked, so a lock never stops a run.
constexpr const char* kReserveLockPath = "/dev/shm/cpkv-reserve.lock";
constexpr int kReserveLockMsMax = 10'000;  // a reservation of many GiB takes about a second

class ReserveLock {
 public:
  ReserveLock() : fd_(::open(kReserveLockPath, O_RDONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644)) {
    if (fd_ < 0) return;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kReserveLockMsMax);
    while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      if ((errno != EWOULDBLOCK && errno != EINTR) || std::chrono::steady_clock::now() > deadline) {
        release();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  ~ReserveLock() { release(); }
  ReserveLock(const ReserveLock&) = delete;
  ReserveLock& operator=(const ReserveLock&) = delete;

 private:
  void release() {
    if (fd_ >= 0) ::close(fd_);  // closing the one descriptor drops the lock
    fd_ = -1;
  }
  int fd_;
};

// "; other cpkv runs hold N (pids ...)" for the live regions of other processes, else empty: says
// why a /dev/shm that fit the run a moment ago does not now.
std::string held_by_others() {
  std::uint64_t bytes = 0;
  std::string pids;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", error)) {
    const int pid = creator_pid(entry.path().filename().string());
    if (pid <= 0 || pid == ::getpid() || (::kill(pid, 0) != 0 && errno != EPERM)) continue;
    struct stat st {};
    if (::stat(entry.path().c_str(), &st) != 0) continue;
    bytes += static_cast<std::uint64_t>(st.st_blocks) * 512;
    const std::string text = std::to_string(pid);
    if (pids.find(text) == std::string::npos) pids += (pids.empty() ? "" : ", ") + text;
  }
  return pids.empty() ? std::string() : fmt::format("; another cpkv run holds {} of it (pid {}): try again when it ends", size_text(bytes), pids);
}

// Reserves every page of the object now, so a full tmpfs is an error here and not a SIGBUS in
// whichever rank first touches a page past the limit.
void reserve_pages(bip::shared_memory_object& object, const std::string& name, std::size_t bytes,
                   const std::vector<SharedRegion::ByteRange>& ranges) {
  const int fd = object.get_mapping_handle().handle;
  std::uint64_t reserved = 0;
  for (const SharedRegion::ByteRange& range : ranges) reserved += range.bytes;
  const ReserveLock lock;
  for (const SharedRegion::ByteRange& range : ranges) {
    const int error = ::posix_fallocate(fd, static_cast<off_t>(range.offset), static_cast<off_t>(range.bytes));
    if (error == 0) continue;
    if (error == ENOSPC || error == EFBIG) {
      throw SharedMemoryFull(fmt::format("shared memory region {} needs {} ({} bytes of {}), /dev/shm has {} free{}", name, size_text(reserved),
                                         reserved, bytes, size_text(shm_free_bytes()), held_by_others()));
    }
    throw std::runtime_error(fmt::format("cannot reserve {} bytes for shared memory region {}: {}", range.bytes, name, std::strerror(error)));
  }
}
}  // namespace

std::uint64_t shm_free_bytes() {
  struct statvfs fs {};
  if (::statvfs("/dev/shm", &fs) != 0) return UINT64_MAX;
  return static_cast<std::uint64_t>(fs.f_bavail) * fs.f_frsize;
}

std::string size_text(std::uint64_t bytes) {
  constexpr double kMiB = 1024.0 * 1024.0;
  if (bytes < (std::uint64_t{1} << 20)) return fmt::format("{} KiB", (bytes + 1023) / 1024);
  if (bytes < (std::uint64_t{10} << 20)) return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / kMiB);
  return fmt::format("{} MiB", bytes >> 20);
}

SharedRegion SharedRegion::create(std::size_t bytes) { return create(bytes, {ByteRange{0, bytes}}); }

SharedRegion SharedRegion::create(std::size_t bytes, const std::vector<ByteRange>& reserve) {
  static std::once_flag swept;
  std::call_once(swept, [] { sweep_stale_regions(); });
  const std::string name = fresh_name();
  harness::track_region(name);  // before it exists: a signal from here on cannot leak it
  bip::shared_memory_object::remove(name.c_str());
  try {
    bip::shared_memory_object object(bip::create_only, name.c_str(), bip::read_write);
    object.truncate(static_cast<bip::offset_t>(bytes));  // tmpfs pages read as zero until written
    reserve_pages(object, name, bytes, reserve);
    bip::mapped_region region(object, bip::read_write);
    return SharedRegion(name, std::move(region), ::getpid());
  } catch (const bip::interprocess_exception& e) {
    bip::shared_memory_object::remove(name.c_str());  // never leave the name behind
    harness::untrack_region(name);
    throw std::runtime_error(fmt::format("cannot create shared memory region {} of {} bytes: {}", name, bytes, e.what()));
  } catch (...) {
    bip::shared_memory_object::remove(name.c_str());
    harness::untrack_region(name);
    throw;
  }
}

SharedRegion::SharedRegion(std::string name, bip::mapped_region region, int owner_pid)
    : name_(std::move(name)), region_(std::move(region)), owner_pid_(owner_pid) {}

SharedRegion::SharedRegion(SharedRegion&& other) noexcept
    : name_(std::move(other.name_)), region_(std::move(other.region_)), owner_pid_(other.owner_pid_) {
  other.owner_pid_ = -1;
  other.name_.clear();
}

SharedRegion::~SharedRegion() {
  if (owner_pid_ == ::getpid() && !name_.empty()) {
    bip::shared_memory_object::remove(name_.c_str());
    harness::untrack_region(name_);
  }
}

int sweep_stale_regions() {
  int removed = 0;
  const std::filesystem::path shm = "/dev/shm";
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(shm, error)) {
    const std::string name = entry.path().filename().string();
    const int pid = creator_pid(name);
    if (pid <= 0) continue;
    if (::kill(pid, 0) == 0 || errno == EPERM) continue;  // creator alive
    if (bip::shared_memory_object::remove(name.c_str())) ++removed;
  }
  return removed;
}

bool region_exists(const std::string& name) {
  return std::filesystem::exists(std::filesystem::path("/dev/shm") / name);
}

}  // namespace cpkv::harness

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
#include <cstdio>
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

// Whether the process runs: a zombie (killed, not yet reaped; in a container whose init never reaps,
// for good) has closed every descriptor and will never touch its region again, so it counts as gone.
// kill(pid, 0) alone said a zombie runs, and a killed run's region outlived every sweep (CI, stop 41:
// cpkv.<rank pid>.0 of a SIGKILLed conformance launch left in /dev/shm).
bool process_runs(int pid) {
  if (::kill(pid, 0) != 0 && errno != EPERM) return false;
  std::FILE* stat = std::fopen(fmt::format("/proc/{}/stat", pid).c_str(), "r");
  if (stat == nullptr) return true;  // no procfs: trust kill
  char text[512] = {};
  const std::size_t got = std::fread(text, 1, sizeof(text) - 1, stat);
  std::fclose(stat);
  const char* close = std::strrchr(text, ')');  // the command name may hold spaces and parentheses
  if (got == 0 || close == nullptr || close[1] != ' ') return true;
  return close[2] != 'Z' && close[2] != 'X';
}
}  // namespace

namespace {
// Reservations of concurrent cpkv runs take turns (issue 22, item 17): two replays whose
// posix_fallocate calls interleaved each got part of /dev/shm and both failed, though either alone
// fit. An advisory lock (flock) on one file in /dev/shm makes each reservation whole before the
// next begins. It is held only while reserving.
//
// The lock can never stop or slow a run silently (issue 34, item 2: a FIFO planted at the old
// shared name hung every run; another user holding a flock on the 0644 file made every replay wait
// 10 s a region). So the file is this user's own (`cpkv-reserve.<euid>.lock`, made 0600: no other
// user can open it, so no one else can hold it), opened O_NONBLOCK|O_NOFOLLOW (a FIFO or a link
// never blocks the open) and checked with fstat: a regular file owned by this user. When it is
// anything else, or cannot be opened, or is still held after kReserveLockMsMax, cpkv says so in one
// line on stderr (once a process) and reserves without the lock for the rest of the process: the
// run goes on, only the turn-taking with concurrent runs of this user is lost.
constexpr const char* kReserveLockFolder = "/dev/shm";
constexpr int kReserveLockMsMax = 10'000;  // a reservation of many GiB takes about a second

std::string reserve_lock_path() { return fmt::format("{}/cpkv-reserve.{}.lock", kReserveLockFolder, ::geteuid()); }

// Set once the lock was found unusable or held past its bound: later reservations go unlocked.
std::atomic<bool> g_reserve_unlocked{false};

void give_up_reserve_lock(const std::string& path, const std::string& why) {
  if (g_reserve_unlocked.exchange(true)) return;
  fmt::print(stderr, "cpkv: the reservation lock {} {}; reserving shared memory without it (concurrent runs may each find /dev/shm short)\n", path, why);
}

// The lock file's descriptor, or -1 (after the one line) when it is not this user's regular file.
int open_reserve_lock(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0600);
  if (fd < 0) {
    give_up_reserve_lock(path, fmt::format("cannot be opened ({})", std::strerror(errno)));
    return -1;
  }
  struct stat st {};
  std::string why;
  if (::fstat(fd, &st) != 0) why = fmt::format("cannot be examined ({})", std::strerror(errno));
  else if (!S_ISREG(st.st_mode)) why = "is not a regular file (someone made it)";
  else if (st.st_uid != ::geteuid()) why = fmt::format("belongs to uid {}, not to this user", st.st_uid);
  else if ((st.st_mode & 077) != 0 && ::fchmod(fd, 0600) != 0) why = fmt::format("is open to others and cannot be made 0600 ({})", std::strerror(errno));
  if (why.empty()) return fd;
  ::close(fd);
  give_up_reserve_lock(path, why);
  return -1;
}

class ReserveLock {
 public:
  ReserveLock() {
    if (g_reserve_unlocked.load()) return;
    const std::string path = reserve_lock_path();
    fd_ = open_reserve_lock(path);
    if (fd_ < 0) return;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kReserveLockMsMax);
    while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK && errno != EINTR) {
        give_up_reserve_lock(path, fmt::format("cannot be locked ({})", std::strerror(errno)));
        release();
        return;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        give_up_reserve_lock(path, fmt::format("was held by another run of this user for {} s", kReserveLockMsMax / 1000));
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
  int fd_ = -1;
};

// "; other cpkv runs hold N (pids ...)" for the live regions of other processes, else empty: says
// why a /dev/shm that fit the run a moment ago does not now.
std::string held_by_others() {
  std::uint64_t bytes = 0;
  std::string pids;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", error)) {
    const int pid = creator_pid(entry.path().filename().string());
    if (pid <= 0 || pid == ::getpid() || !process_runs(pid)) continue;
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

// A descriptor of the region's file (a duplicate of the creating one: no second lookup of the
// name) holding a shared flock for as long as the region lives (see sweep_stale_regions). The
// wait is bounded: only a sweep's probe, which holds the lock for one fstat, can hold it exclusively.
int hold_alive(int handle, const std::string& name) {
  const int fd = ::fcntl(handle, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(fmt::format("cannot hold shared memory region {}: {}", name, std::strerror(errno)));
  for (int tries = 0; ::flock(fd, LOCK_SH | LOCK_NB) != 0; ++tries) {
    if ((errno != EWOULDBLOCK && errno != EINTR) || tries >= 1000) {
      const int error = errno;
      ::close(fd);
      throw std::runtime_error(fmt::format("cannot lock shared memory region {}: {}", name, std::strerror(error)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return fd;
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
  int alive_fd = -1;
  try {
    bip::shared_memory_object object(bip::create_only, name.c_str(), bip::read_write);
    // The liveness lock before the first byte: a sweep leaves a region of size 0 alone, and from
    // its first byte on the region is held (see sweep_stale_regions).
    alive_fd = hold_alive(object.get_mapping_handle().handle, name);
    object.truncate(static_cast<bip::offset_t>(bytes));  // tmpfs pages read as zero until written
    reserve_pages(object, name, bytes, reserve);
    bip::mapped_region region(object, bip::read_write);
    return SharedRegion(name, std::move(region), ::getpid(), alive_fd);
  } catch (const bip::interprocess_exception& e) {
    if (alive_fd >= 0) ::close(alive_fd);
    bip::shared_memory_object::remove(name.c_str());  // never leave the name behind
    harness::untrack_region(name);
    throw std::runtime_error(fmt::format("cannot create shared memory region {} of {} bytes: {}", name, bytes, e.what()));
  } catch (...) {
    if (alive_fd >= 0) ::close(alive_fd);
    bip::shared_memory_object::remove(name.c_str());
    harness::untrack_region(name);
    throw;
  }
}

SharedRegion::SharedRegion(std::string name, bip::mapped_region region, int owner_pid, int alive_fd)
    : name_(std::move(name)), region_(std::move(region)), owner_pid_(owner_pid), alive_fd_(alive_fd) {}

SharedRegion::SharedRegion(SharedRegion&& other) noexcept
    : name_(std::move(other.name_)), region_(std::move(other.region_)), owner_pid_(other.owner_pid_), alive_fd_(other.alive_fd_) {
  other.owner_pid_ = -1;
  other.alive_fd_ = -1;
  other.name_.clear();
}

SharedRegion::~SharedRegion() {
  if (owner_pid_ == ::getpid() && !name_.empty()) {
    bip::shared_memory_object::remove(name_.c_str());
    harness::untrack_region(name_);
  }
  // A fork's copy closes only its own descriptor: the lock stays while any process holds one.
  if (alive_fd_ >= 0) ::close(alive_fd_);
}

namespace {
// True when the region's file is held by a live process: a shared flock that its creator takes
// before the region's first byte (SharedRegion::create) and that its ranks inherit. Unlike a pid,
// a lock is the same in every PID namespace that shares /dev/shm (issue 34, item 19: a run in
// another container looked dead by its pid and lost its region). A region of size 0 counts as
// held (its creator may be between making it and locking it); so does one that cannot be opened.
bool held_by_a_live_process(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return true;
  struct stat st {};
  bool held = ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0;
  if (!held) held = ::flock(fd, LOCK_EX | LOCK_NB) != 0;
  ::close(fd);  // drops the probe's own lock, if it got one
  return held;
}
}  // namespace

int sweep_stale_regions() {
  int removed = 0;
  const std::filesystem::path shm = "/dev/shm";
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(shm, error)) {
    const std::string name = entry.path().filename().string();
    const int pid = creator_pid(name);
    if (pid <= 0) continue;
    if (process_runs(pid)) continue;  // its creator runs here (also regions of older cpkv builds, which hold no lock)
    if (held_by_a_live_process(entry.path())) continue;   // its creator or a rank runs, perhaps in another PID namespace
    if (bip::shared_memory_object::remove(name.c_str())) ++removed;
  }
  return removed;
}

bool region_exists(const std::string& name) {
  return std::filesystem::exists(std::filesystem::path("/dev/shm") / name);
}

}  // namespace cpkv::harness

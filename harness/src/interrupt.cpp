#include "cpkv/harness/interrupt.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "cpkv/harness/launch.hpp"
#include "registry.hpp"

namespace cpkv::harness {

namespace {

using Clock = std::chrono::steady_clock;

// Limits of the cleanup, each with its reason.
constexpr std::int64_t kForwardGraceMs = 300;  // ranks that die of the forwarded signal on their own
constexpr std::int64_t kReapMsMax = 5000;      // SIGKILLed ranks; a GPU context's teardown can take seconds
// Every signal whose default action ends the process and that a user, a shell, a scheduler or a
// limit sends: each ended cpkv at once, leaving its region, spool and partial outputs (issue 22,
// item 5). SIGKILL and SIGSTOP cannot be caught; the faults (SIGSEGV, SIGBUS, SIGABRT) are bugs and
// keep their core dumps.
constexpr int kHandledSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGXCPU};
// Ignored, so that a write to a closed pipe (`cpkv replay ... | head -1`) or past the file-size
// limit fails with EPIPE or EFBIG and is reported as the write error it is.
constexpr int kIgnoredSignals[] = {SIGPIPE, SIGXFSZ};
constexpr int kSignalsMax = 65;  // above SIGRTMAX: an index per signal number
// Signals of kHandledSignals the process was started with ignored (nohup, `trap '' INT`): kept
// ignored here and in the ranks, as a shell's user asked (issue 22, item 6).
bool g_inherited_ignore[kSignalsMax] = {};

std::atomic<int> g_signal{0};
std::atomic<int> g_stop{0};
std::atomic<int> g_pipe_write{-1};
static_assert(std::atomic<int>::is_always_lock_free, "the handler stores into it");

struct Registry {
  std::mutex mutex;
  std::vector<std::string> regions;
  std::vector<std::string> files;
  std::vector<int> ranks;
  std::vector<int> groups;  // process groups of helper programs (the chart's python3), killed whole
  std::string activity = "cpkv";
};

Registry& registry() {
  static Registry* instance = new Registry();  // never destroyed: the watcher may use it during exit
  return *instance;
}

extern "C" void on_signal(int signal_number) {
  const int saved_errno = errno;
  int expected = 0;
  g_signal.compare_exchange_strong(expected, signal_number);
  const int fd = g_pipe_write.load();
  if (fd >= 0) {
    const char byte = static_cast<char>(signal_number);
    (void)!::write(fd, &byte, 1);
  }
  errno = saved_errno;
}

bool reaped_within(int pid, Clock::time_point deadline) {
  while (true) {
    const pid_t done = ::waitpid(pid, nullptr, WNOHANG);
    if (done == pid || (done < 0 && errno == ECHILD)) return true;
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Ends every tracked rank: the signal first (a rank may clean up), SIGKILL after the grace; then
// `after_kill` (no rank runs another instruction of its own once SIGKILL is sent), then the reaping.
template <typename AfterKill>
std::int32_t end_ranks(const std::vector<int>& ranks, int signal_number, const AfterKill& after_kill) {
  for (int pid : ranks) ::kill(pid, signal_number);
  const Clock::time_point grace_end = Clock::now() + std::chrono::milliseconds(kForwardGraceMs);
  std::vector<int> left;
  for (int pid : ranks) {
    if (!reaped_within(pid, grace_end)) left.push_back(pid);
  }
  for (int pid : left) ::kill(pid, SIGKILL);
  after_kill();
  const Clock::time_point reap_end = Clock::now() + std::chrono::milliseconds(kReapMsMax);
  std::int32_t unreaped = 0;
  for (int pid : left) unreaped += reaped_within(pid, reap_end) ? 0 : 1;
  return unreaped;
}

[[noreturn]] void clean_up_and_exit(int signal_number) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);  // held until _exit: nothing new is created or forked
  std::string removed;
  std::int32_t removed_count = 0;
  for (const std::string& name : r.regions) {  // names first: the 1 s promise must not wait for ranks
    if (::shm_unlink(name.c_str()) == 0) {
      removed += (removed.empty() ? "" : ", ") + name;
      ++removed_count;
    }
  }
  const auto ranks = static_cast<std::int32_t>(r.ranks.size());
  // Files once no rank runs (within the grace, well inside the 1 s promise): a rank still starting
  // opens the spool file by name, and one removed under it made the rank print "cannot open"
  // beside the one line (seen once in about 30 loaded runs).
  // A helper's whole group goes at once (a python3 left running recreated its output after cpkv had
  // exited, orphaned: issue 22, item 14); its files after it, as the ranks' after them.
  for (int group : r.groups) ::kill(-group, SIGKILL);
  std::int32_t files_removed = 0;
  const std::int32_t unreaped = end_ranks(r.ranks, signal_number, [&] {
    for (const std::string& path : r.files) files_removed += ::unlink(path.c_str()) == 0 ? 1 : 0;
  });
  std::string line = fmt::format("cpkv: interrupted by {} during {}", detail::signal_name(signal_number), r.activity);
  if (ranks > 0) line += fmt::format("; ended {} rank process{}", ranks, ranks == 1 ? "" : "es");
  if (unreaped > 0) line += fmt::format(" ({} could not be reaped within {} ms)", unreaped, kReapMsMax);
  if (removed_count > 0) line += fmt::format("; removed shared memory {}", removed);
  if (files_removed > 0) line += fmt::format("; removed {} temporary file{}", files_removed, files_removed == 1 ? "" : "s");
  line += "\n";
  (void)!::write(STDERR_FILENO, line.data(), line.size());
  ::_exit(128 + signal_number);
}

void watch(int read_fd) {
  char byte = 0;
  while (true) {
    const ssize_t got = ::read(read_fd, &byte, 1);
    if (got == 1) break;
    if (got < 0 && errno == EINTR) continue;
    return;  // the pipe is gone: nothing will ever arrive
  }
  clean_up_and_exit(g_signal.load() != 0 ? g_signal.load() : static_cast<unsigned char>(byte));
}

}  // namespace

namespace detail {

pid_t reap_tracked(pid_t pid, int* raw, int flags) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  const pid_t done = ::waitpid(pid, raw, flags);
  if (done == pid && (WIFEXITED(*raw) || WIFSIGNALED(*raw))) std::erase(r.ranks, static_cast<int>(pid));
  return done;
}

const char* signal_name(int signal_number) {
  switch (signal_number) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    case SIGQUIT: return "SIGQUIT";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    case SIGALRM: return "SIGALRM";
    case SIGXCPU: return "SIGXCPU";
    case SIGPIPE: return "SIGPIPE";
    case SIGXFSZ: return "SIGXFSZ";
    case SIGKILL: return "SIGKILL";
    case SIGSTOP: return "SIGSTOP";
    case SIGTSTP: return "SIGTSTP";
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGABRT: return "SIGABRT";
    default: return "a signal";
  }
}

}  // namespace detail

void open_missing_standard_streams() {
  // A closed fd 0 was taken by the signal pipe, and `cpkv plan /dev/stdin <&-` read its own signal
  // pipe for up to 600 s (issue 22, item 3). /dev/null read-only on each closed one: standard input
  // reads as empty, and a write to a closed standard output or error fails (EBADF) and is reported,
  // never silently lost.
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    const int opened = ::open("/dev/null", O_RDONLY);
    if (opened < 0) throw std::runtime_error(fmt::format("file descriptor {} is closed and /dev/null cannot be opened: {}", fd, std::strerror(errno)));
    if (opened != fd) {  // a lower one was free: cannot happen in this order, but a stray fd must not stay
      ::close(opened);
      throw std::runtime_error(fmt::format("file descriptor {} is closed and could not be reopened", fd));
    }
  }
}

void install_interrupt_handling() {
  static std::once_flag once;
  std::call_once(once, [] {
    open_missing_standard_streams();
    int fds[2] = {-1, -1};
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error(fmt::format("cannot create the signal pipe: {}", std::strerror(errno)));
    try {
      std::thread(watch, fds[0]).detach();
    } catch (const std::system_error& e) {  // "Resource temporarily unavailable" alone named nothing
      ::close(fds[0]);
      ::close(fds[1]);
      throw std::runtime_error(fmt::format("cannot start the signal watcher thread: {} (a limit on threads or address space)", e.code().message()));
    }
    g_pipe_write.store(fds[1]);
    struct sigaction action {};
    action.sa_handler = on_signal;
    action.sa_flags = SA_RESTART;
    sigemptyset(&action.sa_mask);
    for (int s : kHandledSignals) {
      struct sigaction old {};
      ::sigaction(s, nullptr, &old);
      g_inherited_ignore[s] = old.sa_handler == SIG_IGN;
      if (!g_inherited_ignore[s]) ::sigaction(s, &action, nullptr);
    }
    for (int s : kIgnoredSignals) std::signal(s, SIG_IGN);
  });
}

void set_activity(const std::string& what) {
  const std::lock_guard<std::mutex> lock(registry().mutex);
  registry().activity = what;
}

int interrupted() { return g_signal.load(); }

void request_stop(int signal_number) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);  // no rank forked between the flag and the kills
  g_stop.store(signal_number);
  for (int pid : r.ranks) ::kill(pid, SIGKILL);  // reaped by the launcher, which now ends its watch
  for (int group : r.groups) ::kill(-group, SIGKILL);
}

void clear_stop() { g_stop.store(0); }

int stop_requested() { return g_stop.load(std::memory_order_relaxed); }

void track_region(const std::string& name) {
  const std::lock_guard<std::mutex> lock(registry().mutex);
  registry().regions.push_back(name);
}

void untrack_region(const std::string& name) {
  const std::lock_guard<std::mutex> lock(registry().mutex);
  std::erase(registry().regions, name);
}

pid_t fork_tracked_rank() {
  // The registry's lock across the fork, as pthread_atfork's handlers take it: the watcher cannot
  // clean up between the fork and the tracking (a rank forked then would outlive the interruption
  // until its death signal), and the child's guard releases its copy, which its one thread now
  // holds. The room is made before the fork, so nothing after it can throw.
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  r.ranks.reserve(r.ranks.size() + 1);
  const pid_t pid = ::fork();
  if (pid > 0) r.ranks.push_back(pid);
  return pid;
}

pid_t spawn_tracked_group(const std::function<pid_t()>& spawn) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);  // as fork_tracked_rank: no signal between the spawn and the tracking
  r.groups.reserve(r.groups.size() + 1);
  const pid_t pid = spawn();
  if (pid > 0) r.groups.push_back(pid);
  return pid;
}

void untrack_group(pid_t pid) {
  const std::lock_guard<std::mutex> lock(registry().mutex);
  std::erase(registry().groups, static_cast<int>(pid));
}

int create_tracked_file(std::string& name_template, int suffix_chars) {
  const std::lock_guard<std::mutex> lock(registry().mutex);
  const int fd = ::mkstemps(name_template.data(), suffix_chars);
  if (fd >= 0) registry().files.push_back(name_template);
  return fd;
}

int create_tracked_named_file(const std::string& path) {
  const std::lock_guard<std::mutex> lock(registry().mutex);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd >= 0) registry().files.push_back(path);
  return fd;
}

void untrack_file(const std::string& path) {
  const std::lock_guard<std::mutex> lock(registry().mutex);
  std::erase(registry().files, path);
}

void restore_signals() {
  g_pipe_write.store(-1);  // a signal from now on is the new program's, never the watcher's
  struct sigaction action {};
  sigemptyset(&action.sa_mask);
  for (int s : kHandledSignals) {
    action.sa_handler = g_inherited_ignore[s] ? SIG_IGN : SIG_DFL;
    ::sigaction(s, &action, nullptr);
  }
  sigset_t all;
  sigemptyset(&all);
  for (int s : kHandledSignals) sigaddset(&all, s);
  ::sigprocmask(SIG_UNBLOCK, &all, nullptr);
}

bool prepare_child(pid_t parent) {
  restore_signals();
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) return false;
  return ::getppid() == parent;  // the parent died before prctl: the death signal will never come
}

}  // namespace cpkv::harness

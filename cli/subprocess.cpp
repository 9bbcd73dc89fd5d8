#include "subprocess.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "cpkv/harness/interrupt.hpp"
#include "cpkv/harness/temp_files.hpp"

extern char** environ;

namespace cpkv::cli {
namespace {

// How often a waiting parent looks at the child: short against any useful limit, long enough to
// cost nothing.
constexpr std::chrono::milliseconds kPollInterval{20};
// A helper's stderr line quoted in a message is cut here (the message is one line).
constexpr std::size_t kStderrTailCharsMax = 200;

std::string last_line(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line)) {
    if (!line.empty()) last = line;
  }
  if (last.size() > kStderrTailCharsMax) last = last.substr(0, kStderrTailCharsMax) + "...";
  return last;
}

}  // namespace

std::string ChildOutcome::describe() const {
  std::string text;
  if (!ran) {
    text = "could not be started";
  } else if (timed_out) {
    text = "did not finish in time and was killed";
  } else if (signal != 0) {
    text = fmt::format("ended by signal {}", signal);
  } else {
    text = fmt::format("exit status {}", exit_status);
  }
  if (!stderr_tail.empty()) text += ": " + stderr_tail;
  return text;
}

namespace {

// Waits at most until `deadline` for the group leader `pid` to end (left unreaped, so its pid, the
// group's id, cannot be reused), then kills the whole group: a helper's own children go with it.
// Returns the leader's wait status; sets timed_out when the deadline came first.
int end_group(pid_t pid, std::chrono::steady_clock::time_point deadline, bool& timed_out) {
  for (;;) {
    siginfo_t info{};
    const int waited = ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT);
    if (waited == 0 && info.si_pid == pid) break;
    if (waited < 0 && errno != EINTR) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      timed_out = true;
      break;
    }
    std::this_thread::sleep_for(kPollInterval);
  }
  ::kill(-pid, SIGKILL);
  harness::untrack_group(pid);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

}  // namespace

ChildOutcome run_child(const std::vector<std::string>& argv, std::chrono::milliseconds limit) {
  ChildOutcome outcome;
  std::string err_path = fmt::format("{}/{}XXXXXX", harness::temp_folder(), harness::temp_stem("cpkv-child"));
  const int err_fd = harness::create_tracked_file(err_path, 0);  // removed by the watcher on interruption
  if (err_fd < 0) return outcome;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, err_fd, STDERR_FILENO);
  // A group of its own: the limit and an interruption end the helper and everything it started.
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attributes, 0);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int spawned = 0;
  const pid_t pid = harness::spawn_tracked_group([&] {
    pid_t child = -1;
    spawned = ::posix_spawnp(&child, args[0], &actions, &attributes, args.data(), environ);
    return spawned == 0 ? child : -1;
  });
  posix_spawnattr_destroy(&attributes);
  posix_spawn_file_actions_destroy(&actions);
  ::close(err_fd);
  if (spawned != 0) {
    outcome.stderr_tail = std::strerror(spawned);
    ::unlink(err_path.c_str());
    harness::untrack_file(err_path);
    return outcome;
  }
  outcome.ran = true;
  const int status = end_group(pid, std::chrono::steady_clock::now() + limit, outcome.timed_out);
  if (!outcome.timed_out) {
    if (WIFEXITED(status)) outcome.exit_status = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) outcome.signal = WTERMSIG(status);
  }
  outcome.stderr_tail = last_line(err_path);
  ::unlink(err_path.c_str());
  harness::untrack_file(err_path);
  return outcome;
}

}  // namespace cpkv::cli

namespace cpkv::cli {

#ifndef CPKV_CHART_PYTHON
#define CPKV_CHART_PYTHON "python3"
#endif
#ifndef CPKV_PYTHON_PACKAGE_DIR
#define CPKV_PYTHON_PACKAGE_DIR ""
#endif

PythonInterpreter python_interpreter() {
  const char* chosen = std::getenv("CPKV_PYTHON");
  if (chosen != nullptr && *chosen != '\0') return {chosen, "from CPKV_PYTHON"};
  return {CPKV_CHART_PYTHON, "configured at build time; CPKV_PYTHON overrides it"};
}

void prepend_python_package_path() {
  const std::string package = CPKV_PYTHON_PACKAGE_DIR;
  std::error_code error;
  if (package.empty() || !std::filesystem::exists(package + "/cpkv/__init__.py", error)) return;
  const char* path = std::getenv("PYTHONPATH");
  const std::string value = path == nullptr || *path == '\0' ? package : package + ":" + path;
  ::setenv("PYTHONPATH", value.c_str(), 1);
}

void exec_program(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  harness::restore_signals();
  ::execvp(args[0], args.data());
  // The exec failed (errno set): the caller reports it in one line and exits at once; a signal until
  // then has its default effect, which ends this process as the program's would have.
}

PythonRefusal exec_python(std::vector<std::string> arguments, const std::string& probe, std::chrono::milliseconds probe_limit) {
  const PythonInterpreter python = python_interpreter();
  prepend_python_package_path();
  const ChildOutcome outcome = run_child({python.program, "-c", probe}, probe_limit);
  if (!outcome.ok()) return {python.program, python.origin, outcome.ran ? outcome.describe() : "cannot be started: " + outcome.stderr_tail};
  arguments.insert(arguments.begin(), python.program);
  exec_program(arguments);
  return {python.program, python.origin, fmt::format("cannot be run: {}", std::strerror(errno))};
}

}  // namespace cpkv::cli

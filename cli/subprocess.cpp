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

ChildOutcome run_child(const std::vector<std::string>& argv, std::chrono::milliseconds limit) {
  ChildOutcome outcome;
  std::string err_path = fmt::format("{}/{}XXXXXX", harness::temp_folder(), harness::temp_stem("cpkv-child"));
  const int err_fd = ::mkstemp(err_path.data());
  if (err_fd < 0) return outcome;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, err_fd, STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = ::posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(err_fd);
  if (spawned != 0) {
    outcome.stderr_tail = std::strerror(spawned);
    ::unlink(err_path.c_str());
    return outcome;
  }
  outcome.ran = true;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  for (;;) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      outcome.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(kPollInterval);
  }
  if (!outcome.timed_out) {
    if (WIFEXITED(status)) outcome.exit_status = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) outcome.signal = WTERMSIG(status);
  }
  outcome.stderr_tail = last_line(err_path);
  ::unlink(err_path.c_str());
  return outcome;
}

}  // namespace cpkv::cli

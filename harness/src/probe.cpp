#include "cpkv/harness/probe.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "cpkv/harness/launch.hpp"
#include "registry.hpp"

namespace cpkv::harness {

namespace {

// Reads exactly `bytes` or fails, waiting at most until `deadline` for each part.
bool read_answer(int fd, char* out, std::size_t bytes, std::chrono::steady_clock::time_point deadline, bool& timed_out) {
  std::size_t got = 0;
  while (got < bytes) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    pollfd pfd{fd, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, static_cast<int>(std::max<long long>(left, 0)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) timed_out = true;
    if (ready <= 0) return false;
    const ssize_t n = ::read(fd, out + got, bytes - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    got += static_cast<std::size_t>(n);
  }
  return true;
}

}  // namespace

ProbeOutcome run_probe(const std::function<void(void* answer)>& body, void* answer, std::size_t answer_bytes, std::chrono::milliseconds limit) {
  ProbeOutcome outcome;
  int fds[2];
  if (::pipe(fds) != 0) {
    outcome.failure = fmt::format("pipe failed: {}", std::strerror(errno));
    return outcome;
  }
  std::fflush(nullptr);  // the child must not flush the parent's buffered output a second time
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    outcome.failure = fmt::format("fork failed: {}", std::strerror(errno));
    ::close(fds[0]);
    ::close(fds[1]);
    return outcome;
  }
  if (pid == 0) {
    ::close(fds[0]);
    if (!prepare_child(parent)) ::_exit(1);  // dies with the caller, even one killed before prctl
    std::vector<char> out(answer_bytes);
    body(out.data());
    std::size_t written = 0;
    while (written < answer_bytes) {
      const ssize_t n = ::write(fds[1], out.data() + written, answer_bytes - written);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) ::_exit(1);
      written += static_cast<std::size_t>(n);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  bool timed_out = false;
  outcome.answered = read_answer(fds[0], static_cast<char*>(answer), answer_bytes, std::chrono::steady_clock::now() + limit, timed_out);
  ::close(fds[0]);
  if (!outcome.answered) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!outcome.answered) {
    outcome.timed_out = timed_out;
    // A child that closed the pipe ended on its own (or is ending): how, once reaped. The SIGKILL
    // above only lands on one still running (or hung), which the limit names.
    if (!timed_out && WIFEXITED(status)) outcome.ended = fmt::format("exited with status {}", WEXITSTATUS(status));
    if (!timed_out && WIFSIGNALED(status) && WTERMSIG(status) != SIGKILL) outcome.ended = fmt::format("died from {}", detail::signal_name(WTERMSIG(status)));
    outcome.failure = timed_out ? fmt::format("the probe (pid {}) gave no answer in {} ms", pid, limit.count())
                                : fmt::format("the probe (pid {}) died before answering{}", pid, outcome.ended.empty() ? "" : " (" + outcome.ended + ")");
  }
  return outcome;
}

}  // namespace cpkv::harness

// A probe in a child process: the one other fork of cpkv beside launch_ranks (launch.hpp), for work
// the caller must not do itself (a CUDA context does not survive fork, and a hung driver must not
// hang the caller). The child dies with the caller, writes a plain-data answer of a fixed size
// through a pipe, and is killed and reaped if it gives none within the limit.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <type_traits>

namespace cpkv::harness {

struct ProbeOutcome {
  bool answered = false;
  bool timed_out = false;  // no answer within the limit (the child was then killed)
  std::string failure;  // why not: "fork failed: ...", "gave no answer in N ms", "died before answering"
  // How a child that did not answer ended, before it was killed ("exited with status 0", "died from
  // SIGSEGV"); empty when it answered or was killed for the limit.
  std::string ended;
};

// Runs `body(answer)` in a child; `answer` points at `answer_bytes` bytes the caller reads back.
ProbeOutcome run_probe(const std::function<void(void* answer)>& body, void* answer, std::size_t answer_bytes,
                       std::chrono::milliseconds limit);

template <typename Answer>
ProbeOutcome run_probe(const std::function<void(Answer&)>& body, Answer& answer, std::chrono::milliseconds limit) {
  static_assert(std::is_trivially_copyable_v<Answer>, "a probe's answer crosses a pipe as bytes");
  return run_probe([&](void* out) { body(*static_cast<Answer*>(out)); }, &answer, sizeof(Answer), limit);
}

}  // namespace cpkv::harness

// Running a helper program (the chart's python3) from an argument vector: no shell ever sees a
// user's text, every wait is bounded, and a child that overruns is killed and reaped.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace cpkv::cli {

struct ChildOutcome {
  bool ran = false;          // the program was found and started
  bool timed_out = false;    // killed after the limit
  int exit_status = -1;      // when it exited
  int signal = 0;            // when a signal ended it
  std::string stderr_tail;   // the last line it wrote on stderr (for one-line messages)
  bool ok() const { return ran && !timed_out && signal == 0 && exit_status == 0; }
  std::string describe() const;  // "exit status 1: ImportError: ..." and the like
};

// Runs argv[0] (searched in PATH) with argv, stdin and stdout on /dev/null, stderr captured, in a
// process group of its own tracked by the interrupt watcher, and waits at most `limit`; then the
// whole group is killed (the helper's own children too: an orphaned python3 ran on and recreated
// its output after cpkv had exited).
ChildOutcome run_child(const std::vector<std::string>& argv, std::chrono::milliseconds limit);

}  // namespace cpkv::cli

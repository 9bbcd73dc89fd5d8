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

// The Python interpreter cpkv runs (--chart's drawing, --backend torch's conformance run):
// $CPKV_PYTHON when set and not empty, else the one configure found (CMake's Python3_EXECUTABLE,
// baked in), never whichever python3 comes first on PATH (a pyenv shim without matplotlib hid the
// interpreter that had it).
struct PythonInterpreter {
  std::string program;
  std::string origin;  // for messages: where the choice came from
};
PythonInterpreter python_interpreter();

// The build's package folder (where this cpkv was built beside the Python package) put first on
// this process's PYTHONPATH, so that a Python child imports the cpkv this cpkv was built with.
void prepend_python_package_path();

// Replaces this process with argv[0] (a path, or searched in PATH), the signal
// dispositions restored first (harness::restore_signals): its output, signals and exit status are
// the command's own. Returns only when the exec failed (errno set).
void exec_program(const std::vector<std::string>& argv);

// A run handed to Python in one step: the configured interpreter (python_interpreter) with the
// build's package first on PYTHONPATH, `probe` (Python code: the imports the run needs) run in a
// bounded child, then this process replaced by the interpreter running `arguments` (exec_program).
// Returns only where it could not: the interpreter, where its choice came from, and why (the
// probe's failure, or the exec's error), for the caller's one line.
struct PythonRefusal {
  std::string program;
  std::string origin;
  std::string reason;
};
PythonRefusal exec_python(std::vector<std::string> arguments, const std::string& probe, std::chrono::milliseconds probe_limit);

}  // namespace cpkv::cli

// A non-seekable input (a pipe, `/dev/stdin` fed by a pipe, `<(...)`, a named pipe) copied once into
// a private file, the one way every front end reads one: the CLI's InputFile (cli/files.hpp) and
// Python's plan() and replay() (python/src/spool_bindings.cpp), which read a trace more than once (a
// scan, then the ranks) and said "the file is empty" of /dev/stdin (issue 22, item 10).
#pragma once

#include <functional>
#include <stdexcept>
#include <string>

namespace cpkv::harness {

// Bad input found while spooling (no writer within the limit, silent past the idle limit, larger
// than the limit, unreadable): the CLI's exit 2. A temporary folder that cannot be written is a
// std::runtime_error (exit 1).
struct SpoolRefused : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Copies `path` into "cpkv-spool-<pid>-XXXXXX.jsonl" in temp_folder() (made and tracked through
// create_tracked_file, so an interrupted CLI removes it; spools of dead processes are swept first)
// and returns the copy's path. Messages start with `label` ("trace: ..."). Each wait for data is
// bounded (a named pipe's writer 5 s, silence 600 s); `between_waits` (may be empty) runs at least
// every 100 ms of waiting and may throw to abandon the copy (Python's Ctrl-C). On any throw the
// partial copy is removed.
std::string spool_input(const std::string& label, const std::string& path, const std::function<void()>& between_waits = {});

// Removes a spool (or any tracked temporary file) and forgets it.
void remove_tracked_file(const std::string& path);

}  // namespace cpkv::harness

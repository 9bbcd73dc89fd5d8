// Timelines in the Chrome trace event format (docs/event-log.md), the pieces every backend shares:
// the buffered whole-line appender, the file's head and tail, and, for a backend whose ranks are
// processes with their own clocks of record (the GPUs), the per-rank part files and their merge into
// the one timeline after the run. The simulator's tracks (sim/recording.hpp) append to the timeline
// directly; the GPU ranks append to their part files (gpu/timeline.hpp) and the parent merges them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cpkv/harness/run.hpp"

namespace cpkv::harness {

inline constexpr std::size_t kAppendBufferBytes = 64 * 1024;

// Buffered whole-line appends to a file (empty path: off). flush() writes the buffer with one
// write(2); a failed write marks the file (temp_files.hpp mark_write_failed: its rename over an old
// output is then refused) and throws std::runtime_error naming the file and the reason. The file is
// opened O_APPEND, so processes and threads appending to one file never split a line.
class LineAppender {
 public:
  explicit LineAppender(std::string path);
  ~LineAppender();  // flushes; a failure here is dropped (the run's own error is reported)
  LineAppender(const LineAppender&) = delete;
  LineAppender& operator=(const LineAppender&) = delete;
  LineAppender(LineAppender&& other) noexcept;
  bool on() const { return fd_ >= 0; }
  void add(std::string_view line);  // one line, without its "\n"
  void flush();

 private:
  std::string path_;
  int fd_ = -1;
  std::string buffer_;
};

// The clock of a timeline: the scheduler's step count (scheduled simulator), monotonic microseconds
// (free-running simulator), or CUDA events placed on the host's monotonic clock (the GPUs).
enum class TimelineClock : std::uint8_t { steps, wall_us, cuda_events };
std::string_view describe(TimelineClock clock);

// Writes the head of the JSON object ({"traceEvents":[) to an empty file; end_timeline its tail
// (the clock in the metadata, displayTimeUnit), so that every event line in between ends ",".
void begin_timeline(const std::string& path);
void end_timeline(const std::string& path, TimelineClock clock);

// One run (a variant) of a rank group in the timeline: its process id and name, and its ranks.
struct TimelineRun {
  std::int32_t pid = 1;
  std::string label;  // the process's name, e.g. "cuda staging_direct"
  std::int32_t ranks = 0;
};

// Rank `rank`'s part file of the run writing into `timeline` (the output's temporary file): the
// same folder, "<timeline>.rank<R>.part". A part holds one Chrome trace event (a JSON object, no
// trailing comma) per line, written by the rank as it goes.
std::string timeline_part_path(const std::string& timeline, std::int32_t rank);

// The part files of one run: created empty (a leftover of an earlier run of the same name removed
// first) and tracked (an interrupted run removes them, interrupt.hpp) before the ranks start;
// removed by the destructor (after the merge, or after a failure before it). Throws
// std::runtime_error naming a file it cannot create.
class TimelineParts {
 public:
  TimelineParts(std::string timeline, TimelineRun run);
  ~TimelineParts();
  TimelineParts(const TimelineParts&) = delete;
  TimelineParts& operator=(const TimelineParts&) = delete;
  const std::string& timeline() const { return timeline_; }
  const TimelineRun& run() const { return run_; }

  // What merge found: event lines copied, lines dropped (not a whole JSON object with the fields of
  // an event: the last line of a rank that died writing it), instants added for violations.
  struct Merged {
    std::int64_t events = 0;
    std::int64_t dropped = 0;
    std::int64_t violations = 0;
  };
  // Appends to the timeline: the process's name, one track per rank ("rank R", tid R), each part's
  // events, and an instant per kept violation at its rank's track (a violation no rank owns: the
  // group's track, tid = ranks), at the end of the spans of its rank, batch and layer (the layer's
  // verify found it; layer -1: the batch's end; no span of it: the rank's last), named "mismatch"
  // (invariant 6: the verify kernel's finding) or "violation: invariant N"; violations counted but
  // not kept are one instant on the group's track. Dropped lines are one instant on their track.
  Merged merge(const std::vector<Violation>& violations, std::int64_t violation_count);

 private:
  std::string timeline_;
  TimelineRun run_;
  void remove_parts();
  std::int32_t made_ = 0;  // parts created (a failed constructor removes what it made)
};

}  // namespace cpkv::harness

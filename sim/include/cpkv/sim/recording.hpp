// What a simulator run writes while it goes, never held whole in memory: the event log (scheduled
// runs: one line a step, docs/event-log.md) and the timeline (every mode: Chrome trace event format,
// one track per rank, docs/event-log.md). Each rank appends whole lines to the file through its own
// buffer of at most kAppendBufferBytes; the file is opened O_APPEND, so rank processes and threads
// appending to one file never split a line. Callers (cpkv replay, the property suites) own the file:
// begin_timeline before the first run, end_timeline after the last, then the rename.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "cpkv/harness/run.hpp"
#include "cpkv/harness/timeline.hpp"
#include "cpkv/sim/machine.hpp"

namespace cpkv::sim {

struct Recording {
  std::string event_log_path;  // scheduled runs: one line a step ("rank op layer a b c"); empty: none
  std::string timeline_path;   // Chrome trace events, appended between begin_timeline and end_timeline; empty: none
  std::int32_t timeline_pid = 1;  // the run's process in the timeline (a backend gives each variant its own)
  std::string label;              // the process's name, e.g. "sim/scheduled staging_direct"
};

// The appender, the clock and the file's head and tail are the harness's (harness/timeline.hpp),
// shared with the GPU backend's timelines.
using harness::begin_timeline;
using harness::describe;
using harness::end_timeline;
using harness::kAppendBufferBytes;
using harness::LineAppender;
using harness::TimelineClock;

// One rank's track: spans (ph X) for steps, instants (ph i, s t) for violations and mismatches.
class TimelineTrack {
 public:
  // tid: the rank, or cp for the group's track (violations no rank owns). Writes the track's name;
  // rank 0 also names the process.
  TimelineTrack(const Recording& recording, std::int32_t tid, std::string_view track_name);
  bool on() const { return out_.on(); }
  // A step from begin to end (end > begin), with batch, layer, parity half and the operands; a wait
  // names whom it waited on (the peers behind when it got there) and the barrier phase.
  void span(const Step& step, std::int64_t batch, std::int32_t half, std::int64_t begin, std::int64_t end, std::string_view waited_on,
            std::int64_t phase);
  void violation(const harness::Violation& violation, std::int64_t at);
  void mismatch(std::int64_t batch, std::int32_t layer, std::string_view detail, std::int64_t at);
  void flush() { out_.flush(); }

 private:
  void instant(std::string_view name, std::string_view category, std::int64_t at, const std::string& args_json);
  LineAppender out_;
  std::int32_t pid_ = 1;
  std::int32_t tid_ = 0;
};

// "1,3": the peers whose barrier (or collective, or batch) arrivals are behind `rank`'s at a wait
// step `op`; "" for any other op or when nobody is behind.
std::string peers_behind(const World& world, std::int32_t rank, Op op);

// The category a step's span is filed under: zero, fill, pack, gather, signal, wait, allreduce, batch.
std::string_view category(Op op);
bool is_wait(Op op);

}  // namespace cpkv::sim

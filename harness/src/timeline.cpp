#include "cpkv/harness/timeline.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <stdexcept>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cpkv/harness/interrupt.hpp"
#include "cpkv/harness/temp_files.hpp"

namespace cpkv::harness {

LineAppender::LineAppender(std::string path) : path_(std::move(path)) {
  if (path_.empty()) return;
  fd_ = open_file(path_, O_WRONLY | O_APPEND | O_CLOEXEC | O_NOFOLLOW);  // through an --out folder's descriptor when in one
  if (fd_ < 0) throw std::runtime_error(fmt::format("cannot append to {}: {}", path_, std::strerror(errno)));
  buffer_.reserve(kAppendBufferBytes);
}

LineAppender::LineAppender(LineAppender&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), buffer_(std::move(other.buffer_)) {}

LineAppender::~LineAppender() {
  if (fd_ < 0) return;
  try {
    flush();
  } catch (const std::exception&) {
    // The run reports its own failure; a full disk here leaves the lines before it.
  }
  ::close(fd_);
}

void LineAppender::add(std::string_view line) {
  if (fd_ < 0) return;
  if (buffer_.size() + line.size() + 1 > kAppendBufferBytes) flush();
  buffer_.append(line);
  buffer_.push_back('\n');
}

void LineAppender::flush() {
  if (fd_ < 0 || buffer_.empty()) return;
  const int error = write_all(fd_, buffer_);
  buffer_.clear();
  if (error == 0) return;
  // Marked on the file, so that the rename over the old output is refused whoever renames it,
  // even when this error is dropped (the destructor) or is a rank process's.
  mark_write_failed(fd_, path_, error);
  throw std::runtime_error(fmt::format("cannot write {}: {}", path_, std::strerror(error)));
}

std::string_view describe(TimelineClock clock) {
  switch (clock) {
    case TimelineClock::steps: return "scheduler steps: ts is the scheduled run's step count (one step shown as 1 us), not time";
    case TimelineClock::wall_us: return "wall time: ts is monotonic microseconds (steady clock)";
    case TimelineClock::cuda_events:
      return "CUDA events: ts is host CLOCK_MONOTONIC microseconds; each rank's spans are CUDA events on its stream, placed on that clock "
             "through a base event recorded at the start of each batch (args.align_us bounds the placement error; docs/event-log.md)";
  }
  return "";
}

void begin_timeline(const std::string& path) {
  LineAppender out(path);
  out.add(R"({"traceEvents":[)");
}

void end_timeline(const std::string& path, TimelineClock clock) {
  LineAppender out(path);
  const nlohmann::json clock_event = {{"name", "clock"}, {"ph", "M"}, {"pid", 0}, {"tid", 0}, {"ts", 0}, {"args", {{"clock", describe(clock)}}}};
  out.add(clock_event.dump());
  const nlohmann::json other = {{"clock", describe(clock)}, {"format", "Chrome trace event format, JSON object form (cpkv docs/event-log.md)"}};
  out.add(fmt::format(R"(],"displayTimeUnit":"ns","otherData":{}}})", other.dump()));
}

std::string timeline_part_path(const std::string& timeline, std::int32_t rank) { return fmt::format("{}.rank{}.part", timeline, rank); }

TimelineParts::TimelineParts(std::string timeline, TimelineRun run) : timeline_(std::move(timeline)), run_(std::move(run)) {
  for (std::int32_t r = 0; r < run_.ranks; ++r) {
    const std::string part = timeline_part_path(timeline_, r);
    std::remove(part.c_str());  // a leftover of a run that was killed (the name is the output's own temporary's)
    const int fd = create_tracked_named_file(part);  // an interrupted run removes it (interrupt.hpp)
    if (fd < 0) {
      const std::string reason = std::strerror(errno);
      remove_parts();  // the destructor does not run after a throwing constructor
      throw std::runtime_error(fmt::format("cannot create {}: {}", part, reason));
    }
    ::close(fd);
    made_ = r + 1;
  }
}

TimelineParts::~TimelineParts() { remove_parts(); }

void TimelineParts::remove_parts() {
  for (std::int32_t r = 0; r < made_; ++r) {
    const std::string part = timeline_part_path(timeline_, r);
    std::remove(part.c_str());
    untrack_file(part);
  }
}

namespace {

bool is_event(const nlohmann::json& e) {
  if (!e.is_object() || !e.contains("name") || !e["name"].is_string() || !e.contains("ph") || !e["ph"].is_string()) return false;
  if (!e.contains("ts") || !e["ts"].is_number() || !e.contains("pid") || !e["pid"].is_number_integer() || !e.contains("tid") ||
      !e["tid"].is_number_integer()) {
    return false;
  }
  if (e["ph"] == "X" && (!e.contains("dur") || !e["dur"].is_number())) return false;
  return e["ph"] != "i" || (e.contains("s") && e["s"].is_string());
}

std::int64_t integer_arg(const nlohmann::json& e, const char* key, std::int64_t absent) {
  if (!e.contains("args") || !e["args"].is_object() || !e["args"].contains(key) || !e["args"][key].is_number_integer()) return absent;
  return e["args"][key].get<std::int64_t>();
}

// Where each rank's spans end: per (batch, layer), per batch (layer -1) and the rank's last.
struct SpanEnds {
  std::map<std::tuple<std::int32_t, std::int64_t, std::int32_t>, double> layer;
  std::map<std::pair<std::int32_t, std::int64_t>, double> batch;
  std::map<std::int32_t, double> rank;
  void add(std::int32_t r, std::int64_t b, std::int32_t l, double end) {
    for (double* at : {&layer[{r, b, l}], &batch[{r, b}], &rank[r]}) *at = std::max(*at, end);
  }
  double at(const Violation& v) const {
    if (auto it = layer.find({v.rank, v.batch, v.layer}); v.layer >= 0 && it != layer.end()) return it->second;
    if (auto it = batch.find({v.rank, v.batch}); it != batch.end()) return it->second;
    if (auto it = rank.find(v.rank); it != rank.end()) return it->second;
    double last = 0;
    for (const auto& [r, end] : rank) last = std::max(last, end);
    return last;
  }
};

std::string instant(std::string_view name, std::string_view category, double ts, std::int32_t pid, std::int32_t tid, const nlohmann::json& args) {
  const nlohmann::json e = {{"name", name}, {"cat", category}, {"ph", "i"}, {"s", "t"}, {"ts", ts}, {"pid", pid}, {"tid", tid}, {"args", args}};
  return e.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + ",";
}

}  // namespace

TimelineParts::Merged TimelineParts::merge(const std::vector<Violation>& violations, std::int64_t violation_count) {
  Merged merged;
  LineAppender out(timeline_);
  const auto meta = [&](std::string_view name, std::int32_t tid, const nlohmann::json& args) {
    out.add(nlohmann::json{{"name", name}, {"ph", "M"}, {"pid", run_.pid}, {"tid", tid}, {"ts", 0}, {"args", args}}.dump() + ",");
  };
  meta("process_name", 0, {{"name", run_.label}});
  for (std::int32_t r = 0; r <= run_.ranks; ++r) {
    meta("thread_name", r, {{"name", r < run_.ranks ? fmt::format("rank {}", r) : std::string("group (no one rank)")}});
    meta("thread_sort_index", r, {{"sort_index", r}});
  }
  SpanEnds ends;
  for (std::int32_t r = 0; r < run_.ranks; ++r) {
    std::ifstream part(timeline_part_path(timeline_, r));
    std::int64_t dropped = 0;
    double last = 0;
    for (std::string line; std::getline(part, line);) {
      const nlohmann::json e = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!is_event(e) || e["pid"] != run_.pid || e["tid"] != r) {
        ++dropped;
        continue;
      }
      const double end = e["ts"].get<double>() + (e["ph"] == "X" ? e["dur"].get<double>() : 0.0);
      last = std::max(last, end);
      if (e["ph"] == "X") ends.add(r, integer_arg(e, "batch", -1), static_cast<std::int32_t>(integer_arg(e, "layer", -1)), end);
      out.add(line + ",");
      ++merged.events;
    }
    if (dropped > 0) {
      out.add(instant("part lines dropped", "timeline", last, run_.pid, r,
                      {{"lines", dropped}, {"why", "not a whole trace event of this rank (a rank that died writing its last line)"}}));
    }
    merged.dropped += dropped;
  }
  for (const Violation& v : violations) {
    const std::int32_t tid = v.rank >= 0 && v.rank < run_.ranks ? v.rank : run_.ranks;
    const nlohmann::json args = {{"invariant", v.invariant}, {"rank", v.rank}, {"batch", v.batch}, {"layer", v.layer}, {"detail", std::string(v.text())}};
    const bool mismatch = v.invariant == 6;
    out.add(instant(mismatch ? std::string("mismatch") : fmt::format("violation: invariant {}", v.invariant), mismatch ? "mismatch" : "violation",
                    ends.at(v), run_.pid, tid, args));
    ++merged.violations;
  }
  if (violation_count > static_cast<std::int64_t>(violations.size())) {
    double last = 0;
    for (const auto& [r, end] : ends.rank) last = std::max(last, end);
    out.add(instant("violations not kept", "violation", last, run_.pid, run_.ranks,
                    {{"counted", violation_count}, {"kept", static_cast<std::int64_t>(violations.size())}}));
  }
  out.flush();
  return merged;
}

}  // namespace cpkv::harness

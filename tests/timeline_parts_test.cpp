// The GPU timeline's merge (harness/timeline.hpp, docs/event-log.md), without a GPU: rank part files
// written by hand as the ranks write them (one trace event a line), merged after "the run" into the
// timeline between its head and tail, then checked against the Chrome trace event format's rules
// (the JSON object form; every event a name, a one-letter ph, ts, integer pid and tid; X a dur; i a
// scope s) and against what the merge promises: one named track per rank, every whole line kept, a
// torn line dropped and said so, each violation an instant on its rank's track at the end of its
// layer's spans (layer -1: the batch's), one no rank owns on the group's track.
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cpkv/harness/temp_files.hpp"
#include "cpkv/harness/timeline.hpp"

namespace cpkv::harness {
namespace {

using nlohmann::json;

class TempFolder {
 public:
  TempFolder() {
    const char* tmp = ::getenv("TMPDIR");
    path_ = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/cpkv-timeline-parts-XXXXXX";
    if (::mkdtemp(path_.data()) == nullptr) throw std::runtime_error("mkdtemp " + path_);
  }
  ~TempFolder() { std::system(fmt::format("rm -rf '{}'", path_).c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

bool exists(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0;
}

void append(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::app);
  out << text;
}

std::string span(const char* name, double ts, double dur, std::int32_t pid, std::int32_t rank, std::int64_t batch, std::int32_t layer) {
  return json{{"name", name}, {"cat", "compose"}, {"ph", "X"}, {"ts", ts}, {"dur", dur}, {"pid", pid}, {"tid", rank},
              {"args", {{"batch", batch}, {"layer", layer}, {"half", layer % 2}, {"variant", "staging_direct"}}}}
             .dump() + "\n";
}

std::vector<json> format_checked(const std::string& path) {
  std::ifstream in(path);
  const json doc = json::parse(in);  // throws on a file that is not whole JSON
  EXPECT_TRUE(doc.is_object() && doc["traceEvents"].is_array());
  EXPECT_TRUE(doc["displayTimeUnit"] == "ms" || doc["displayTimeUnit"] == "ns");
  std::vector<json> events;
  for (const json& e : doc["traceEvents"]) {
    const std::string where = e.dump().substr(0, 160);
    EXPECT_TRUE(e["name"].is_string() && e["ph"].is_string() && e["ph"].get<std::string>().size() == 1) << where;
    EXPECT_TRUE(e["ts"].is_number() && e["ts"].get<double>() >= 0) << where;
    EXPECT_TRUE(e["pid"].is_number_integer() && e["tid"].is_number_integer()) << where;
    if (e["ph"] == "X") {
      EXPECT_TRUE(e["dur"].is_number() && e["dur"].get<double>() >= 0) << where;
    }
    if (e["ph"] == "i") {
      EXPECT_TRUE(e["s"] == "g" || e["s"] == "p" || e["s"] == "t") << where;
    }
    if (e["ph"] == "M" && (e["name"] == "process_name" || e["name"] == "thread_name")) {
      EXPECT_TRUE(e["args"]["name"].is_string()) << where;
    }
    events.push_back(e);
  }
  return events;
}

Violation violation(std::int32_t invariant, std::int32_t rank, std::int64_t batch, std::int32_t layer) {
  Violation v;
  v.invariant = invariant;
  v.rank = rank;
  v.batch = batch;
  v.layer = layer;
  fmt::format_to_n(v.detail, sizeof(v.detail) - 1, "planted: invariant {}", invariant);
  return v;
}

std::vector<json> named(const std::vector<json>& events, const std::string& name) {
  std::vector<json> out;
  for (const json& e : events) {
    if (e["name"] == name) out.push_back(e);
  }
  return out;
}

TEST(TimelineParts, MergeGivesOneTrackPerRankAndPutsEachViolationAtTheEndOfItsLayer) {
  TempFolder folder;
  const std::string timeline = folder.path() + "/t.json.tmp";
  write_new_file(timeline, "");
  begin_timeline(timeline);
  constexpr std::int32_t pid = 3;
  {
    TimelineParts parts(timeline, TimelineRun{pid, "cuda staging_direct", 2});
    ASSERT_TRUE(exists(timeline_part_path(timeline, 0)) && exists(timeline_part_path(timeline, 1))) << "made before the ranks start";
    // Rank 0: batch 0, layers 0 and 1; rank 1 the same, later, then a line torn by its death.
    append(timeline_part_path(timeline, 0), span("fill", 100, 5, pid, 0, 0, 0) + span("compose", 105, 10, pid, 0, 0, 0) +
                                                span("compose", 120, 10, pid, 0, 0, 1) + span("verify", 130, 2.5, pid, 0, 0, 1));
    append(timeline_part_path(timeline, 1), span("compose", 200, 10, pid, 1, 0, 0) + span("compose", 215, 10, pid, 1, 0, 1) +
                                                span("verify", 225, 4, pid, 1, 0, 1) + span("compose", 260, 1, pid, 0, 1, 0) +
                                                R"({"name":"compose","ph":"X","ts":3)");
    const std::vector<Violation> kept = {violation(6, 1, 0, 0), violation(8, 0, 0, -1), violation(7, -1, -1, -1)};
    const TimelineParts::Merged merged = parts.merge(kept, /*violation_count=*/5);
    EXPECT_EQ(merged.events, 7);
    EXPECT_EQ(merged.dropped, 2) << "the torn line and the line of another rank's track";
    EXPECT_EQ(merged.violations, 3);
  }
  EXPECT_FALSE(exists(timeline_part_path(timeline, 0)) || exists(timeline_part_path(timeline, 1))) << "parts removed after the merge";
  end_timeline(timeline, TimelineClock::cuda_events);

  const std::vector<json> events = format_checked(timeline);
  std::map<std::int64_t, std::string> tracks;
  for (const json& e : named(events, "thread_name")) {
    if (e["pid"] == pid) tracks[e["tid"]] = e["args"]["name"];
  }
  EXPECT_EQ(tracks, (std::map<std::int64_t, std::string>{{0, "rank 0"}, {1, "rank 1"}, {2, "group (no one rank)"}}));
  ASSERT_EQ(named(events, "process_name").size(), 1u);
  EXPECT_EQ(named(events, "process_name")[0]["args"]["name"], "cuda staging_direct");
  std::map<std::int64_t, int> spans;
  for (const json& e : events) spans[e["tid"]] += e["ph"] == "X" ? 1 : 0;
  EXPECT_EQ(spans[0], 4);
  EXPECT_EQ(spans[1], 3);

  const std::vector<json> mismatch = named(events, "mismatch");
  ASSERT_EQ(mismatch.size(), 1u);
  EXPECT_EQ(mismatch[0]["ph"], "i");
  EXPECT_EQ(mismatch[0]["tid"], 1);
  EXPECT_EQ(mismatch[0]["args"]["layer"], 0);
  EXPECT_DOUBLE_EQ(mismatch[0]["ts"].get<double>(), 210.0) << "the end of rank 1's spans of batch 0 layer 0 (200 + 10), not of its batch";
  const std::vector<json> timeout = named(events, "violation: invariant 8");
  ASSERT_EQ(timeout.size(), 1u);
  EXPECT_EQ(timeout[0]["tid"], 0);
  EXPECT_DOUBLE_EQ(timeout[0]["ts"].get<double>(), 132.5) << "layer -1: the end of rank 0's batch 0";
  const std::vector<json> group = named(events, "violation: invariant 7");
  ASSERT_EQ(group.size(), 1u);
  EXPECT_EQ(group[0]["tid"], 2) << "no rank owns it: the group's track";
  const std::vector<json> more = named(events, "violations not kept");
  ASSERT_EQ(more.size(), 1u);
  EXPECT_EQ(more[0]["args"]["counted"], 5);
  const std::vector<json> dropped = named(events, "part lines dropped");
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0]["tid"], 1);
  EXPECT_EQ(dropped[0]["args"]["lines"], 2);
  const std::vector<json> clock = named(events, "clock");
  ASSERT_EQ(clock.size(), 1u);
  EXPECT_NE(clock[0]["args"]["clock"].get<std::string>().find("CLOCK_MONOTONIC"), std::string::npos);
}

TEST(TimelineParts, ALeftoverPartIsReplacedAndAnEmptyRunStillNamesItsTracks) {
  TempFolder folder;
  const std::string timeline = folder.path() + "/t.json.tmp";
  write_new_file(timeline, "");
  begin_timeline(timeline);
  append(timeline_part_path(timeline, 0), span("compose", 1, 1, 1, 0, 0, 0));  // a killed run's part
  {
    TimelineParts parts(timeline, TimelineRun{1, "cuda staging_direct", 1});
    EXPECT_EQ(parts.merge({}, 0).events, 0) << "the leftover's line is not this run's";
  }
  end_timeline(timeline, TimelineClock::cuda_events);
  const std::vector<json> events = format_checked(timeline);
  EXPECT_EQ(named(events, "thread_name").size(), 2u) << "rank 0 and the group";
  for (const json& e : events) EXPECT_NE(e["ph"], "X");
}

TEST(TimelineParts, APartThatCannotBeMadeIsOneErrorNamingIt) {
  const std::string timeline = "/nonexistent-cpkv-folder/t.json.tmp";
  try {
    TimelineParts parts(timeline, TimelineRun{1, "x", 2});
    FAIL() << "made a part in a folder that does not exist";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(timeline_part_path(timeline, 0)), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cpkv::harness

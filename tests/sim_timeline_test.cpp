// The simulator's recordings (sim/recording.hpp, docs/event-log.md): the timeline in the Chrome trace
// event format, checked against the format's own rules (the JSON object form: "traceEvents", an
// optional "displayTimeUnit" of "ms" or "ns"; every event a name, a one-letter phase ph, a
// timestamp ts in microseconds, a pid and a tid; a complete event X its duration dur; an instant
// event i its scope s, one of g, p, t; metadata M names a process or thread in args.name), and
// the event log, streamed while the run goes, line for line what the in-memory log wrote before.
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cpkv/model/plan.hpp"
#include "cpkv/model/setting.hpp"
#include "cpkv/sim/runner.hpp"
#include "recording_helpers.hpp"

namespace cpkv::sim {
namespace {

using harness::BatchSource;
using harness::RunReport;
using nlohmann::json;

std::string sample(const std::string& name) { return std::string(CPKV_SOURCE_DIR) + "/traces/samples/" + name; }

// The format's required fields, event by event. Returns the events; every failure names the event.
std::vector<json> checked_events(const std::string& path) {
  std::ifstream in(path);
  const json doc = json::parse(in);  // throws on a file that is not whole JSON
  EXPECT_TRUE(doc.is_object()) << "the JSON object form";
  EXPECT_TRUE(doc.contains("traceEvents") && doc["traceEvents"].is_array());
  if (doc.contains("displayTimeUnit")) {
    EXPECT_TRUE(doc["displayTimeUnit"] == "ms" || doc["displayTimeUnit"] == "ns");
  }
  const std::set<std::string> phases = {"B", "E", "X", "i", "I", "C", "b", "n", "e", "s", "t", "f", "P", "N", "O", "D", "M", "V", "v", "R", "c", "(", ")"};
  std::vector<json> events;
  for (const json& e : doc["traceEvents"]) {
    const std::string where = e.dump().substr(0, 160);
    EXPECT_TRUE(e.contains("name") && e["name"].is_string()) << where;
    EXPECT_TRUE(e.contains("ph") && e["ph"].is_string() && phases.count(e["ph"].get<std::string>()) == 1) << where;
    EXPECT_TRUE(e.contains("ts") && e["ts"].is_number() && e["ts"].get<double>() >= 0) << where;
    EXPECT_TRUE(e.contains("pid") && e["pid"].is_number_integer()) << where;
    EXPECT_TRUE(e.contains("tid") && e["tid"].is_number_integer()) << where;
    const std::string ph = e.value("ph", "");
    if (ph == "X") {
      EXPECT_TRUE(e.contains("dur") && e["dur"].is_number() && e["dur"].get<double>() >= 0) << where;
    }
    if (ph == "i") {
      EXPECT_TRUE(e.contains("s") && (e["s"] == "g" || e["s"] == "p" || e["s"] == "t")) << where;
    }
    if (ph == "M" && (e["name"] == "process_name" || e["name"] == "thread_name")) {
      EXPECT_TRUE(e["args"]["name"].is_string()) << where;
    }
    events.push_back(e);
  }
  return events;
}

std::vector<json> of_phase(const std::vector<json>& events, const std::string& ph, std::int64_t tid = -1) {
  std::vector<json> out;
  for (const json& e : events) {
    if (e["ph"] == ph && (tid < 0 || e["tid"] == tid)) out.push_back(e);
  }
  std::stable_sort(out.begin(), out.end(), [](const json& a, const json& b) { return a["ts"].get<double>() < b["ts"].get<double>(); });
  return out;
}

// A timeline of one run, head and tail written as cpkv replay writes them.
struct TimelineRun {
  RunReport report;
  std::vector<json> events;
};
TimelineRun scheduled_timeline(const BatchSource& source, const harness::RunOptions& options, const Schedule& schedule) {
  testing::EmptyFile file("cpkv-timeline-test");
  Recording recording;
  recording.timeline_path = file.path();
  recording.label = "test";
  begin_timeline(file.path());
  RunReport report = run_scheduled(source, options, schedule, RunLimits{}, recording);
  end_timeline(file.path(), TimelineClock::steps);
  return {std::move(report), checked_events(file.path())};
}

harness::RunOptions options_for(model::Variant variant, std::int32_t layers, std::uint64_t seed, harness::Mutant mutant = harness::Mutant::none) {
  harness::RunOptions options;
  options.variant = variant;
  options.layers = layers;
  options.seed = seed;
  options.mutant = mutant;
  return options;
}

// Every rank a named track; every step one span on its rank's track, spans of a track one after
// another on the step clock; batch, layer and the layer's parity half (PROTOCOL.md section 6) as
// arguments; each wait names whom it waited on and the barrier phase.
TEST(SimTimeline, ScheduledRunHasOneTrackPerRankAndOneSpanPerStep) {
  const BatchSource source = BatchSource::from_trace(sample("tiny.jsonl"));
  const TimelineRun run = scheduled_timeline(source, options_for(model::Variant::staging_direct, 2, 7), Schedule{ScheduleKind::random, {}, 7});
  ASSERT_TRUE(run.report.passed());
  std::set<std::string> names;
  for (const json& m : of_phase(run.events, "M")) {
    if (m["name"] == "thread_name") names.insert(m["args"]["name"].get<std::string>());
  }
  EXPECT_TRUE(names.count("rank 0") == 1 && names.count("rank 1") == 1);
  EXPECT_EQ(of_phase(run.events, "X").size(), run.report.steps);
  std::set<std::string> categories;
  for (std::int64_t rank = 0; rank < 2; ++rank) {
    const std::vector<json> spans = of_phase(run.events, "X", rank);
    EXPECT_EQ(spans.size(), run.report.ranks[rank].steps);
    for (std::size_t i = 0; i < spans.size(); ++i) {
      const json& s = spans[i];
      categories.insert(s["cat"].get<std::string>());
      if (i > 0) {
        EXPECT_GE(s["ts"].get<std::int64_t>(), spans[i - 1]["ts"].get<std::int64_t>() + spans[i - 1]["dur"].get<std::int64_t>()) << s.dump();
      }
      EXPECT_LE(s["ts"].get<std::int64_t>() + s["dur"].get<std::int64_t>(), static_cast<std::int64_t>(run.report.steps));
      EXPECT_TRUE(s["args"].contains("batch")) << s.dump();
      if (s["args"]["layer"].get<std::int32_t>() >= 0) {
        EXPECT_EQ(s["args"]["half"], s["args"]["layer"].get<std::int32_t>() % 2) << s.dump();
      }
      if (s["cat"] == "wait") {
        EXPECT_TRUE(s["args"].contains("on") && s["args"].contains("phase")) << s.dump();
      }
    }
  }
  for (const char* c : {"zero", "fill", "gather", "signal", "wait"}) EXPECT_EQ(categories.count(c), 1u) << c;
}

// A planted bug (single_half: both parities share one staging half) is caught at a step of a rank:
// the timeline shows it as an instant on that rank's track, at the clock of that rank's violating
// step (the checker's step count: its spans before it on the track).
TEST(SimTimeline, PlantedBugShowsAsAnInstantAtTheViolatingRankAndStep) {
  const BatchSource source = BatchSource::from_trace(sample("tiny.jsonl"));
  const TimelineRun run = scheduled_timeline(source, options_for(model::Variant::staging_direct, 2, 7, harness::Mutant::single_half),
                                             Schedule{ScheduleKind::random, {}, 7});
  ASSERT_FALSE(run.report.violations.empty());
  const harness::Violation& first = run.report.violations.front();
  const std::vector<json> instants = of_phase(run.events, "i");
  ASSERT_FALSE(instants.empty());
  const json* found = nullptr;
  for (const json& i : instants) {
    if (i["args"]["step"] == first.step && i["args"]["rank"] == first.rank && found == nullptr) found = &i;
  }
  ASSERT_NE(found, nullptr) << "no instant for " << harness::describe(first);
  EXPECT_EQ((*found)["tid"], first.rank);
  EXPECT_EQ((*found)["name"], "violation: invariant " + std::to_string(first.invariant));
  EXPECT_EQ((*found)["args"]["batch"], first.batch);
  EXPECT_EQ((*found)["args"]["layer"], first.layer);
  const std::vector<json> spans = of_phase(run.events, "X", first.rank);
  ASSERT_GT(spans.size(), static_cast<std::size_t>(first.step));
  const json& violating = spans[static_cast<std::size_t>(first.step)];
  EXPECT_EQ(violating["ts"].get<std::int64_t>() + violating["dur"].get<std::int64_t>(), (*found)["ts"].get<std::int64_t>() + 1)
      << "the instant sits on the violating step " << violating.dump();
  EXPECT_EQ(violating["args"]["batch"], first.batch);
}

// Free-running ranks (threads and processes) append to one file at once: whole lines, valid JSON,
// one span per step on each rank's track, on the wall clock.
TEST(SimTimeline, FreeRunningRanksWriteOneValidTimeline) {
  const BatchSource source = BatchSource::from_trace(sample("mooncake_slice.jsonl"));
  for (const RanksAs ranks_as : {RanksAs::threads, RanksAs::processes}) {
    testing::EmptyFile file("cpkv-timeline-test");
    Recording recording;
    recording.timeline_path = file.path();
    recording.label = std::string(mode_name(ranks_as));
    begin_timeline(file.path());
    FaultOptions faults;
    faults.seed = 3;
    const RunReport report = run_free(source, options_for(model::Variant::staging_direct, 2, 3), ranks_as, faults, RunLimits{}, recording);
    end_timeline(file.path(), TimelineClock::wall_us);
    ASSERT_TRUE(report.passed()) << report.failure;
    const std::vector<json> events = checked_events(file.path());
    for (std::int64_t rank = 0; rank < static_cast<std::int64_t>(report.ranks.size()); ++rank) {
      EXPECT_EQ(of_phase(events, "X", rank).size(), report.ranks[rank].steps) << mode_name(ranks_as) << " rank " << rank;
    }
  }
}

// A rank that crashes (SIGKILL, processes) leaves every step before the crash on its track, and
// the file is whole lines: the crash fault writes the buffer first, every write is of whole lines.
TEST(SimTimeline, KilledRankLeavesEveryStepBeforeTheCrash) {
  const BatchSource source = BatchSource::from_trace(sample("tiny.jsonl"));
  for (const std::uint64_t kill_after : {12u, 40u}) {
    testing::EmptyFile file("cpkv-timeline-test");
    Recording recording;
    recording.timeline_path = file.path();
    recording.label = "processes";
    begin_timeline(file.path());
    FaultOptions faults;
    faults.seed = 3;
    faults.kill_rank = 1;
    faults.kill_after_steps = kill_after;
    // The run ends by the death (the launcher's waitpid), not by a wait's bound: a bound short enough
    // to fire while a loaded machine had not yet scheduled rank 0 ended rank 1 before its crash point.
    RunLimits limits;
    limits.run_ms_max = 120'000;
    const RunReport report = run_free(source, options_for(model::Variant::staging_direct, 2, 3), RanksAs::processes, faults, limits, recording);
    end_timeline(file.path(), TimelineClock::wall_us);
    ASSERT_FALSE(report.passed());
    const std::vector<json> events = checked_events(file.path());  // whole JSON: no partial line
    EXPECT_EQ(of_phase(events, "X", 1).size(), kill_after) << "killed after " << kill_after << " steps";
  }
}

// Tiny under seed 7 (content and random schedule) gives, line for line, the event log the in-memory version
// wrote (tests/golden/README.md), a clean run and a planted bug's alike.
TEST(SimEventLog, StreamedLogIsLineForLineTheInMemoryOne) {
  const BatchSource source = BatchSource::from_trace(sample("tiny.jsonl"));
  for (const auto& [mutant, golden] : {std::pair{harness::Mutant::none, "none"}, std::pair{harness::Mutant::single_half, "single_half"}}) {
    std::vector<std::string> log;
    testing::scheduled_with_log(source, options_for(model::Variant::staging_direct, 2, 7, mutant), Schedule{ScheduleKind::random, {}, 7}, log);
    const std::string path = std::string(CPKV_SOURCE_DIR) + "/tests/golden/event-log-tiny-seed7-" + golden + ".log";
    const std::vector<std::string> expected = testing::read_lines(path);
    ASSERT_FALSE(expected.empty()) << path;
    EXPECT_EQ(log, expected) << golden;
  }
}

// The log of a long run is on disk while the run goes: at the run's progress callbacks the file has
// grown past nothing and is short of its end.
TEST(SimEventLog, LongRunLogGrowsWhileTheRunGoes) {
  const BatchSource source = BatchSource::from_trace(sample("mooncake_slice.jsonl"));
  testing::EmptyFile file("cpkv-event-log-test");
  Recording recording;
  recording.event_log_path = file.path();
  std::vector<std::int64_t> sizes;
  RunLimits limits;
  limits.on_progress = [&](std::int64_t) {
    struct stat st {};
    ASSERT_EQ(::stat(file.path().c_str(), &st), 0);
    sizes.push_back(st.st_size);
  };
  const RunReport report = run_scheduled(source, options_for(model::Variant::staging_direct, 2, 7), Schedule{ScheduleKind::random, {}, 7}, limits, recording);
  ASSERT_TRUE(report.passed());
  struct stat st {};
  ASSERT_EQ(::stat(file.path().c_str(), &st), 0);
  ASSERT_GT(st.st_size, static_cast<off_t>(4 * kAppendBufferBytes)) << "a log several buffers long";
  ASSERT_FALSE(sizes.empty());
  const auto mid = std::count_if(sizes.begin(), sizes.end(), [&](std::int64_t s) { return s > 0 && s < st.st_size; });
  EXPECT_GT(mid, 0) << "the file grew before the run ended";
  EXPECT_EQ(testing::read_lines(file.path()).size(), report.steps);
}

}  // namespace
}  // namespace cpkv::sim

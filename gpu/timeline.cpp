#include "timeline.hpp"

#include <time.h>

#include <cstdio>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cpkv/harness/launch.hpp"
#include "cpkv/model/plan.hpp"
#include "cuda_backend.hpp"
#include "rank.hpp"

namespace cpkv::cuda {

namespace {

double monotonic_us() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_nsec) / 1e3;
}

struct SpanRecord {
  std::string name;
  std::string note;
  std::int32_t layer = 0;
  cudaEvent_t begin = nullptr;
  cudaEvent_t end = nullptr;
};

// The trace-event process of a variant's run: the ranks write their parts under it and the merge keeps
// only those lines, so both sides take it from here. Every run goes through a plugin (the plugin
// host is the backend's one rank loop); the pids of the in-process runs before issue 36 stay unused.
std::int32_t timeline_pid(const CudaOptions& cuda, model::Variant variant) {
  return 1 + static_cast<std::int32_t>(variant) + (cuda.exchange ? static_cast<std::int32_t>(model::kVariantCount) : 0);
}

}  // namespace

// One rank's recorder: the events of the batch in flight (a pool reused from batch to batch), the
// batch's base, the part file.
class RankTimeline {
 public:
  RankTimeline(Rank& r, std::string part) : r_(r), out_(std::move(part)) {}
  ~RankTimeline() {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    if (base_ != nullptr) cudaEventDestroy(base_);
  }
  RankTimeline(const RankTimeline&) = delete;
  RankTimeline& operator=(const RankTimeline&) = delete;

  bool recording() const { return recording_; }

  void batch_begin(std::int64_t batch) {
    spans_.clear();
    used_ = 0;
    batch_ = batch;
    recording_ = !truncated_ && !failed_;
    if (!recording_) return;
    if (base_ == nullptr && !ok(cudaEventCreate(&base_), "cudaEventCreate")) return;
    t1_ = monotonic_us();
    if (!ok(cudaEventRecord(base_, r_.stream), "cudaEventRecord")) return;
    {
      const harness::Waiting waiting(r_.ctx.progress, harness::kWaitingOnDevice);  // the launcher's stuck bound covers it
      if (!ok(cudaEventSynchronize(base_), "cudaEventSynchronize")) return;
    }
    t2_ = monotonic_us();
  }

  void layers_end() { recording_ = false; }

  std::int64_t open(std::string_view name, std::int32_t layer, std::string_view note) {
    if (!recording_) return -1;
    if (total_ + static_cast<std::int64_t>(spans_.size()) >= kTimelineSpansMax) {
      recording_ = false;
      truncated_ = true;
      instant("truncated", monotonic_us(), {{"batch", batch_}, {"layer", layer}, {"spans_max", kTimelineSpansMax},
                                              {"why", "a rank records at most spans_max spans; the rest of the run is not in the timeline"}});
      return -1;
    }
    SpanRecord s{std::string(name), std::string(note), layer, event(), event()};
    if (s.begin == nullptr || s.end == nullptr || !ok(cudaEventRecord(s.begin, r_.stream), "cudaEventRecord")) return -1;
    spans_.push_back(std::move(s));
    return static_cast<std::int64_t>(spans_.size()) - 1;
  }

  void close(std::int64_t index) {
    if (index < 0 || index >= static_cast<std::int64_t>(spans_.size()) || failed_) return;
    ok(cudaEventRecord(spans_[index].end, r_.stream), "cudaEventRecord");
  }

  // After the batch's synchronization: every event has completed.
  void read() {
    recording_ = false;
    if (failed_ || spans_.empty()) return;
    const std::string variant(model::to_string(r_.ctx.options.variant));
    const std::string path(model::to_string(r_.variant));
    for (const SpanRecord& s : spans_) {
      float begin_ms = 0, end_ms = 0;
      if (!ok(cudaEventElapsedTime(&begin_ms, base_, s.begin), "cudaEventElapsedTime") ||
          !ok(cudaEventElapsedTime(&end_ms, base_, s.end), "cudaEventElapsedTime")) {
        return;
      }
      nlohmann::json args = {{"batch", batch_}, {"layer", s.layer}, {"half", model::parity_half(s.layer)}, {"variant", variant},
                             {"align_us", t2_ - t1_}};
      if (path != variant) args["path"] = path;
      if (!s.note.empty()) args["note"] = s.note;
      const double ts = t1_ + 1e3 * static_cast<double>(begin_ms);
      const double dur = 1e3 * static_cast<double>(end_ms - begin_ms);
      out_.add(nlohmann::json{{"name", s.name}, {"cat", category(s.name)}, {"ph", "X"}, {"ts", ts}, {"dur", dur > 0 ? dur : 0.0},
                              {"pid", pid()}, {"tid", r_.ctx.rank}, {"args", args}}
                   .dump());
    }
    total_ += static_cast<std::int64_t>(spans_.size());
    spans_.clear();
    used_ = 0;
    out_.flush();  // a batch's spans are on disk before the next batch (a crash, a hang)
  }

  void overflow(std::int64_t batch) {
    if (failed_) return;
    instant("overflow", monotonic_us(), {{"batch", batch}, {"why", "the staging capacity verdict refused the batch: nothing of it moved"}});
  }

 private:
  std::int32_t pid() const { return timeline_pid(r_.ctx.cuda, r_.ctx.options.variant); }

  static std::string_view category(std::string_view name) {
    if (name == "zero" || name == "fill" || name == "rows") return name == "rows" ? "fill" : name;
    if (name == "allreduce" || name == "unpack" || name == "verify") return name;
    return "compose";
  }

  void instant(std::string_view name, double ts, const nlohmann::json& args) {
    out_.add(nlohmann::json{{"name", name}, {"cat", name}, {"ph", "i"}, {"s", "t"}, {"ts", ts}, {"pid", pid()}, {"tid", r_.ctx.rank}, {"args", args}}.dump());
    out_.flush();
  }

  // A CUDA error of the recorder stops the recording (one instant saying so); the run goes on and
  // reports its own errors.
  bool ok(cudaError_t error, const char* call) {
    if (error == cudaSuccess) return true;
    if (!failed_) {
      failed_ = true;
      recording_ = false;
      instant("timeline stopped", monotonic_us(), {{"batch", batch_}, {"call", call}, {"error", cudaGetErrorString(error)}});
    }
    return false;
  }

  cudaEvent_t event() {
    if (used_ < events_.size()) return events_[used_++];
    cudaEvent_t e = nullptr;
    if (!ok(cudaEventCreate(&e), "cudaEventCreate")) return nullptr;
    events_.push_back(e);
    ++used_;
    return e;
  }

  Rank& r_;
  harness::LineAppender out_;
  std::vector<cudaEvent_t> events_;  // the pool: used_ of them hold this batch's spans
  std::size_t used_ = 0;
  std::vector<SpanRecord> spans_;
  cudaEvent_t base_ = nullptr;
  double t1_ = 0, t2_ = 0;
  std::int64_t batch_ = -1;
  std::int64_t total_ = 0;
  bool recording_ = false;
  bool truncated_ = false;
  bool failed_ = false;
};

void RankTimelineClose::operator()(RankTimeline* timeline) const { delete timeline; }

RankTimelineHandle open_timeline(Rank& r) {
  if (r.ctx.cuda.timeline.empty()) return nullptr;
  RankTimelineHandle timeline(new RankTimeline(r, harness::timeline_part_path(r.ctx.cuda.timeline, r.ctx.rank)));
  r.timeline = timeline.get();
  return timeline;
}

TimelineSpan::TimelineSpan(Rank& r, std::string_view name, std::int32_t layer, std::string_view note) : r_(r) {
  if (r.timeline != nullptr && r.timeline->recording()) index_ = r.timeline->open(name, layer, note);
}

TimelineSpan::~TimelineSpan() {
  if (index_ >= 0 && r_.timeline != nullptr) r_.timeline->close(index_);
}

std::string plugin_span_name(std::string_view plugin) { return fmt::format("compose_layer (plugin {})", plugin); }

void timeline_batch_begin(Rank& r, std::int64_t batch) {
  if (r.timeline != nullptr) r.timeline->batch_begin(batch);
}
void timeline_layers_end(Rank& r) {
  if (r.timeline != nullptr) r.timeline->layers_end();
}
void timeline_batch_read(Rank& r) {
  if (r.timeline != nullptr) r.timeline->read();
}
void timeline_overflow(Rank& r, std::int64_t batch) {
  if (r.timeline != nullptr) r.timeline->overflow(batch);
}

std::unique_ptr<harness::TimelineParts> start_group_timeline(const CudaOptions& cuda, model::Variant variant, std::int32_t ranks) {
  if (cuda.timeline.empty()) return nullptr;
  harness::TimelineRun run;
  run.pid = timeline_pid(cuda, variant);
  run.label = fmt::format("cuda {}{}", model::to_string(variant), cuda.exchange ? fmt::format(" (plugin {})", cuda.exchange->name) : std::string());
  run.ranks = ranks;
  return std::make_unique<harness::TimelineParts>(cuda.timeline, run);
}

void finish_group_timeline(harness::TimelineParts* parts, const harness::RunReport& report) {
  if (parts != nullptr) parts->merge(report.violations, report.violation_count);
}

}  // namespace cpkv::cuda

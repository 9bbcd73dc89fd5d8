// The GPU backend's timeline (cpkv replay --backend cuda --timeline, cpkv bench --timeline;
// docs/event-log.md): each rank records CUDA events around what the host enqueues for a layer, on
// the rank's own stream, and reads them after the batch's one synchronization, so the layer loop
// stays free of host synchronization. Spans go to the rank's part file (harness/timeline.hpp); the
// parent merges the parts into the timeline after the run, violations included.
//
// The clock: at the start of each recorded batch (after the host barrier that ends the pool
// population, or the plugin's verdict barrier) a rank stamps CLOCK_MONOTONIC (t1), records a base
// event on its idle stream, waits for it and stamps again (t2). The base ran between t1 and t2, so
// a span's ts = t1 + cudaEventElapsedTime(base, its event) is off by at most t2 - t1 (args.align_us)
// plus the drift of the GPU's clock against the host's over one batch; CLOCK_MONOTONIC is one clock
// for every process of the host, so ranks share it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cpkv/harness/timeline.hpp"
#include "cpkv/model/variants.hpp"

namespace cpkv::cuda {

struct Rank;
struct CudaOptions;
class RankTimeline;

// Bounds: spans a rank records over the whole run (then one "truncated" instant and no more), so a
// long trace cannot exhaust memory or disk: about 300 bytes a span in the file (15 MB a rank), and
// the merge keeps one number per rank, batch and layer.
inline constexpr std::int64_t kTimelineSpansMax = 50'000;

// cuda_rank: the rank's recorder when the run writes a timeline (null otherwise); sets r.timeline.
struct RankTimelineClose {
  void operator()(RankTimeline* timeline) const;
};
using RankTimelineHandle = std::unique_ptr<RankTimeline, RankTimelineClose>;
RankTimelineHandle open_timeline(Rank& r);

// One span on the rank's stream around what is enqueued in its scope: "zero", "fill", "compose",
// "allreduce", "unpack", "verify"; a plugin's "rows" and "compose_layer (plugin NAME)". Records only
// between timeline_batch_begin and timeline_layers_end (the checked layers: never the bench's
// timed graph replays); free when off.
class TimelineSpan {
 public:
  TimelineSpan(Rank& r, std::string_view name, std::int32_t layer, std::string_view note = {});
  ~TimelineSpan();
  TimelineSpan(const TimelineSpan&) = delete;
  TimelineSpan& operator=(const TimelineSpan&) = delete;

 private:
  Rank& r_;
  std::int64_t index_ = -1;
};

// A plugin's layer: "compose_layer (plugin NAME)".
std::string plugin_span_name(std::string_view plugin);

// The batch's hooks: the base event (before its first layer), the end of its recorded layers (before
// any timing), its spans read and written (after the batch's one synchronization), a batch refused
// as an overflow (an instant now).
void timeline_batch_begin(Rank& r, std::int64_t batch);
void timeline_layers_end(Rank& r);
void timeline_batch_read(Rank& r);
void timeline_overflow(Rank& r, std::int64_t batch);

// run_group: the part files of one run (one per rank, next to the timeline's temporary file), or
// none when the run writes no timeline; merged once the ranks are reaped (also after a failure).
std::unique_ptr<harness::TimelineParts> start_group_timeline(const CudaOptions& cuda, model::Variant variant, std::int32_t ranks);
void finish_group_timeline(harness::TimelineParts* parts, const harness::RunReport& report);

}  // namespace cpkv::cuda

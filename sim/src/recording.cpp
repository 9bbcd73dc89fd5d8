#include "cpkv/sim/recording.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cpkv/harness/temp_files.hpp"

namespace cpkv::sim {

TimelineTrack::TimelineTrack(const Recording& recording, std::int32_t tid, std::string_view track_name)
    : out_(recording.timeline_path), pid_(recording.timeline_pid), tid_(tid) {
  if (!on()) return;
  const auto meta = [&](std::string_view name, const nlohmann::json& args) {
    const nlohmann::json event = {{"name", name}, {"ph", "M"}, {"pid", pid_}, {"tid", tid_}, {"ts", 0}, {"args", args}};
    out_.add(event.dump() + ",");
  };
  if (tid == 0) meta("process_name", {{"name", recording.label}});
  meta("thread_name", {{"name", track_name}});
  meta("thread_sort_index", {{"sort_index", tid}});
}

namespace {

nlohmann::json operands_json(const Step& step) {
  return std::visit(
      [](const auto& o) -> nlohmann::json {
        using T = std::decay_t<decltype(o)>;
        if constexpr (std::is_same_v<T, SlotStep>) return {{"slot", o.slot}};
        if constexpr (std::is_same_v<T, PageStep>) return {{"current_index", o.current_index}};
        if constexpr (std::is_same_v<T, FillStep>) return {{"current_index", o.current_index}, {"entry_begin", o.entry_begin}, {"entry_count", o.entry_count}};
        if constexpr (std::is_same_v<T, GatherStep>) return {{"slot", o.slot}, {"source_page", o.source_page}, {"table_index", o.table_index}};
        if constexpr (std::is_same_v<T, CollectiveStep>) return {{"slot_begin", o.slot_begin}, {"slot_end", o.slot_end}, {"kind", o.kind}};
        return nlohmann::json::object();
      },
      step.operands);
}

}  // namespace

void TimelineTrack::span(const Step& step, std::int64_t batch, std::int32_t half, std::int64_t begin, std::int64_t end, std::string_view waited_on,
                         std::int64_t phase) {
  if (!on()) return;
  nlohmann::json args = operands_json(step);
  args["batch"] = batch;
  args["layer"] = step.layer;
  if (step.layer >= 0) args["half"] = half;
  if (is_wait(step.op)) {
    args["on"] = waited_on.empty() ? "none (every peer had arrived)" : std::string(waited_on);
    args["phase"] = phase;
  }
  const nlohmann::json event = {{"name", to_string(step.op)}, {"cat", category(step.op)}, {"ph", "X"}, {"ts", begin},
                                {"dur", end > begin ? end - begin : 1}, {"pid", pid_}, {"tid", tid_}, {"args", args}};
  out_.add(event.dump() + ",");
}

void TimelineTrack::instant(std::string_view name, std::string_view category, std::int64_t at, const std::string& args_json) {
  out_.add(fmt::format(R"({{"name":{},"cat":"{}","ph":"i","s":"t","ts":{},"pid":{},"tid":{},"args":{}}},)", nlohmann::json(name).dump(), category, at,
                       pid_, tid_, args_json));
  out_.flush();  // a finding is on disk before whatever follows it (a crash, a hang)
}

void TimelineTrack::violation(const harness::Violation& v, std::int64_t at) {
  if (!on()) return;
  const nlohmann::json args = {{"invariant", v.invariant}, {"rank", v.rank},       {"batch", v.batch},
                               {"layer", v.layer},         {"slot", v.slot},       {"step", v.step},
                               {"detail", nlohmann::json(std::string(v.detail)).get<std::string>()}};
  instant(fmt::format("violation: invariant {}", v.invariant), "violation", at, args.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

void TimelineTrack::mismatch(std::int64_t batch, std::int32_t layer, std::string_view detail, std::int64_t at) {
  if (!on()) return;
  const nlohmann::json args = {{"batch", batch}, {"layer", layer}, {"detail", std::string(detail)}};
  instant("mismatch", "mismatch", at, args.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

std::string peers_behind(const World& world, std::int32_t rank, Op op) {
  Counter& (World::*counter)(std::int32_t) const = nullptr;
  if (op == Op::wait) counter = &World::barrier_counter;
  if (op == Op::coll_wait) counter = &World::collective_counter;
  if (op == Op::batch_wait) counter = &World::batch_counter;
  if (counter == nullptr) return {};
  const std::uint64_t own = (world.*counter)(rank).value.load();
  std::string behind;
  for (std::int32_t p = 0; p < world.geometry().cp; ++p) {
    if ((world.*counter)(p).value.load() < own) behind += fmt::format("{}{}", behind.empty() ? "" : ",", p);
  }
  return behind;
}

bool is_wait(Op op) { return op == Op::wait || op == Op::coll_wait || op == Op::batch_wait; }

std::string_view category(Op op) {
  switch (op) {
    case Op::zero_dense:
    case Op::zero_own: return "zero";
    case Op::local_prefix:
    case Op::fill: return "fill";
    case Op::pack:
    case Op::unpack:
    case Op::publish: return "pack";
    case Op::gather: return "gather";
    case Op::arrive:
    case Op::coll_arrive:
    case Op::batch_arrive: return "signal";
    case Op::wait:
    case Op::coll_wait:
    case Op::batch_wait: return "wait";
    case Op::reduce:
    case Op::store: return "allreduce";
    case Op::all_gather: return "allgather";
    case Op::reorder: return "pack";
    default: return "batch";
  }
}

}  // namespace cpkv::sim

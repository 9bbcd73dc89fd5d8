#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "cpkv/harness/run.hpp"
#include "cpkv/harness/source.hpp"
#include "cpkv/model/batch.hpp"
#include "cpkv/traces/trace.hpp"

namespace cpkv::harness {

BatchCursor::BatchCursor(const BatchSource& source) : source_(source) {
  if (!source.trace_path.empty()) reader_ = std::make_unique<traces::TraceReader>(source.trace_path);
}
BatchCursor::~BatchCursor() = default;

std::optional<model::Batch> BatchCursor::next() {
  while (true) {
    std::optional<model::Batch> batch;
    if (reader_) {
      batch = reader_->next();
      index_ = reader_->batch_index();
    } else if (static_cast<std::size_t>(index_ + 1) < source_.batches.size()) {
      ++index_;
      batch = source_.batches[index_];
    }
    if (!batch) return std::nullopt;
    if (!source_.only_batch || *source_.only_batch == index_) return batch;
  }
}

BatchSource BatchSource::from_trace(const std::string& path, std::optional<std::int64_t> only_batch) {
  BatchSource source;
  source.trace_path = path;
  source.only_batch = only_batch;
  traces::TraceReader reader(path);
  source.setting = reader.header().setting;
  return source;
}

BatchSource BatchSource::from_batches(model::Setting setting, std::vector<model::Batch> batches) {
  BatchSource source;
  source.setting = std::move(setting);
  source.batches = std::move(batches);
  return source;
}

SourceShape measure(const BatchSource& source,
                    const std::function<void(std::int64_t batch_index, const model::BatchLayout& layout)>& on_batch) {
  SourceShape shape;
  BatchCursor cursor(source);
  while (auto batch = cursor.next()) {
    ++shape.batches;
    const model::BatchLayout layout = model::layout_batch(source.setting, *batch);
    shape.slot_count_max = std::max(shape.slot_count_max, layout.slot_count);
    shape.current_pages_max = std::max(shape.current_pages_max, layout.current_pages_total);
    if (on_batch) on_batch(cursor.index(), layout);
    for (const model::Request& request : batch->requests) {
      shape.pool_pages_touched.insert(shape.pool_pages_touched.end(), request.prefix_pages.begin(), request.prefix_pages.end());
    }
  }
  std::vector<std::int64_t>& pages = shape.pool_pages_touched;
  std::sort(pages.begin(), pages.end());
  pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
  return shape;
}

void Totals::add_mismatches(std::int64_t kinds, std::string_view description) {
  mismatches += kinds;
  if (first_mismatch[0] != '\0' || description.empty()) return;
  const std::size_t n = std::min(description.size(), sizeof(first_mismatch) - 1);
  std::memcpy(first_mismatch, description.data(), n);
  first_mismatch[n] = '\0';
}

void add_rank(RunReport& report, const Totals& rank) {
  report.ranks.push_back(rank);
  report.steps += rank.steps;
}

std::int64_t RunReport::mismatches() const {
  std::int64_t sum = 0;
  for (const Totals& t : ranks) sum += t.mismatches;
  return sum;
}

std::string describe(const Violation& v) {
  static constexpr const char* kNames[] = {"?",
                                           "page-writer exclusivity",
                                           "parity-half reuse safety",
                                           "overflow determinism",
                                           "barrier phase safety",
                                           "plan invariance",
                                           "byte exactness",
                                           "capability agreement",
                                           "liveness"};
  return fmt::format("invariant {} ({}): rank {} batch {} layer {} slot {} step {}: {}", v.invariant,
                     kNames[std::clamp(v.invariant, 0, kInvariants)], v.rank, v.batch, v.layer, v.slot, v.step, v.detail);
}

}  // namespace cpkv::harness

// The body of the trace-reader fuzz targets (trace_file_fuzz.cpp, trace_batches_fuzz.cpp).
#pragma once

#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cpkv/traces/trace.hpp"
#include "fuzz_checks.hpp"

namespace cpkv::fuzz {

inline bool same_batch(const model::Batch& a, const model::Batch& b) {
  if (a.requests.size() != b.requests.size()) return false;
  for (std::size_t r = 0; r < a.requests.size(); ++r) {
    const model::Request& x = a.requests[r];
    const model::Request& y = b.requests[r];
    if (x.prefix_len != y.prefix_len || x.extend_len != y.extend_len || x.prefix_pages != y.prefix_pages) return false;
  }
  return true;
}

// The reader's two readings of a batch line must agree: whatever the fast path accepts, the DOM
// path accepts with the same batch (trace.cpp explains the two).
inline void check_batch_paths(const std::string& line) {
  const std::optional<traces::detail::BatchLine> fast = traces::detail::read_batch_line_fast(line);
  if (!fast) return;
  try {
    const traces::detail::BatchLine dom = traces::detail::read_batch_line_dom(line, "fuzz.jsonl", 2, fast->index);
    if (dom.index != fast->index || !same_batch(dom.batch, fast->batch)) fail("fast and DOM paths read different batches: " + line);
  } catch (const traces::TraceError& error) {
    fail(std::string("the fast path accepted a line the DOM path refuses: ") + error.what());
  }
}

// Reads `text` as a trace to its end or its first refusal, and checks: every refusal is a short
// located line; the two readings of every batch line agree; and what was read, written again by
// TraceWriter (which must accept it), reads back the same.
inline void read_trace(const std::string& text) {
  std::istringstream lines(text);
  std::string line;
  std::getline(lines, line);  // the header
  while (std::getline(lines, line)) check_batch_paths(line);

  std::optional<traces::TraceHeader> header;
  std::vector<model::Batch> batches;
  try {
    traces::TraceReader reader(std::make_unique<std::istringstream>(text), "fuzz.jsonl");
    header = reader.header();
    while (std::optional<model::Batch> batch = reader.next()) batches.push_back(std::move(*batch));
  } catch (const traces::TraceError& error) {
    check_refusal(error);
  }
  if (!header) return;
  std::ostringstream written;
  traces::TraceWriter writer(written, *header);  // throws (an uncaught exception: a finding) on a setting the reader accepted
  for (const model::Batch& batch : batches) writer.write(batch);
  try {
    traces::TraceReader again(std::make_unique<std::istringstream>(written.str()), "again.jsonl");
    for (const model::Batch& batch : batches) {
      const std::optional<model::Batch> read = again.next();
      if (!read || !same_batch(*read, batch)) fail("a written batch reads back differently");
    }
    if (again.next()) fail("the written trace has an extra batch");
  } catch (const traces::TraceError& error) {
    fail(std::string("the reader refuses what the writer wrote: ") + error.what());
  }
}

}  // namespace cpkv::fuzz

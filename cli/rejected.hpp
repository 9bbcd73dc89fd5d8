// The batches a run rejects for overflow (PROTOCOL.md section 4: "fails fast with a clear error"):
// one line each on stderr, the first few of them, and the whole list in the --json report, for
// every backend. The verdict is batch-logical (model::overflow_verdict), the one every rank reaches.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cpkv/harness/replay_report.hpp"

namespace cpkv::cli {

// Rejected batches printed one per line; the rest are counted (a trace of thousands of overflowing
// batches must not bury the report), and all are in the --json report.
inline constexpr std::size_t kRejectedLinesMax = 5;

using harness::RejectedBatch;
using harness::rejected_json;  // the --json report's list, shared with the Python package

inline void print_rejected(const char* command, const std::vector<RejectedBatch>& rejected) {
  for (std::size_t k = 0; k < rejected.size() && k < kRejectedLinesMax; ++k) {
    fmt::print(stderr, "{}: batch {} rejected: {}\n", command, rejected[k].batch, rejected[k].verdict.describe());
  }
  if (rejected.size() > kRejectedLinesMax) {
    fmt::print(stderr, "{}: ... and {} more rejected batches (every one in the --json report, rejected_batches)\n", command,
               rejected.size() - kRejectedLinesMax);
  }
}

}  // namespace cpkv::cli

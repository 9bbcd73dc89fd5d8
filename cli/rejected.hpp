// The batches a run rejects for overflow (PROTOCOL.md section 4: "fails fast with a clear error"):
// one line each on stderr, the first few of them, and the whole list in the --json report, for
// every backend. The verdict is batch-logical (model::overflow_verdict), the one every rank reaches.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cpkv/model/staging.hpp"

namespace cpkv::cli {

// Rejected batches printed one per line; the rest are counted (a trace of thousands of overflowing
// batches must not bury the report), and all are in the --json report.
inline constexpr std::size_t kRejectedLinesMax = 5;

struct RejectedBatch {
  std::int64_t batch = 0;
  model::Verdict verdict;
};

inline void print_rejected(const char* command, const std::vector<RejectedBatch>& rejected) {
  for (std::size_t k = 0; k < rejected.size() && k < kRejectedLinesMax; ++k) {
    fmt::print(stderr, "{}: batch {} rejected: {}\n", command, rejected[k].batch, rejected[k].verdict.describe());
  }
  if (rejected.size() > kRejectedLinesMax) {
    fmt::print(stderr, "{}: ... and {} more rejected batches (every one in the --json report, rejected_batches)\n", command,
               rejected.size() - kRejectedLinesMax);
  }
}

inline nlohmann::json rejected_json(const std::vector<RejectedBatch>& rejected) {
  nlohmann::json list = nlohmann::json::array();
  for (const RejectedBatch& r : rejected) {
    list.push_back({{"batch", r.batch}, {"current_pages_total", r.verdict.current_pages_total}, {"staging_slots", r.verdict.staging_slots},
                    {"verdict", r.verdict.describe()}});
  }
  return list;
}

}  // namespace cpkv::cli

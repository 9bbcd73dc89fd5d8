// What every replay front end shares (`cpkv replay` and the Python package's replay()): the variants
// a name selects, the scan of a source before any rank starts (every batch validated, the largest
// measured, each batch's overflow verdict), and the JSON of a run, rejected batches included, that
// `cpkv replay --json` writes and Python returns as a dict. One function each, so the two cannot drift.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cpkv/harness/run.hpp"
#include "cpkv/harness/source.hpp"
#include "cpkv/model/staging.hpp"

namespace cpkv::harness {

// "all": every variant, in the table's order; a variant's name: that one; anything else: nullopt.
std::optional<std::vector<model::Variant>> variants_named(std::string_view name);

// A batch the overflow verdict rejects (PROTOCOL.md section 4: batch-logical, the one every rank reaches).
struct RejectedBatch {
  std::int64_t batch = 0;
  model::Verdict verdict;
};

struct SourceScan {
  SourceShape shape;
  std::vector<RejectedBatch> rejected;
};
// One pass over the source (measure) with every batch's overflow verdict.
SourceScan scan(const BatchSource& source);

// [{batch, current_pages_total, staging_slots, verdict}, ...]
nlohmann::json rejected_json(const std::vector<RejectedBatch>& rejected);

// One run: variant, mode, passed, mismatches, violations, deadlock, failure, steps, seconds, the
// per-rank totals and the kept violations, described.
nlohmann::json run_json(const RunReport& report, double seconds);

}  // namespace cpkv::harness

#include "cpkv/harness/replay_report.hpp"

namespace cpkv::harness {

std::optional<std::vector<model::Variant>> variants_named(std::string_view name) {
  if (name == "all") return std::vector<model::Variant>(model::kAllVariants.begin(), model::kAllVariants.end());
  const auto variant = model::parse_variant(name);
  if (!variant) return std::nullopt;
  return std::vector<model::Variant>{*variant};
}

SourceScan scan(const BatchSource& source) {
  SourceScan out;
  const std::int64_t staging_slots = model::staging_capacity(source.setting).staging_slots;
  out.shape = measure(source, [&](std::int64_t batch_index, const model::BatchLayout& layout) {
    const model::Verdict verdict = model::overflow_verdict(layout.current_pages_total, staging_slots);
    if (verdict.overflow) out.rejected.push_back({batch_index, verdict});
  });
  return out;
}

nlohmann::json rejected_json(const std::vector<RejectedBatch>& rejected) {
  nlohmann::json list = nlohmann::json::array();
  for (const RejectedBatch& r : rejected) {
    list.push_back({{"batch", r.batch}, {"current_pages_total", r.verdict.current_pages_total}, {"staging_slots", r.verdict.staging_slots},
                    {"verdict", r.verdict.describe()}});
  }
  return list;
}

nlohmann::json run_json(const RunReport& report, double seconds) {
  nlohmann::json run = {{"variant", model::to_string(report.variant)}, {"mode", report.mode}, {"passed", report.passed()},
                        {"mismatches", report.mismatches()}, {"violations", report.violation_count}, {"deadlock", report.deadlock},
                        {"failure", report.failure}, {"steps", report.steps}, {"seconds", seconds}};
  nlohmann::json ranks = nlohmann::json::array();
  for (const Totals& t : report.ranks) {
    ranks.push_back({{"batches", t.batches}, {"layers", t.layers}, {"barriers", t.barriers}, {"collectives", t.collectives},
                     {"overflows", t.overflows}, {"mismatches", t.mismatches}, {"bytes_gathered_from_peers", t.bytes_gathered_from_peers},
                     {"bytes_reduced", t.bytes_reduced}});
    if (t.counters_of_plugin != 0) {
      ranks.back()["counted_by"] = {{"bytes_gathered_from_peers", "plugin"}, {"barriers", "plugin"}, {"collectives", "cpkv"}, {"bytes_reduced", "cpkv"},
                                    {"service_barriers", "cpkv"}, {"model_bytes_gathered_from_peers", "model"}};
      ranks.back()["service_barriers"] = t.service_barriers;
      ranks.back()["model_bytes_gathered_from_peers"] = t.model_bytes_gathered_from_peers;
    }
  }
  run["ranks"] = ranks;
  nlohmann::json violations = nlohmann::json::array();
  for (const Violation& v : report.violations) violations.push_back(describe(v));
  run["violation_details"] = violations;
  // Every violation counted by its invariant (kept or not: violation_details holds the first few).
  nlohmann::json by_invariant = nlohmann::json::object();
  for (std::int32_t i = 1; i <= kInvariants; ++i) by_invariant[std::to_string(i)] = report.violations_by_invariant[i];
  run["violations_by_invariant"] = by_invariant;
  return run;
}

}  // namespace cpkv::harness

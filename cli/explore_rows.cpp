#include "explore_rows.hpp"

#include <algorithm>
#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>

#include "cpkv/harness/mutants.hpp"
#include "cpkv/harness/run.hpp"
#include "cpkv/properties/properties.hpp"

namespace cpkv::cli {

std::size_t explore_units(std::int32_t cp_max, std::int32_t layers_max, bool shapes, bool check_reduction, const CheckFilter& filter) {
  std::size_t units = static_cast<std::size_t>(cp_max) * static_cast<std::size_t>(layers_max) + 3;
  const std::size_t mutants = std::size(harness::kAllMutants);
  if (shapes) {
    for (std::int32_t cp = 1; cp <= cp_max; ++cp) units += properties::exploration_shapes(cp).size();
    units += mutants;
  }
  if (check_reduction) {
    for (std::int32_t cp = 1; cp <= std::min(4, cp_max); ++cp) {
      for (const properties::ExploreShape& s : properties::exploration_shapes(cp)) units += filter.selected(cp, s.name) ? filter.mutants(mutants + 1) : 0;
    }
  }
  return units;
}

ExploreCounterexample keep_explore_counterexample(const properties::ExploreOptions& options, const properties::ExploreResult& r, const std::string& stem) {
  ExploreCounterexample kept;
  if (!r.found) return kept;
  properties::Case c;
  c.setting = options.setting;
  c.batches = options.batches;
  c.variant = options.variant;
  c.layers = options.layers;
  c.schedule = r.schedule;
  c.ipc_missing_rank = options.ipc_missing_rank;
  c.seed = harness::RunOptions{}.seed;  // the explorer's content seed
  const std::string folder = properties::counterexample_folder();
  try {
    kept.replay = properties::write_replay(c, options.mutant, folder, stem);
  } catch (const std::runtime_error& e) {
    kept.replay = fmt::format("none (the counterexample was not written: {})", e.what());
  }
  const std::string timeline = (std::filesystem::path(folder) / (stem + ".timeline.json")).string();
  try {
    properties::write_timeline(c, options.mutant, timeline);
    kept.timeline = timeline;
  } catch (const std::runtime_error& e) {
    kept.timeline_error = e.what();
  }
  return kept;
}

std::string counterexample_lines(const ExploreCounterexample& kept) {
  if (kept.replay.empty()) return "";
  std::string lines = fmt::format("    replay: {}\n", kept.replay);
  if (!kept.timeline.empty()) lines += fmt::format("    timeline: {}\n", kept.timeline);
  if (!kept.timeline_error.empty()) lines += fmt::format("    timeline: none (not written: {})\n", kept.timeline_error);
  return lines;
}

nlohmann::json explore_row(const std::string& section, const std::string& name, const properties::ExploreResult& r, bool passed,
                           const std::string& text, const std::string& replay) {
  nlohmann::json row = {{"section", section}, {"name", name},       {"passed", passed},     {"text", text},
                        {"states", r.states}, {"transitions", r.transitions}, {"complete", r.complete}, {"found", r.found},
                        {"finding", r.finding}, {"schedule", r.schedule}, {"seconds", r.seconds}};
  row["replay"] = replay.empty() ? nlohmann::json(nullptr) : nlohmann::json(replay);
  if (!passed) row["failure"] = r.found ? fmt::format("found {}", r.finding) : r.complete ? "proved: the planted bug was not found" : "incomplete (limit reached)";
  return row;
}

}  // namespace cpkv::cli

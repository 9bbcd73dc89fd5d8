// `cpkv explore`'s units for --shard (cli/shard_rows.hpp), in the order its tables print them, and
// what a found counterexample leaves behind: its trace and schedule, which `cpkv replay --schedule`
// runs again (in --out DIR, or the private per-run folder in $TMPDIR).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "cpkv/properties/explorer.hpp"

namespace cpkv::cli {

// The explorations of a run: the grid (cp 1..cp_max x layers 1..layers_max), the three planted bugs
// at cp 2, then, with the shapes, every shape of cp 1..cp_top and one hunt per planted bug.
std::size_t explore_units(std::int32_t cp_max, std::int32_t layers_max, bool shapes, std::int32_t cp_top);

// Writes a found exploration's batches and schedule as `stem`.jsonl and `stem`.schedule in
// properties::counterexample_folder(), and its timeline beside them (`stem`.timeline.json, the
// replayed schedule's steps: docs/event-log.md); returns the `cpkv replay` line, or "none (why)"
// when it could not be written. An exploration that found nothing writes nothing and returns "".
std::string keep_explore_counterexample(const properties::ExploreOptions& options, const properties::ExploreResult& r, const std::string& stem);
std::string explore_timeline_path(const std::string& stem);
// The lines printed under a row: "    replay: ..." and "    timeline: PATH" (when it was written).
std::string counterexample_lines(const std::string& replay, const std::string& stem);

// A row of the --json file: the exploration's counts and outcome, `passed` (as expected: a proof
// for the correct protocol, a finding for a planted bug) and the line printed.
nlohmann::json explore_row(const std::string& section, const std::string& name, const properties::ExploreResult& r, bool passed,
                           const std::string& text, const std::string& replay);

}  // namespace cpkv::cli

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
// at cp 2, then, with the shapes, every shape of cp 1..cp_max and one hunt per planted bug, then,
// with --check-reduction, one comparison per shape of cp 1..min(4, cp_max) and per mutant (none first),
// only those check_selected keeps.
struct CheckFilter {
  std::int32_t cp = 0;   // --check-cp: 0 for every cp
  std::string shape;     // --check-shape: "" for every shape
  std::string mutant;    // --check-mutant: "" for none and every planted bug
  bool selected(std::int32_t at_cp, const std::string& name) const { return (cp == 0 || cp == at_cp) && (shape.empty() || shape == name); }
  std::size_t mutants(std::size_t all) const { return mutant.empty() ? all : 1; }
};
std::size_t explore_units(std::int32_t cp_max, std::int32_t layers_max, bool shapes, bool check_reduction, const CheckFilter& filter = {});

// What a found exploration left behind: the `cpkv replay` line of its batches and schedule, and its
// timeline (the replayed schedule's steps: docs/event-log.md). Each is written or says why not, on
// its own: a timeline that could not be written leaves the replay that was.
struct ExploreCounterexample {
  std::string replay;          // the replay line, "none (why)" when not written; "" when nothing was found
  std::string timeline;        // the timeline's path once written, "" otherwise
  std::string timeline_error;  // why the timeline was not written, "" when it was (or nothing was found)
};

// Writes a found exploration's batches and schedule as `stem`.jsonl and `stem`.schedule in
// properties::counterexample_folder() (in --out DIR, or the private per-run folder in $TMPDIR), and
// its timeline beside them (`stem`.timeline.json). An exploration that found nothing writes nothing.
ExploreCounterexample keep_explore_counterexample(const properties::ExploreOptions& options, const properties::ExploreResult& r, const std::string& stem);
// The lines printed under a row: "    replay: ..." and "    timeline: PATH" (or why it is missing),
// nothing when nothing was found.
std::string counterexample_lines(const ExploreCounterexample& kept);

// A row of the --json file: the exploration's counts and outcome, `passed` (as expected: a proof
// for the correct protocol, a finding for a planted bug) and the line printed.
nlohmann::json explore_row(const std::string& section, const std::string& name, const properties::ExploreResult& r, bool passed,
                           const std::string& text, const std::string& replay);

}  // namespace cpkv::cli

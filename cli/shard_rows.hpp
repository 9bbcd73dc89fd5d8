// The shards of `cpkv soak` and `cpkv explore` (docs/sharding.md): a run's units (soak: its seeds, in
// the order the master seed draws them; explore: its explorations, in the order its tables print
// them) are numbered from 0 and unit i is run by shard i % N + 1 (K 1-based, as `cpkv mutants
// --shard`). Each unit a shard runs is a row of its --json file; `cpkv merge` folds the shards' files
// into the rows of the unsharded run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "mutants_report.hpp"

namespace cpkv::cli {

struct ShardedRun {
  std::string command;               // "soak" or "explore"
  Shard shard;                       // {1, 1}: unsharded
  nlohmann::json asked;              // the options that decide the units and their results (merge compares them)
  std::optional<std::size_t> units;  // the whole run's units (none: a soak bounded by time only)
  std::vector<nlohmann::json> rows;  // each: row, section, name, passed, text, seconds, failure (when not passed)
  std::size_t next = 0;              // the next unit's number

  // Numbers the next unit; true when it is this shard's to run.
  bool take();
  // Adds the result of the unit take() numbered last: `row` holds section, name, passed, text and
  // seconds (and failure when not passed); "row" is set here.
  void add(nlohmann::json row);
  bool passed() const;
  // " | shard K/N: units i, i+N, ... of U" when sharded, else "".
  std::string header() const;
};

// --shard for a run of `units` units (none: unbounded) into a ShardedRun of `command`; no --shard: 1/1.
ShardedRun sharded_run(const std::string& command, const std::optional<std::string>& shard, std::optional<std::size_t> units,
                       nlohmann::json asked);

// {"cpkv_shards": 1, "command", "asked", "units", "shard": {"k", "n"}, "rows"}.
std::string sharded_json(const ShardedRun& run);
// One testcase per row, a failure for a row that did not pass.
std::string sharded_junit(const ShardedRun& run);

// `cpkv merge` of `cpkv soak` / `cpkv explore` --json files (already parsed; `names` as the user gave
// them): refuses another command, other options or N, a unit in two files or not its shard's, a
// shard twice or missing, units in no file; prints the rows in order under their sections, then a
// summary. Returns the merged run (the exit status: 1 if a row failed).
ShardedRun merge_sharded(const std::vector<std::string>& names, const std::vector<nlohmann::json>& files);
void print_sharded_rows(const ShardedRun& run);

// The fields of a shard file, read strictly (issue 34, item 10: row 1.5 was taken as row 1, 2^64 as
// row 0, negative seconds printed, a number where a string belongs a raw json.exception). Each
// throws OptionError "<where> is <what it is>, not <what it must be>"; `where` names the file and
// the field.
const nlohmann::json& member(const nlohmann::json& object, const char* key, const std::string& where);
std::uint64_t whole_number(const nlohmann::json& value, const std::string& where, std::uint64_t max);  // an integer in [0, max], never a float
double seconds_value(const nlohmann::json& value, const std::string& where);                          // finite, >= 0
std::string text_value(const nlohmann::json& value, const std::string& where);
bool flag_value(const nlohmann::json& value, const std::string& where);
std::string json_kind(const nlohmann::json& value);  // "the number 1.5", "a string", "an object", ...

// A shard file's multi-line text for the terminal (issue 34, item 11): control characters other
// than the newline written \xNN (no escape sequence reaches the terminal), and a line that starts
// at the margin indented by two spaces, so that no line from a file can pass for cpkv's own.
std::string printable_text(std::string_view text);

}  // namespace cpkv::cli

// cpkv merge: folds the --json files of `cpkv mutants --shard K/N` runs into the one table
// `cpkv mutants` prints, refusing files of different runs and overlapping or missing rows.
#include <algorithm>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "files.hpp"
#include "mutants_report.hpp"
#include "shard_rows.hpp"

namespace cpkv::cli {
namespace {

struct MergeOptions {
  std::vector<std::string> paths;
  std::optional<std::string> junit_path;
};

// One shard file, read and checked on its own.
struct ShardFile {
  std::string name;
  MutantsRun run;
  std::size_t suite_rows = 0;
  nlohmann::json json;
};

// A shard file is a few KiB (mutants) to a few tens of MiB (a soak shard of 100,000 seeds); past
// this it is no shard file (issue 34, item 13: a 300 MiB string cost 1.5 GB). Its nesting is 4
// levels; 64 leaves room and is far below what overflows the stack (item 4: 200,000 deep crashed).
constexpr std::size_t kShardFileBytesMax = std::size_t{64} << 20;
constexpr std::size_t kShardFileDepthMax = 64;

// A shard file's JSON, read with bounds (files.hpp read_json_input), or one line naming it.
nlohmann::json parse_file(const InputFile& input) {
  return read_json_input(input, "cpkv merge", JsonLimits{kShardFileBytesMax, kShardFileDepthMax, /*unique_keys=*/true});
}

ShardFile read_shard_file(const InputFile& input, nlohmann::json json) {
  const std::string& path = input.name();
  ShardFile file{path, {}, 0, std::move(json)};
  const nlohmann::json& j = file.json;
  if (!j.is_object() || !j.contains("cpkv_mutants") || j.at("cpkv_mutants") != 1) {
    throw OptionError(fmt::format("{}: no \"cpkv_mutants\": 1 (not a `cpkv mutants --json` file)", path));
  }
  const auto at = [&](const char* key) -> const nlohmann::json& { return member(j, key, path); };
  const auto where = [&](const char* key) { return fmt::format("{}: \"{}\"", path, key); };
  file.run.seed = whole_number(at("seed"), where("seed"), UINT64_MAX);
  file.run.cases = static_cast<int>(whole_number(at("cases"), where("cases"), INT32_MAX));
  file.run.every_property = flag_value(at("every_property"), where("every_property"));
  file.suite_rows = whole_number(at("suite_rows"), where("suite_rows"), SIZE_MAX);
  const nlohmann::json& shard = at("shard");
  file.run.shard = Shard{whole_number(member(shard, "k", where("shard")), where("shard") + " k", SIZE_MAX),
                         whole_number(member(shard, "n", where("shard")), where("shard") + " n", SIZE_MAX)};
  if (!at("rows").is_array()) throw OptionError(fmt::format("{} is {}, not an array", where("rows"), json_kind(at("rows"))));
  const std::size_t rows = properties::suite_rows().size();
  if (file.suite_rows != rows) throw OptionError(fmt::format("{}: {} suite rows, but this cpkv has {} (another build's file)", path, file.suite_rows, rows));
  const Shard& s = *file.run.shard;
  if (s.n < 1 || s.k < 1 || s.k > s.n) throw OptionError(fmt::format("{}: shard {}/{} is no shard (K is 1..N)", path, s.k, s.n));
  return file;
}

// Refuses a file of another run than the first: another seed, case count, --every-property or N.
void refuse_other_run(const ShardFile& first, const ShardFile& file) {
  const MutantsRun& a = first.run;
  const MutantsRun& b = file.run;
  const auto refuse = [&](const std::string& what, const std::string& theirs, const std::string& ours) {
    throw OptionError(fmt::format("{}: {} {}, but {} has {} {} (shards of one run only)", file.name, what, theirs, first.name, what, ours));
  };
  if (a.seed != b.seed) refuse("seed", std::to_string(b.seed), std::to_string(a.seed));
  if (a.cases != b.cases) refuse("cases", std::to_string(b.cases), std::to_string(a.cases));
  if (a.every_property != b.every_property) refuse("every_property", b.every_property ? "on" : "off", a.every_property ? "on" : "off");
  if (a.shard->n != b.shard->n) refuse("N", std::to_string(b.shard->n), std::to_string(a.shard->n));
}

// A merged row: its file, the row and, for `none`, that file's coverage.
struct MergedRow {
  std::string file;
  properties::MutantRow row;
  nlohmann::json coverage;
};

// The coverage of the file that ran `none`, checked before anything is printed: it is judged where
// `none` ran, and a file without it cannot say the targets were met.
nlohmann::json checked_coverage(const ShardFile& file) {
  const nlohmann::json coverage = file.json.value("coverage", nlohmann::json(nullptr));
  const bool has = coverage.is_object() && coverage.contains("table") && coverage.contains("missed");
  if (!has) throw OptionError(fmt::format("{}: the row none has no \"coverage\" (table and missed)", file.name));
  (void)text_value(coverage.at("table"), file.name + ": \"coverage\" table");
  if (!coverage.at("missed").is_array()) throw OptionError(fmt::format("{}: \"coverage\" missed is {}, not an array", file.name, json_kind(coverage.at("missed"))));
  return coverage;
}

// Adds one file's rows to `rows`, refusing a row that is not its shard's or that another file holds.
void take_rows(const ShardFile& file, std::map<std::size_t, MergedRow>& rows) {
  const std::vector<harness::Mutant> all = properties::suite_rows();
  const Shard& shard = *file.run.shard;
  const nlohmann::json& entries = file.json.at("rows");
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const nlohmann::json& entry = entries[i];
    properties::MutantRow row;
    std::size_t index = 0;
    try {
      row = mutant_row_from_json(entry);
    } catch (const std::exception& e) {
      throw OptionError(fmt::format("{}: rows[{}]: {}", file.name, i, e.what()));
    }
    index = whole_number(member(entry, "row", fmt::format("{}: rows[{}]", file.name, i)), fmt::format("{}: rows[{}] \"row\"", file.name, i), SIZE_MAX);
    if (index >= all.size() || all[index] != row.mutant) {
      throw OptionError(fmt::format("{}: row {} is {}, which this cpkv's suite does not hold there", file.name, index, harness::to_string(row.mutant)));
    }
    if (index % shard.n != shard.k - 1) throw OptionError(fmt::format("{}: row {} is not shard {}/{}'s", file.name, index, shard.k, shard.n));
    const auto [at, added] = rows.emplace(index, MergedRow{file.name, row, nullptr});
    if (!added) throw OptionError(fmt::format("{}: row {} ({}) is also in {} (overlapping shards)", file.name, index, harness::to_string(row.mutant), at->second.file));
    if (row.mutant == harness::Mutant::none) at->second.coverage = checked_coverage(file);
  }
}

void refuse_missing(const std::map<std::size_t, MergedRow>& rows, std::size_t n) {
  const std::vector<harness::Mutant> all = properties::suite_rows();
  std::vector<std::string> missing;
  std::vector<std::size_t> shards;
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (rows.count(i) != 0) continue;
    missing.push_back(fmt::format("{} ({})", i, harness::to_string(all[i])));
    if (shards.empty() || shards.back() != i % n + 1) shards.push_back(i % n + 1);
  }
  if (missing.empty()) return;
  std::sort(shards.begin(), shards.end());
  shards.erase(std::unique(shards.begin(), shards.end()), shards.end());
  throw OptionError(fmt::format("rows {} are in no file: shard {} of {} missing", fmt::join(missing, ", "), fmt::join(shards, ", "), n));
}

// The rows of `cpkv soak` or `cpkv explore` shards in the unsharded run's order, then a summary.
void merge_soak_or_explore(const std::vector<std::string>& names, const std::vector<nlohmann::json>& parsed, OutputFile* junit) {
  const ShardedRun merged = merge_sharded(names, parsed);
  fmt::print("cpkv merge: cpkv {} | {} | {} files\n", merged.command, merged.asked.dump(), names.size());
  print_sharded_rows(merged);
  std::size_t failed = 0;
  for (const nlohmann::json& row : merged.rows) failed += row.at("passed").get<bool>() ? 0 : 1;
  fmt::print("merged: {} units, {} passed, {} failed\n", merged.rows.size(), merged.rows.size() - failed, failed);
  exit_status() = failed == 0 ? kExitOk : kExitFailure;
  if (junit != nullptr) junit->write(sharded_junit(merged));
}

void run_merge(const MergeOptions& o) {
  std::unique_ptr<OutputFile> junit = o.junit_path ? std::make_unique<OutputFile>("--junit", *o.junit_path) : nullptr;
  std::vector<std::unique_ptr<InputFile>> inputs;
  for (const std::string& path : o.paths) inputs.push_back(std::make_unique<InputFile>("FILE", path));
  std::vector<const InputFile*> checked;
  for (const auto& input : inputs) checked.push_back(input.get());
  refuse_same_files(checked, {junit.get()});
  std::vector<nlohmann::json> parsed;
  std::vector<std::string> names;
  for (const auto& input : inputs) {
    parsed.push_back(parse_file(*input));
    names.push_back(input->name());
  }
  if (parsed.front().is_object() && parsed.front().contains("cpkv_shards")) {  // cpkv soak or explore (cli/shard_rows.hpp)
    merge_soak_or_explore(names, parsed, junit.get());
    return;
  }
  std::vector<ShardFile> files;
  for (std::size_t i = 0; i < inputs.size(); ++i) files.push_back(read_shard_file(*inputs[i], std::move(parsed[i])));
  std::map<std::size_t, MergedRow> merged;
  for (const ShardFile& file : files) {
    refuse_other_run(files.front(), file);
    take_rows(file, merged);
  }
  refuse_missing(merged, files.front().run.shard->n);
  MutantsRun run = files.front().run;
  run.shard.reset();  // the merged table is the whole suite's
  print_mutants_header(run);
  MutantsTally tally;
  std::vector<properties::MutantRow> rows;
  for (const auto& [index, entry] : merged) {
    print_mutant_row(entry.row);
    tally.add(entry.row);
    rows.push_back(entry.row);
    if (entry.row.mutant != harness::Mutant::none) continue;
    fmt::print("{}", printable_text(entry.coverage.at("table").get<std::string>()));
    tally.coverage_met = entry.coverage.at("missed").empty();
  }
  exit_status() = print_mutants_summary(tally);
  if (junit) junit->write(mutants_junit(run, rows, tally));
}

}  // namespace

void register_merge(CLI::App& app) {
  auto o = std::make_shared<MergeOptions>();
  CLI::App* cmd = app.add_subcommand("merge",
                                     "Fold the --json files of `cpkv mutants --shard K/N` runs (every K of one N, one seed) into the table "
                                     "`cpkv mutants` prints, or those of `cpkv soak` or `cpkv explore` shards into the unsharded run's rows; "
                                     "exit 1 if a merged row failed.");
  cmd->add_option("FILE", o->paths, "the shard files (cpkv mutants, soak or explore --json)")->required();
  cmd->add_option("--junit", o->junit_path, "write a JUnit XML report of the merged rows: one testcase per row");
  cmd->callback([o] { run_merge(*o); });
}

}  // namespace cpkv::cli

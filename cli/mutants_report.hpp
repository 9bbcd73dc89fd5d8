// The table `cpkv mutants` prints, its shards (--shard K/N) and its JSON (--json), shared by
// `cpkv mutants` and `cpkv merge`, which folds shard files back into the one table.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cpkv/properties/mutation.hpp"

namespace cpkv::cli {

// --shard K/N: K is 1-based (1 <= K <= N), N at most the suite's rows; the shard holds the rows i
// (properties::suite_rows) with i % N == K - 1.
struct Shard {
  std::size_t k = 1;
  std::size_t n = 1;
};
// Throws OptionError ("--shard ...: ...", exit 2) for anything but K/N in range.
Shard parse_shard(const std::string& text);
// The same for a run of `rows` units (`rows_what` names them in the error: "the seeds").
Shard parse_shard(const std::string& text, std::size_t rows, std::string_view rows_what);
// Text for an XML attribute or element: & < > " escaped, control characters but newline and tab blanked.
std::string xml_escaped(std::string_view text);
// "rows 0, 3, 6 (none, rank_local_overflow, ...)".
std::string shard_rows_text(const Shard& shard);

// What a run was asked: printed in the header, kept in the JSON, compared by merge.
struct MutantsRun {
  std::uint64_t seed = 0;
  int cases = 0;
  bool every_property = false;
  std::optional<Shard> shard;  // none: every row
};

void print_mutants_header(const MutantsRun& run);
void print_mutant_row(const properties::MutantRow& row);

// The tally of a table: planted bugs caught, and, where the table holds `none`, whether the correct
// protocol passed and met its coverage targets.
struct MutantsTally {
  std::int32_t caught = 0;
  std::int32_t planted = 0;
  std::optional<bool> clean_passes;  // set by the row `none`
  std::optional<bool> coverage_met;
  void add(const properties::MutantRow& row);
  bool passed() const;
};
// The last line; returns the exit status the tally wants (0 or 1).
int print_mutants_summary(const MutantsTally& tally);

// One row of the JSON: mutant, caught, first property, invariant, counterexample size, seconds,
// replay line (null where there is none), the other properties that caught it, and the row's index.
nlohmann::json mutant_row_json(std::size_t index, const properties::MutantRow& row);
// The row back from its JSON; throws std::runtime_error naming the field that is missing or wrong.
properties::MutantRow mutant_row_from_json(const nlohmann::json& row);

// A JUnit XML report: one testcase per row, a failure for a planted bug not caught or a `none` that
// failed a property or missed a coverage target.
std::string mutants_junit(const MutantsRun& run, const std::vector<properties::MutantRow>& rows, const MutantsTally& tally);

}  // namespace cpkv::cli

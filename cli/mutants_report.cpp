#include "mutants_report.hpp"

#include <charconv>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "commands.hpp"
#include "files.hpp"
#include "shard_rows.hpp"

namespace cpkv::cli {

namespace {

std::optional<std::size_t> whole(std::string_view text) {
  std::size_t value = 0;
  const auto [stop, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || stop != text.data() + text.size()) return std::nullopt;
  return value;
}

// The invariant column: the one that fired in the catching property ("-" when not caught).
std::string invariant_cell(const properties::MutantRow& row) {
  return row.caught && row.invariant > 0 ? std::to_string(row.invariant) : "-";
}

// A JSON field of `row` of the given type, or a runtime_error naming it.
template <typename T>
T field(const nlohmann::json& row, const char* name) {
  if (!row.contains(name)) throw std::runtime_error(fmt::format("a row has no \"{}\"", name));
  try {
    return row.at(name).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw std::runtime_error(fmt::format("a row's \"{}\" is {}", name, row.at(name).dump()));
  }
}

}  // namespace

std::string xml_escaped(std::string_view text) {
  std::string out;
  for (char ch : text) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += static_cast<unsigned char>(ch) < 0x20 && ch != '\n' && ch != '\t' ? ' ' : ch;
    }
  }
  return out;
}

Shard parse_shard(const std::string& text) { return parse_shard(text, properties::suite_rows().size(), "the suite's rows"); }

Shard parse_shard(const std::string& text, std::size_t rows, std::string_view rows_what) {
  const std::size_t slash = text.find('/');
  const auto k = slash == std::string::npos ? std::nullopt : whole(std::string_view(text).substr(0, slash));
  const auto n = slash == std::string::npos ? std::nullopt : whole(std::string_view(text).substr(slash + 1));
  if (!k || !n) throw OptionError(fmt::format("--shard: '{}' is not K/N (whole numbers, K 1-based: 1/3, 2/3, 3/3)", text));
  if (*n < 1 || *n > rows) throw OptionError(fmt::format("--shard {}: N is outside 1..{} ({})", text, rows, rows_what));
  if (*k < 1 || *k > *n) throw OptionError(fmt::format("--shard {}: K is outside 1..{} (K is 1-based)", text, *n));
  return Shard{*k, *n};
}

std::string shard_rows_text(const Shard& shard) {
  const std::vector<harness::Mutant> all = properties::suite_rows();
  std::vector<std::string> names;
  const std::vector<std::size_t> rows = properties::shard_rows(shard.k, shard.n);
  for (std::size_t i : rows) names.emplace_back(harness::to_string(all[i]));
  return fmt::format("rows {} ({})", fmt::join(rows, ", "), fmt::join(names, ", "));
}

void print_mutants_header(const MutantsRun& run) {
  fmt::print("cpkv mutants: property suite against every planted bug | seed {} | {} cases per property", run.seed, run.cases);
  if (run.shard) fmt::print(" | shard {}/{}: {} of {}", run.shard->k, run.shard->n, shard_rows_text(*run.shard), properties::suite_rows().size());
  fmt::print("\n{:<26} {:<8} {:<28} {:>9} {:>9} {:>9}\n", "mutant", "caught", "first by property", "invariant", "cex size", "s to catch");
}

void print_mutant_row(const properties::MutantRow& row) {
  const bool none = row.mutant == harness::Mutant::none;
  const std::string name = none ? "none (correct protocol)" : std::string(harness::to_string(row.mutant));
  const std::string verdict = none ? (row.caught ? "FAILED" : "passes") : (row.caught ? "yes" : "NO");
  fmt::print("{:<26} {:<8} {:<28} {:>9} {:>9} {:>9.2f}\n", name, verdict, row.caught ? row.caught_by : "-", invariant_cell(row),
             row.caught ? std::to_string(row.counterexample_size) : "-", row.seconds);
  if (!row.also_caught_by.empty()) fmt::print("    also caught by: {}\n", fmt::join(row.also_caught_by, ", "));
  // A failure that came through no invariant check (an exception in the body) records no case:
  // say so, with RapidCheck's first line, rather than print an empty or another row's line.
  const std::string why = row.message.substr(0, row.message.find('\n'));
  if (row.caught) fmt::print("    replay: {}\n", row.replay.empty() ? "none (no counterexample was recorded: " + why + ")" : row.replay);
  if (row.caught && !row.timeline.empty()) fmt::print("    timeline: {}\n", row.timeline);
}

void MutantsTally::add(const properties::MutantRow& row) {
  if (row.mutant == harness::Mutant::none) {
    clean_passes = !row.caught;
    return;
  }
  ++planted;
  caught += row.caught ? 1 : 0;
}

bool MutantsTally::passed() const { return caught == planted && clean_passes.value_or(true) && coverage_met.value_or(true); }

int print_mutants_summary(const MutantsTally& tally) {
  fmt::print("caught {} of {} planted bugs ({:.0f}%)", tally.caught, tally.planted, tally.planted ? 100.0 * tally.caught / tally.planted : 0.0);
  if (tally.clean_passes) fmt::print("; correct protocol {}", *tally.clean_passes ? "passes every property" : "FAILS a property");
  if (tally.coverage_met) fmt::print("; coverage targets {}", *tally.coverage_met ? "met" : "MISSED");
  if (!tally.clean_passes) fmt::print("; correct protocol and coverage not in this shard");
  fmt::print("\n");
  return tally.passed() ? kExitOk : kExitFailure;
}

nlohmann::json mutant_row_json(std::size_t index, const properties::MutantRow& row) {
  auto or_null = [&](auto value) { return row.caught ? nlohmann::json(value) : nlohmann::json(nullptr); };
  return {{"row", index},
          {"mutant", std::string(harness::to_string(row.mutant))},
          {"caught", row.caught},
          {"first_property", or_null(row.caught_by)},
          {"invariant", row.caught && row.invariant > 0 ? nlohmann::json(row.invariant) : nlohmann::json(nullptr)},
          {"counterexample_size", or_null(row.counterexample_size)},
          {"seconds", row.seconds},
          {"replay", row.caught && !row.replay.empty() ? nlohmann::json(row.replay) : nlohmann::json(nullptr)},
          {"message", row.message.substr(0, row.message.find('\n'))},
          {"also_caught_by", row.also_caught_by}};
}

// Every field checked as shard_rows.hpp reads a shard file's (issue 34, item 10), and every text
// made printable (item 11: a row's message is printed in the table).
properties::MutantRow mutant_row_from_json(const nlohmann::json& json) {
  if (!json.is_object()) throw std::runtime_error(fmt::format("a row is {}, not an object", json_kind(json)));
  const auto at = [&](const char* key) -> const nlohmann::json& { return member(json, key, "a row"); };
  const auto where = [](const char* key) { return fmt::format("a row's \"{}\"", key); };
  properties::MutantRow row;
  const std::string name = text_value(at("mutant"), where("mutant"));
  const std::optional<harness::Mutant> mutant = harness::parse_mutant(name);
  if (!mutant) throw std::runtime_error(fmt::format("a row's mutant '{}' is no planted bug of this build", printable_line(name)));
  row.mutant = *mutant;
  row.caught = flag_value(at("caught"), where("caught"));
  row.seconds = seconds_value(at("seconds"), where("seconds"));
  row.message = printable_text(text_value(at("message"), where("message")));
  const nlohmann::json& also = at("also_caught_by");
  if (!also.is_array()) throw std::runtime_error(fmt::format("a row's \"also_caught_by\" is {}, not an array", json_kind(also)));
  for (const nlohmann::json& property : also) row.also_caught_by.push_back(printable_line(text_value(property, where("also_caught_by"))));
  if (!row.caught) return row;
  row.caught_by = printable_line(text_value(at("first_property"), where("first_property")));
  row.invariant = at("invariant").is_null() ? 0 : static_cast<std::int32_t>(whole_number(at("invariant"), where("invariant"), harness::kInvariants));
  row.counterexample_size = static_cast<std::int64_t>(whole_number(at("counterexample_size"), where("counterexample_size"), INT64_MAX));
  row.replay = at("replay").is_null() ? "" : printable_line(text_value(at("replay"), where("replay")));
  return row;
}

std::string mutants_junit(const MutantsRun& run, const std::vector<properties::MutantRow>& rows, const MutantsTally& tally) {
  std::string cases;
  std::int32_t failures = 0;
  double seconds = 0;
  for (const properties::MutantRow& row : rows) {
    const bool none = row.mutant == harness::Mutant::none;
    std::string failure;
    if (none && row.caught) failure = fmt::format("the correct protocol fails {}: {}", row.caught_by, row.message.substr(0, row.message.find('\n')));
    if (none && !row.caught && !tally.coverage_met.value_or(true)) failure = "the correct protocol's cases missed a coverage target";
    if (!none && !row.caught) failure = "no property caught this planted bug";
    failures += failure.empty() ? 0 : 1;
    seconds += row.seconds;
    cases += fmt::format("    <testcase classname=\"cpkv.mutants\" name=\"{}\" time=\"{:.3f}\">\n", harness::to_string(row.mutant), row.seconds);
    if (!failure.empty()) cases += fmt::format("      <failure message=\"{}\"/>\n", xml_escaped(failure));
    if (row.caught) cases += fmt::format("      <system-out>{} (invariant {}): {}</system-out>\n", xml_escaped(row.caught_by), row.invariant,
                                         xml_escaped(row.replay.empty() ? "no counterexample recorded" : row.replay));
    cases += "    </testcase>\n";
  }
  const std::string shard = run.shard ? fmt::format(" shard {}/{}", run.shard->k, run.shard->n) : "";
  return fmt::format("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites>\n  <testsuite name=\"cpkv mutants seed {} cases {}{}\" tests=\"{}\" "
                     "failures=\"{}\" errors=\"0\" time=\"{:.3f}\">\n{}  </testsuite>\n</testsuites>\n",
                     run.seed, run.cases, shard, rows.size(), failures, seconds, cases);
}

}  // namespace cpkv::cli

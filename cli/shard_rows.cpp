#include "shard_rows.hpp"

#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "commands.hpp"
#include "files.hpp"

namespace cpkv::cli {

namespace {

constexpr std::size_t kUnboundedShardsMax = 100000;  // N's bound where the run's units are not counted in advance
constexpr std::uint64_t kUnitsMax = std::uint64_t{1} << 53;  // past this a JSON number is no exact integer in most readers

// A field of a shard file, or an OptionError naming the file and the field.
const nlohmann::json& field(const std::string& name, const nlohmann::json& json, const char* key) {
  if (!json.is_object() || !json.contains(key)) throw OptionError(fmt::format("{}: no \"{}\" (not a `cpkv soak` or `cpkv explore` --json file)", name, key));
  return json.at(key);
}

// One row, every field checked (issue 34, item 10): its unit number a whole number below the run's
// units, the texts strings, the time a non-negative number.
nlohmann::json checked_row(const std::string& name, const nlohmann::json& row, std::size_t i, std::uint64_t units_max) {
  const std::string where = fmt::format("{}: rows[{}]", name, i);
  if (!row.is_object()) throw OptionError(fmt::format("{} is {}, not an object", where, json_kind(row)));
  (void)whole_number(member(row, "row", where), where + " \"row\"", units_max);
  (void)flag_value(member(row, "passed", where), where + " \"passed\"");
  (void)text_value(member(row, "text", where), where + " \"text\"");
  for (const char* key : {"section", "name", "failure"}) {
    if (row.contains(key)) (void)text_value(row.at(key), fmt::format("{} \"{}\"", where, key));
  }
  if (row.contains("seconds")) (void)seconds_value(row.at("seconds"), where + " \"seconds\"");
  return row;
}

ShardedRun read_sharded(const std::string& name, const nlohmann::json& json) {
  if (field(name, json, "cpkv_shards") != 1) throw OptionError(fmt::format("{}: \"cpkv_shards\" is not 1 (another format version)", name));
  ShardedRun run;
  run.command = text_value(field(name, json, "command"), name + ": \"command\"");
  if (run.command != "soak" && run.command != "explore") throw OptionError(fmt::format("{}: \"command\" is '{}', not soak or explore", name, printable_line(run.command)));
  run.asked = field(name, json, "asked");
  if (!run.asked.is_object()) throw OptionError(fmt::format("{}: \"asked\" is {}, not an object", name, json_kind(run.asked)));
  const nlohmann::json& units = field(name, json, "units");
  if (!units.is_null()) run.units = whole_number(units, name + ": \"units\"", kUnitsMax);
  const nlohmann::json& shard = field(name, json, "shard");
  const std::string where = name + ": \"shard\"";
  run.shard = Shard{whole_number(member(shard, "k", where), where + " k", kUnboundedShardsMax), whole_number(member(shard, "n", where), where + " n", kUnboundedShardsMax)};
  const nlohmann::json& rows = field(name, json, "rows");
  if (!rows.is_array()) throw OptionError(fmt::format("{}: \"rows\" is {}, not an array", name, json_kind(rows)));
  std::set<std::uint64_t> seen;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    run.rows.push_back(checked_row(name, rows[i], i, kUnitsMax));  // past the run's units: merge_sharded names it
    const std::uint64_t unit = run.rows.back().at("row").get<std::uint64_t>();
    // A unit twice in one file: the second copy was dropped unseen (a failing copy counted "0 failed").
    if (!seen.insert(unit).second) throw OptionError(fmt::format("{}: unit {} is in rows twice", name, unit));
  }
  if (run.shard.n < 1 || run.shard.k < 1 || run.shard.k > run.shard.n) throw OptionError(fmt::format("{}: shard {}/{} is no shard (K is 1..N)", name, run.shard.k, run.shard.n));
  return run;
}

// Refuses a file of another run than the first.
void refuse_other_run(const std::string& first_name, const ShardedRun& first, const std::string& name, const ShardedRun& run) {
  const auto refuse = [&](const std::string& what, const std::string& theirs, const std::string& ours) {
    throw OptionError(fmt::format("{}: {} {}, but {} has {} {} (shards of one run only)", name, what, theirs, first_name, what, ours));
  };
  if (run.command != first.command) refuse("command", run.command, first.command);
  if (run.asked != first.asked) refuse("options", run.asked.dump(), first.asked.dump());
  if (run.shard.n != first.shard.n) refuse("N", std::to_string(run.shard.n), std::to_string(first.shard.n));
  if (run.units != first.units) refuse("units", run.units ? std::to_string(*run.units) : "unbounded", first.units ? std::to_string(*first.units) : "unbounded");
}

}  // namespace

bool ShardedRun::take() { return next++ % shard.n == shard.k - 1; }

void ShardedRun::add(nlohmann::json row) {
  row["row"] = next - 1;
  rows.push_back(std::move(row));
}

bool ShardedRun::passed() const {
  for (const nlohmann::json& row : rows) {
    if (!row.at("passed").get<bool>()) return false;
  }
  return true;
}

std::string ShardedRun::header() const {
  if (shard.n == 1) return "";
  const std::string of = units ? fmt::format(" of {}", *units) : "";
  return fmt::format(" | shard {}/{}: units i with i % {} == {}{}", shard.k, shard.n, shard.n, shard.k - 1, of);
}

ShardedRun sharded_run(const std::string& command, const std::optional<std::string>& shard, std::optional<std::size_t> units, nlohmann::json asked) {
  ShardedRun run;
  run.command = command;
  run.units = units;
  run.asked = std::move(asked);
  if (shard) run.shard = parse_shard(*shard, units ? std::max<std::size_t>(*units, 1) : kUnboundedShardsMax, units ? "the run's units" : "the shards a run takes");
  return run;
}

std::string sharded_json(const ShardedRun& run) {
  nlohmann::json out = {{"cpkv_shards", 1}, {"command", run.command}, {"asked", run.asked},
                        {"units", run.units ? nlohmann::json(*run.units) : nlohmann::json(nullptr)},
                        {"shard", {{"k", run.shard.k}, {"n", run.shard.n}}}, {"rows", run.rows}};
  return out.dump(2) + "\n";
}

std::string sharded_junit(const ShardedRun& run) {
  std::string cases;
  std::size_t failures = 0;
  double seconds = 0;
  for (const nlohmann::json& row : run.rows) {
    const double s = row.value("seconds", 0.0);
    seconds += s;
    cases += fmt::format("    <testcase classname=\"cpkv.{}\" name=\"{} {}\" time=\"{:.3f}\">\n", run.command, row.at("row").get<std::size_t>(),
                         xml_escaped(row.value("name", "")), s);
    if (!row.at("passed").get<bool>()) {
      ++failures;
      cases += fmt::format("      <failure message=\"{}\"/>\n", xml_escaped(row.value("failure", "failed")));
    }
    cases += fmt::format("      <system-out>{}</system-out>\n    </testcase>\n", xml_escaped(row.at("text").get<std::string>()));
  }
  const std::string shard = run.shard.n > 1 ? fmt::format(" shard {}/{}", run.shard.k, run.shard.n) : "";
  return fmt::format("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites>\n  <testsuite name=\"cpkv {} {}{}\" tests=\"{}\" failures=\"{}\" "
                     "errors=\"0\" time=\"{:.3f}\">\n{}  </testsuite>\n</testsuites>\n",
                     run.command, xml_escaped(run.asked.dump()), shard, run.rows.size(), failures, seconds, cases);
}

void print_sharded_rows(const ShardedRun& run) {
  std::string section;
  for (const nlohmann::json& row : run.rows) {
    const std::string s = row.value("section", "");
    if (s != section) fmt::print("{}\n", printable_line(s));
    section = s;
    fmt::print("{}\n", printable_text(row.at("text").get<std::string>()));
  }
}

std::string json_kind(const nlohmann::json& value) {
  if (value.is_number()) return fmt::format("the number {}", value.dump());
  if (value.is_string()) return "a string";
  if (value.is_boolean()) return value.get<bool>() ? "true" : "false";
  return value.is_null() ? "null" : value.is_array() ? "an array" : "an object";
}

const nlohmann::json& member(const nlohmann::json& object, const char* key, const std::string& where) {
  if (!object.is_object()) throw OptionError(fmt::format("{} is {}, not an object", where, json_kind(object)));
  if (!object.contains(key)) throw OptionError(fmt::format("{} has no \"{}\"", where, key));
  return object.at(key);
}

std::uint64_t whole_number(const nlohmann::json& value, const std::string& where, std::uint64_t max) {
  // A float (1.5, 2^64 read as 1.8e19) is never taken as an integer: nlohmann's get<> would convert it.
  const bool whole = value.is_number_unsigned() || (value.is_number_integer() && value.get<std::int64_t>() >= 0);
  if (!whole || value.get<std::uint64_t>() > max) throw OptionError(fmt::format("{} is {}, not a whole number in [0, {}]", where, json_kind(value), max));
  return value.get<std::uint64_t>();
}

double seconds_value(const nlohmann::json& value, const std::string& where) {
  if (!value.is_number() || !(value.get<double>() >= 0) || !std::isfinite(value.get<double>())) {
    throw OptionError(fmt::format("{} is {}, not a non-negative number of seconds", where, json_kind(value)));
  }
  return value.get<double>();
}

std::string text_value(const nlohmann::json& value, const std::string& where) {
  if (!value.is_string()) throw OptionError(fmt::format("{} is {}, not a string", where, json_kind(value)));
  return value.get<std::string>();
}

bool flag_value(const nlohmann::json& value, const std::string& where) {
  if (!value.is_boolean()) throw OptionError(fmt::format("{} is {}, not true or false", where, json_kind(value)));
  return value.get<bool>();
}

std::string printable_text(std::string_view text) {
  std::string out;
  for (std::size_t at = 0; at < text.size(); ++at) {
    const char c = text[at];
    if (c != '\n') {
      out += printable_line(std::string_view(&c, 1));
      continue;
    }
    out += '\n';
    // A line the file starts at the margin is indented: it can never pass for cpkv's own line.
    if (at + 1 < text.size() && text[at + 1] != ' ') out += "  ";
  }
  return out;
}

ShardedRun merge_sharded(const std::vector<std::string>& names, const std::vector<nlohmann::json>& files) {
  std::vector<ShardedRun> runs;
  for (std::size_t i = 0; i < files.size(); ++i) runs.push_back(read_sharded(names[i], files[i]));
  std::map<std::size_t, std::string> shard_file;
  std::map<std::size_t, nlohmann::json> rows;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    refuse_other_run(names[0], runs[0], names[i], runs[i]);
    const Shard& s = runs[i].shard;
    if (const auto [at, added] = shard_file.emplace(s.k, names[i]); !added) throw OptionError(fmt::format("{}: shard {}/{} is also {}", names[i], s.k, s.n, at->second));
    for (const nlohmann::json& row : runs[i].rows) {
      const std::size_t index = row.at("row").get<std::size_t>();
      if (index % s.n != s.k - 1) throw OptionError(fmt::format("{}: unit {} is not shard {}/{}'s", names[i], index, s.k, s.n));
      if (runs[i].units && index >= *runs[i].units) throw OptionError(fmt::format("{}: unit {} is past the run's {} units", names[i], index, *runs[i].units));
      rows.emplace(index, row);
    }
  }
  std::vector<std::size_t> missing;
  for (std::size_t k = 1; k <= runs[0].shard.n; ++k) {
    if (shard_file.count(k) == 0) missing.push_back(k);
  }
  if (!missing.empty()) throw OptionError(fmt::format("shard {} of {} missing (every K of 1..N, one file each)", fmt::join(missing, ", "), runs[0].shard.n));
  for (std::size_t i = 0; runs[0].units && i < *runs[0].units; ++i) {
    if (rows.count(i) == 0) throw OptionError(fmt::format("unit {} is in no file (shard {} of {} stopped early?)", i, i % runs[0].shard.n + 1, runs[0].shard.n));
  }
  ShardedRun merged = runs[0];
  merged.shard = Shard{1, 1};
  merged.rows.clear();
  for (auto& [index, row] : rows) merged.rows.push_back(row);
  return merged;
}

}  // namespace cpkv::cli

#include "shard_rows.hpp"

#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "commands.hpp"

namespace cpkv::cli {

namespace {

constexpr std::size_t kUnboundedShardsMax = 100000;  // N's bound where the run's units are not counted in advance

// A field of a shard file, or an OptionError naming the file and the field.
nlohmann::json field(const std::string& name, const nlohmann::json& json, const char* key) {
  if (!json.is_object() || !json.contains(key)) throw OptionError(fmt::format("{}: no \"{}\" (not a `cpkv soak` or `cpkv explore` --json file)", name, key));
  return json.at(key);
}

ShardedRun read_sharded(const std::string& name, const nlohmann::json& json) {
  if (field(name, json, "cpkv_shards") != 1) throw OptionError(fmt::format("{}: \"cpkv_shards\" is not 1 (another format version)", name));
  ShardedRun run;
  try {
    run.command = field(name, json, "command").get<std::string>();
    run.asked = field(name, json, "asked");
    const nlohmann::json units = field(name, json, "units");
    if (!units.is_null()) run.units = units.get<std::size_t>();
    run.shard = Shard{field(name, json, "shard").at("k").get<std::size_t>(), field(name, json, "shard").at("n").get<std::size_t>()};
    for (const nlohmann::json& row : field(name, json, "rows")) {
      (void)row.at("row").get<std::size_t>();
      (void)row.at("passed").get<bool>();
      (void)row.at("text").get<std::string>();
      run.rows.push_back(row);
    }
  } catch (const nlohmann::json::exception& e) {
    throw OptionError(fmt::format("{}: {}", name, e.what()));
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
    if (s != section) fmt::print("{}\n", s);
    section = s;
    fmt::print("{}\n", row.at("text").get<std::string>());
  }
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

// cpkv mutants: the property suite against every planted bug, as a table.
#include <cstdio>

#include <fmt/format.h>

#include "commands.hpp"
#include "cpkv/properties/mutation.hpp"

namespace cpkv::cli {
namespace {

struct MutantsOptions {
  std::optional<std::uint64_t> seed;
  std::optional<int> cases;
};

void run_mutants(const MutantsOptions& o) {
  rc::detail::TestParams params = properties::suite_params();
  if (o.seed) params.seed = *o.seed;
  if (o.cases) params.maxSuccess = *o.cases;
  fmt::print("cpkv mutants: property suite against every planted bug | seed {} | {} cases per property\n", params.seed, params.maxSuccess);
  fmt::print("{:<26} {:<8} {:<28} {:>9} {:>9}\n", "mutant", "caught", "by property", "cex size", "seconds");
  std::fflush(stdout);
  std::int32_t caught = 0;
  std::int32_t planted = 0;
  bool clean_passes = true;
  properties::mutation_table(params, [&](const properties::MutantRow& row) {
    const bool none = row.mutant == sim::Mutant::none;
    if (none) {
      clean_passes = !row.caught;
      fmt::print("{:<26} {:<8} {:<28} {:>9} {:>9.2f}\n", "none (correct protocol)", row.caught ? "FAILED" : "passes", row.caught_by.empty() ? "-" : row.caught_by,
                 row.caught ? std::to_string(row.counterexample_size) : "-", row.seconds);
    } else {
      ++planted;
      caught += row.caught ? 1 : 0;
      fmt::print("{:<26} {:<8} {:<28} {:>9} {:>9.2f}\n", sim::to_string(row.mutant), row.caught ? "yes" : "NO", row.caught ? row.caught_by : "-",
                 row.caught ? std::to_string(row.counterexample_size) : "-", row.seconds);
    }
    if (row.caught) fmt::print("    replay: {}\n", row.replay);
    std::fflush(stdout);
  });
  fmt::print("caught {} of {} planted bugs ({:.0f}%); correct protocol {}\n", caught, planted, planted ? 100.0 * caught / planted : 0.0,
             clean_passes ? "passes every property" : "FAILS a property");
  exit_status() = caught == planted && clean_passes ? kExitOk : kExitFailure;
}

}  // namespace

void register_mutants(CLI::App& app) {
  auto o = std::make_shared<MutantsOptions>();
  CLI::App* cmd = app.add_subcommand("mutants",
                                     "Run the property suite against each planted bug and print which property caught it, the shrunk "
                                     "counterexample's size (requests + schedule choices) and the time to catch it. RC_PARAMS is honoured.");
  cmd->add_option("--seed", o->seed, "RapidCheck seed (default: the suite's fixed seed or RC_PARAMS)");
  cmd->add_option("--cases", o->cases, "cases per property (default: RapidCheck's max_success)")->check(CLI::PositiveNumber);
  cmd->callback([o] { run_mutants(*o); });
}

}  // namespace cpkv::cli

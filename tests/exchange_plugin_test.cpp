// The exchange plugin loader (harness/include/cpkv/harness/exchange_plugin.hpp) against real shared
// objects built from tests/plugins/stub_exchange.c, and what `cpkv replay --exchange` does with a
// bad one: every refusal is one line naming the file and what is wrong with it, exit 2, before any
// rank starts (include/cpkv/exchange_abi.h promises this; no GPU is needed for any of it).
#include <chrono>
#include <filesystem>
#include <fstream>
#include <tuple>

#include <gtest/gtest.h>

#include "cli_run.hpp"
#include "cpkv/harness/exchange_plugin.hpp"
#include "cpkv/harness/request.hpp"

namespace cpkv {
namespace {

using harness::RequestError;

std::string refusal(const std::string& path) {
  try {
    harness::load_exchange_plugin(path);
  } catch (const RequestError& e) {
    EXPECT_EQ(e.option(), "exchange");
    return e.reason();
  }
  ADD_FAILURE() << path << " was accepted";
  return "";
}

TEST(ExchangePlugin, AValidTableIsLoadedWithItsNameVariantsAndUses) {
  const auto plugin = harness::load_exchange_plugin(CPKV_STUB_ok);
  EXPECT_EQ(plugin->name, "stub");
  ASSERT_EQ(plugin->variants.size(), 2u);
  EXPECT_EQ(plugin->variants[0], model::Variant::staging_direct);
  EXPECT_EQ(plugin->variants[1], model::Variant::v2);
  EXPECT_TRUE(plugin->implements(model::Variant::v2));
  EXPECT_FALSE(plugin->implements(model::Variant::fused_ar));
  EXPECT_EQ(plugin->uses, CPKV_USES_PLAN);
  EXPECT_TRUE(plugin->mutants.empty());
  EXPECT_FALSE(plugin->builtin);
}

TEST(ExchangePlugin, AnotherAbiVersionIsRefusedNamingBoth) {
  const std::string why = refusal(CPKV_STUB_v2);
  EXPECT_NE(why.find("ABI version 2"), std::string::npos) << why;
  EXPECT_NE(why.find("speaks version 1"), std::string::npos) << why;
}

TEST(ExchangePlugin, ASharedObjectWithoutTheSymbolIsRefused) {
  const std::string why = refusal(CPKV_STUB_nosym);
  EXPECT_NE(why.find("exports no symbol cpkv_exchange_v1"), std::string::npos) << why;
}

TEST(ExchangePlugin, AnUnknownVariantAndAMissingFunctionAreRefused) {
  EXPECT_NE(refusal(CPKV_STUB_badvariant).find("unknown variant 'warp_drive'"), std::string::npos);
  EXPECT_NE(refusal(CPKV_STUB_nocompose).find("has no compose_layer function"), std::string::npos);
}

// Revision 4 of the header appended the bench's parts to the table. A plugin built against an
// earlier revision declares the shorter table: it loads, with no parts, and cpkv never reads the
// bytes past its table (the stub keeps a wild pointer there, which a read would follow). One that
// offers parts gets them checked: their own version, and CPKV_FLAG_REPLAYABLE (they are replayed).
TEST(ExchangePlugin, ATableOfAnEarlierRevisionLoadsWithoutTheBenchParts) {
  const auto old = harness::load_exchange_plugin(CPKV_STUB_rev3);
  EXPECT_EQ(old->name, "stub");
  EXPECT_EQ(old->parts, nullptr);
  EXPECT_EQ(harness::load_exchange_plugin(CPKV_STUB_ok)->parts, nullptr) << "a table of revision 4 with parts NULL offers none";
}

TEST(ExchangePlugin, TheBenchPartsAreLoadedAndVersionChecked) {
  const auto plugin = harness::load_exchange_plugin(CPKV_STUB_parts);
  ASSERT_NE(plugin->parts, nullptr);
  EXPECT_EQ(plugin->parts->offered, CPKV_PART_BIT(CPKV_PART_FILL) | CPKV_PART_BIT(CPKV_PART_COMPOSE));
  const std::string v2 = refusal(CPKV_STUB_partsv2);
  EXPECT_NE(v2.find("offers the bench's parts of version 2; this cpkv reads version 1"), std::string::npos) << v2;
  const std::string unreplayable = refusal(CPKV_STUB_partsunreplayable);
  EXPECT_NE(unreplayable.find("does not declare CPKV_FLAG_REPLAYABLE"), std::string::npos) << unreplayable;
}

// The header defines one flag (CPKV_FLAG_REPLAYABLE, 1): a table setting another bit was built
// against a header cpkv does not know, and is refused by name rather than half-understood.
TEST(ExchangePlugin, AnUnknownFlagIsRefused) {
  const std::string why = refusal(CPKV_STUB_badflags);
  EXPECT_NE(why.find("sets unknown bits in flags: 0x80"), std::string::npos) << why;
}

// The loader runs the plugin's code (its initializers at dlopen, the reads of its table) in a
// bounded probe child first: whatever that code does there is one refusal naming what it did, and
// this test process (the loader's caller) lives on.
TEST(ExchangePluginLoad, AnInitializerThatCrashesIsRefusedNamingTheSignal) {
  const std::string why = refusal(CPKV_STUB_initcrash);
  EXPECT_NE(why.find(std::string(CPKV_STUB_initcrash) + ": died from SIGSEGV while it was loaded (dlopen: its initializers)"), std::string::npos) << why;
}

TEST(ExchangePluginLoad, AnInitializerThatExitsWithStatus0IsRefusedNotTakenForAPass) {
  const std::string why = refusal(CPKV_STUB_initexit);
  EXPECT_NE(why.find("exited with status 0 while it was loaded (dlopen: its initializers)"), std::string::npos) << why;
}

// The stub's initializer never returns, so the bound is what ends the probe: a short one here
// cannot make a correct plugin fail (the other tests keep the default).
TEST(ExchangePluginLoad, AnInitializerThatHangsIsRefusedAtTheBound) {
  try {
    harness::load_exchange_plugin(CPKV_STUB_inithang, std::chrono::milliseconds(2000));
    ADD_FAILURE() << "a plugin that hangs in its initializer was accepted";
  } catch (const RequestError& e) {
    EXPECT_NE(e.reason().find("did not finish loading within 2000 ms while it was loaded (dlopen: its initializers) (a hang in it?)"), std::string::npos)
        << e.reason();
  }
}

TEST(ExchangePluginLoad, AWildPointerInTheTableIsRefusedWhereverItPoints) {
  const std::string name = refusal(CPKV_STUB_wildname);
  EXPECT_NE(name.find("died from SIGSEGV while cpkv read its table"), std::string::npos) << "a name cpkv cannot read: " << name;
  const std::string entry = refusal(CPKV_STUB_wildentry);
  EXPECT_NE(entry.find("its setup entry (0x10) points into no loaded object (a wild pointer in the table)"), std::string::npos) << entry;
}

// The one rule for a plugin's planted bugs, checked at load (docs/plugins.md): a bug of the
// protocol's (even one only the simulator holds in cpkv) is the plugin's own to hold; a bug of the
// harness's, or a name given twice, is refused before anything runs.
TEST(ExchangePluginLoad, APluginHoldsBugsOfTheProtocolNeverTheHarnesssOwn) {
  const auto held = harness::load_exchange_plugin(CPKV_STUB_heldsim);
  EXPECT_EQ(held->mutants, std::vector<std::string>{"address_keyed_plan_cache"});
  EXPECT_TRUE(held->holds("address_keyed_plan_cache"));
  const std::string harness_bug = refusal(CPKV_STUB_heldharness);
  EXPECT_NE(harness_bug.find("declares 'unzeroed_rows', a planted bug of the harness"), std::string::npos) << harness_bug;
  EXPECT_NE(refusal(CPKV_STUB_heldtwice).find("declares planted bug 'no_barrier' twice"), std::string::npos);
}

TEST(ExchangePlugin, AFileThatIsNotASharedObjectIsRefusedBeforeDlopen) {
  const std::string text = test::write_temp("cpkv_exchange_plugin", "libfake.so", "not an ELF file\n");
  EXPECT_NE(refusal(text).find("is not a shared object"), std::string::npos);
  EXPECT_NE(refusal(std::filesystem::path(text).parent_path().string()).find("is not a regular file"), std::string::npos);
  EXPECT_NE(refusal(text + ".missing").find("cannot be read"), std::string::npos);
  // An ELF file that is not a shared object (an executable) gets the loader's own reason.
  EXPECT_NE(refusal("/bin/true").find("cannot be loaded"), std::string::npos);
  std::filesystem::remove_all(std::filesystem::path(text).parent_path());
}

// The request's checks with a plugin: which options a backend takes, the variants it implements,
// which planted bugs reach it.
class ExchangeRequest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Entries with the options a plugin host takes; nothing is run, so their factories make nothing.
    const auto make = [](const harness::CheckedRequest&, const harness::BatchSource&, const harness::ScannedSource&,
                         const harness::ProgressFunction&) -> std::unique_ptr<harness::Backend> { return nullptr; };
    harness::BackendEntry plugin_host;
    plugin_host.name = "host";
    plugin_host.options = harness::kTakesExchange;
    plugin_host.mutants = harness::kGpuHolds | harness::kHarnessHolds;
    plugin_host.replay = make;
    registry.add(std::move(plugin_host));
    harness::BackendEntry other;
    other.name = "other";
    other.mutants = harness::kSimulatorHolds;
    other.replay = make;
    registry.add(std::move(other));
    // A plugin host whose default exchange (no --exchange, no CPKV_EXCHANGE) is the stub, as the
    // cuda backend's is the built-in plugin.
    harness::BackendEntry defaulted;
    defaulted.name = "defaulted";
    defaulted.options = harness::kTakesExchange;
    defaulted.mutants = harness::kGpuHolds | harness::kHarnessHolds;
    defaulted.replay = make;
    defaulted.default_exchange = CPKV_STUB_ok;
    registry.add(std::move(defaulted));
    ::unsetenv("CPKV_EXCHANGE");  // the shell's choice is not this test's
  }
  void TearDown() override { ::unsetenv("CPKV_EXCHANGE"); }
  std::string refused(const harness::ReplayRequest& r, const std::string& option) {
    try {
      harness::check_request(r, registry);
    } catch (const RequestError& e) {
      EXPECT_EQ(e.option(), option) << e.what();
      return e.reason();
    }
    ADD_FAILURE() << "accepted";
    return "";
  }
  harness::ReplayRequest with(std::string variant, std::string mutant) {
    harness::ReplayRequest r;
    r.backend = "host";
    r.variant = std::move(variant);
    r.mutant = std::move(mutant);
    r.exchange = CPKV_STUB_ok;
    return r;
  }
  harness::Registry registry;
};

TEST_F(ExchangeRequest, AllMeansTheVariantsThePluginImplementsAndANamedOtherOneIsRefused) {
  const harness::CheckedRequest c = harness::check_request(with("all", "none"), registry);
  ASSERT_TRUE(c.exchange);
  EXPECT_EQ(c.variants, (std::vector<model::Variant>{model::Variant::v2, model::Variant::staging_direct}));  // the table's order
  EXPECT_NE(refused(with("fused_ar", "none"), "variant").find("does not implement fused_ar (it implements: staging_direct, v2)"), std::string::npos);
}

TEST_F(ExchangeRequest, AHarnessPlantedBugMustReachWhatThePluginReads) {
  EXPECT_NO_THROW(harness::check_request(with("staging_direct", "reused_plan"), registry));  // the stub reads the plan
  EXPECT_NE(refused(with("staging_direct", "stale_page_inverse"), "mutant").find("does not read that input"), std::string::npos);
  EXPECT_NE(refused(with("staging_direct", "single_half"), "mutant").find("does not hold planted bug 'single_half'"), std::string::npos);
  harness::ReplayRequest builtin = with("staging_direct", "reused_plan");
  builtin.exchange.reset();
  EXPECT_NE(refused(builtin, "mutant").find("give --exchange"), std::string::npos);
  harness::ReplayRequest elsewhere = with("staging_direct", "none");
  elsewhere.backend = "other";
  EXPECT_NE(refused(elsewhere, "exchange").find("--backend other does not take it"), std::string::npos);
}

// No --exchange: the backend's default runs, through the same checks as a named one. A default of
// the backend's own leaves the replay line as it was (the default reproduces it); one the
// environment chose is written into the line, which must reproduce the run without that variable.
TEST_F(ExchangeRequest, TheBackendsDefaultExchangeIsCheckedLikeANamedOne) {
  harness::ReplayRequest r = with("staging_direct", "reused_plan");
  r.backend = "defaulted";
  r.exchange.reset();
  const harness::CheckedRequest c = harness::check_request(r, registry);
  ASSERT_TRUE(c.exchange);
  EXPECT_EQ(c.exchange->name, "stub");
  EXPECT_TRUE(c.exchange_by_default);
  EXPECT_EQ(harness::replay_line(c, model::Variant::staging_direct, 2).find("--exchange"), std::string::npos);
  EXPECT_NE(refused([&] { auto x = r; x.mutant = "stale_page_inverse"; return x; }(), "mutant").find("does not read that input"), std::string::npos)
      << "a harness planted bug must reach the default plugin too";
  EXPECT_NE(refused([&] { auto x = r; x.variant = "fused_ar"; return x; }(), "variant").find("exchange plugin 'stub' (the default, "), std::string::npos)
      << "a refusal of a plugin nobody named says what chose it";
  ::setenv("CPKV_EXCHANGE", CPKV_STUB_ok, 1);  // read by the request check alone
  EXPECT_NE(refused([&] { auto x = r; x.variant = "fused_ar"; return x; }(), "variant")
                .find(fmt::format("exchange plugin 'stub' (CPKV_EXCHANGE={}) does not implement fused_ar", CPKV_STUB_ok)),
            std::string::npos);
  const harness::CheckedRequest e = harness::check_request(r, registry);
  EXPECT_FALSE(e.exchange_by_default);
  EXPECT_NE(harness::replay_line(e, model::Variant::staging_direct, 2).find(std::string(" --exchange ") + CPKV_STUB_ok), std::string::npos);
}

// The in-process exchange is gone (the plugin host is the cuda backend's one rank loop): asking for
// it, on the command line or through the backend's default (CPKV_EXCHANGE=inprocess), is one line
// saying so and what to use, whatever the planted bug.
TEST_F(ExchangeRequest, TheInProcessExchangeIsRefusedNamingWhatToUse) {
  harness::ReplayRequest r = with("staging_direct", "none");
  r.exchange = harness::kInProcessExchange;
  const std::string named = refused(r, "exchange");
  EXPECT_NE(named.find("'inprocess' is gone"), std::string::npos) << named;
  EXPECT_NE(named.find("--exchange builtin, the default"), std::string::npos) << named;
  EXPECT_NE(named.find("(--exchange inprocess)"), std::string::npos) << named;
  r.backend = "defaulted";
  r.exchange.reset();
  r.mutant = "single_half";
  ::setenv("CPKV_EXCHANGE", harness::kInProcessExchange, 1);  // read by the request check alone
  const std::string defaulted = refused(r, "exchange");
  EXPECT_NE(defaulted.find("'inprocess' is gone"), std::string::npos) << defaulted;
  EXPECT_NE(defaulted.find("(CPKV_EXCHANGE=inprocess)"), std::string::npos) << defaulted;
}

// A planted bug the plugin holds under a name only cpkv's simulator holds is run as the plugin's
// own by a backend that runs plugins; without a plugin that holds it, it is refused by name.
TEST_F(ExchangeRequest, APluginsOwnPlantedBugIsAcceptedUnderCpkvsNameAndRefusedWhereNoPluginHoldsIt) {
  harness::ReplayRequest r = with("staging_direct", "address_keyed_plan_cache");
  r.exchange = CPKV_STUB_heldsim;
  const harness::CheckedRequest c = harness::check_request(r, registry);
  EXPECT_EQ(c.mutant, harness::Mutant::address_keyed_plan_cache);
  EXPECT_NE(harness::replay_line(c, model::Variant::staging_direct, 2).find(" --mutant address_keyed_plan_cache"), std::string::npos);
  r.exchange = CPKV_STUB_ok;
  EXPECT_NE(refused(r, "mutant").find("exchange plugin 'stub' does not hold planted bug 'address_keyed_plan_cache'"), std::string::npos);
  r.backend = "other";
  r.exchange.reset();
  EXPECT_NO_THROW(harness::check_request(r, registry)) << "the simulator holds it";
}

TEST_F(ExchangeRequest, TheReplayLineCarriesThePlugin) {
  const harness::CheckedRequest c = harness::check_request(with("staging_direct", "reused_plan"), registry);
  const std::string line = harness::replay_line(c, model::Variant::staging_direct, 2);
  EXPECT_NE(line.find(std::string(" --exchange ") + CPKV_STUB_ok), std::string::npos) << line;
  EXPECT_NE(line.find(" --mutant reused_plan"), std::string::npos) << line;
}

// `cpkv bench`'s request: the replay request's checks (the plugin loaded, its variants taken), then a
// backend with a bench entry, then the bench's own numbers; the entry is what the front end calls.
TEST_F(ExchangeRequest, ABenchNeedsABackendThatBenchesAndItsEntryGetsTheCheckedPlugin) {
  harness::BenchRequest bench;
  bench.replay = with("all", "none");
  try {
    harness::check_bench_request(bench, registry);
    ADD_FAILURE() << "a backend with no bench entry was accepted";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.option(), "backend");
    EXPECT_EQ(e.reason(), "'host': benchmarks run on none of this build's backends only");
  }
  harness::BackendEntry bencher;
  bencher.name = "bencher";
  bencher.options = harness::kTakesExchange;
  bencher.mutants = harness::kGpuHolds;
  bencher.replay = [](const harness::CheckedRequest&, const harness::BatchSource&, const harness::ScannedSource&,
                      const harness::ProgressFunction&) -> std::unique_ptr<harness::Backend> { return nullptr; };
  std::vector<std::string> benched;
  bencher.bench = [&](const harness::CheckedBench& c, const harness::BatchSource&, const harness::BenchPrint&) {
    for (model::Variant v : c.checked.variants) benched.emplace_back(model::to_string(v));
    benched.push_back(c.checked.exchange ? c.checked.exchange->name : "no plugin");
    return harness::BenchReport{};
  };
  registry.add(std::move(bencher));
  bench.replay.backend = "bencher";
  const harness::CheckedBench c = harness::check_bench_request(bench, registry);
  EXPECT_EQ(c.reps, 50);
  c.checked.backend->bench(c, harness::BatchSource{}, harness::BenchPrint{});
  EXPECT_EQ(benched, (std::vector<std::string>{"v2", "staging_direct", "stub"}));
  bench.replay.backend = "host";
  try {
    harness::check_bench_request(bench, registry);
    ADD_FAILURE() << "a backend with no bench entry was accepted";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.reason(), "'host': benchmarks run on bencher only");
  }
  bench.replay.backend = "bencher";
  for (const auto& [reps, cp, option] : {std::tuple{0, 1, "reps"}, std::tuple{50, 0, "cp"}, std::tuple{50, model::limits::cp_max + 1, "cp"}}) {
    bench.reps = reps;
    bench.cp = cp;
    try {
      harness::check_bench_request(bench, registry);
      ADD_FAILURE() << option << " out of range was accepted";
    } catch (const RequestError& e) {
      EXPECT_EQ(e.option(), option) << e.what();
    }
  }
}

// The real binary's bench: every refusal of the request (a bad plugin, a backend that does not take
// one, a variant the plugin lacks, a backend that does not bench) is one line and exit 2 before any
// rank starts; a good plugin reaches the cuda entry, which on a machine with no GPU says so.
TEST(ExchangePluginCli, BenchRefusesABadPluginOrBackendInOneLineBeforeAnyRankStarts) {
  const std::string bench = "bench traces/samples/tiny.jsonl ";
  const test::CliRun probe = test::run_cpkv(bench + "--exchange /nonexistent.so");
  if (probe.err.find("this build has no cuda backend") != std::string::npos) GTEST_SKIP() << "this build has no cuda backend: " << probe.err;
  test::expect_bad_input(probe, "--exchange: /nonexistent.so: cannot be read");
  test::expect_bad_input(test::run_cpkv(bench + "--exchange " + CPKV_STUB_v2), "was built against cpkv exchange ABI version 2");
  test::expect_bad_input(test::run_cpkv(bench + "--exchange " + CPKV_STUB_nosym), "exports no symbol cpkv_exchange_v1");
  test::expect_bad_input(test::run_cpkv(bench + "--backend sim --exchange " + CPKV_STUB_ok), "--exchange: --backend sim does not take it");
  test::expect_bad_input(test::run_cpkv(bench + "--variant fused_ar --exchange " + CPKV_STUB_ok),
                         "--variant: exchange plugin 'stub' does not implement fused_ar (it implements: staging_direct, v2)");
  test::expect_bad_input(test::run_cpkv(bench + "--backend sim"), "--backend: 'sim': benchmarks run on cuda only");
  test::expect_bad_input(test::run_cpkv(bench + "--backend model"), "--backend: 'model': benchmarks run on cuda only");
  const test::CliRun good = test::run_cpkv(bench + "--exchange " + CPKV_STUB_ok);
  if (good.err.find("no CUDA device is visible") == std::string::npos) GTEST_SKIP() << "a GPU is visible: the gpu tests run the bench";
  test::expect_bad_input(good, "--backend: cuda: no CUDA device is visible on this machine");
}

// The three GPU front ends (a replay, a bench, the GPU planted bugs) refuse a machine with no GPU in
// the same one line, exit 2 (cuda::gpus_or_refuse; the planted bugs spelled it "--backend cuda:").
TEST(ExchangePluginCli, EveryGpuFrontEndRefusesAMachineWithoutAGpuInOneLine) {
  const test::CliRun mutants = test::run_cpkv("mutants --backend cuda");
  if (mutants.err.find("this build has no cuda backend") != std::string::npos || mutants.err.find("is not one of") != std::string::npos) {
    GTEST_SKIP() << "this build has no cuda backend: " << mutants.err;
  }
  if (mutants.err.find("no CUDA device is visible") == std::string::npos) GTEST_SKIP() << "a GPU is visible: the gpu tests run these";
  const std::string refusal = "--backend: cuda: no CUDA device is visible on this machine";
  test::expect_bad_input(mutants, refusal);
  test::expect_bad_input(test::run_cpkv("replay traces/samples/tiny.jsonl --backend cuda"), refusal);
  test::expect_bad_input(test::run_cpkv("bench traces/samples/tiny.jsonl --backend cuda"), refusal);
}

// The real binary: a plugin whose loading crashes, exits 0 or hangs is one line and exit 2 before
// any rank starts, and cpkv itself is never the process that dies (CPKV_EXCHANGE_LOAD_MS bounds the
// hang; the stub never returns, so the bound cannot fail a correct plugin).
TEST(ExchangePluginCli, APluginWhoseLoadingCrashesExitsOrHangsIsOneLineAndExit2) {
  const std::string replay = "replay traces/samples/tiny.jsonl --backend cuda --exchange ";
  const test::CliRun probe = test::run_cpkv(replay + CPKV_STUB_initexit);
  if (probe.err.find("this build has no cuda backend") != std::string::npos) GTEST_SKIP() << "this build has no cuda backend: " << probe.err;
  test::expect_bad_input(probe, std::string("--exchange: ") + CPKV_STUB_initexit + ": exited with status 0 while it was loaded");
  test::expect_bad_input(test::run_cpkv(replay + CPKV_STUB_initcrash), "died from SIGSEGV while it was loaded");
  test::expect_bad_input(test::run_cpkv(replay + CPKV_STUB_wildname), "died from SIGSEGV while cpkv read its table");
  test::RunSetup bounded;
  bounded.env.push_back(std::string(harness::kLoadMsEnvironment) + "=2000");
  const test::fs::path dir = test::temp_dir("exchange_plugin_cli") / "hang";
  const test::CliRun hang = test::spawn({test::cpkv_binary().string(), "replay", "traces/samples/tiny.jsonl", "--backend", "cuda", "--exchange", CPKV_STUB_inithang}, dir, bounded);
  test::expect_bad_input(hang, "did not finish loading within 2000 ms");
  bounded.env = {std::string(harness::kLoadMsEnvironment) + "=soon"};
  test::expect_bad_input(test::spawn({test::cpkv_binary().string(), "replay", "traces/samples/tiny.jsonl", "--backend", "cuda", "--exchange", CPKV_STUB_ok}, dir, bounded),
                         "--exchange-load-ms-max: CPKV_EXCHANGE_LOAD_MS=soon is not a number of milliseconds");
  // The option bounds the load as the variable does, and wins over it.
  const test::CliRun flagged = test::spawn({test::cpkv_binary().string(), "replay", "traces/samples/tiny.jsonl", "--backend", "cuda", "--exchange-load-ms-max",
                                            "2000", "--exchange", CPKV_STUB_inithang}, dir, bounded);
  test::expect_bad_input(flagged, "did not finish loading within 2000 ms");
  test::fs::remove_all(dir.parent_path());
}

// The real binary takes a plugin's own planted bug under cpkv's name (the request passes its checks
// and reaches the cuda entry), and refuses it where no plugin runs.
TEST(ExchangePluginCli, APluginsOwnPlantedBugPassesTheRequestAndNeedsAPluginThatHoldsIt) {
  const std::string replay = "replay traces/samples/tiny.jsonl --backend cuda --mutant address_keyed_plan_cache --exchange ";
  const test::CliRun own = test::run_cpkv(replay + CPKV_STUB_heldsim);
  if (own.err.find("this build has no cuda backend") != std::string::npos) GTEST_SKIP() << "this build has no cuda backend: " << own.err;
  test::expect_bad_input(test::run_cpkv(replay + "inprocess"), "--exchange: 'inprocess' is gone");
  test::expect_bad_input(test::run_cpkv(replay + CPKV_STUB_ok), "--mutant: exchange plugin 'stub' does not hold planted bug 'address_keyed_plan_cache'");
  if (own.err.find("no CUDA device is visible") == std::string::npos) GTEST_SKIP() << "a GPU is visible: the gpu tests run a plugin's own planted bug";
  test::expect_bad_input(own, "--backend: cuda: no CUDA device is visible on this machine");
}

// The real binary: a bad plugin is one line and exit 2 before anything runs (a machine with the
// cuda backend built; without it `--backend cuda` itself is refused, which the test says).
TEST(ExchangePluginCli, ABadPluginIsOneLineAndExit2BeforeAnyRankStarts) {
  const test::CliRun probe = test::run_cpkv("replay traces/samples/tiny.jsonl --backend cuda --exchange /nonexistent.so");
  if (probe.err.find("this build has no cuda backend") != std::string::npos) GTEST_SKIP() << "this build has no cuda backend: " << probe.err;
  test::expect_bad_input(probe, "--exchange: /nonexistent.so: cannot be read");
  test::expect_bad_input(test::run_cpkv(std::string("replay traces/samples/tiny.jsonl --backend cuda --exchange ") + CPKV_STUB_v2),
                         "was built against cpkv exchange ABI version 2");
  test::expect_bad_input(test::run_cpkv(std::string("replay traces/samples/tiny.jsonl --backend cuda --exchange ") + CPKV_STUB_nosym),
                         "exports no symbol cpkv_exchange_v1");
  test::expect_bad_input(test::run_cpkv("replay traces/samples/tiny.jsonl --backend sim --exchange /nonexistent.so"),
                         "--exchange: --backend sim does not take it");
}

}  // namespace
}  // namespace cpkv

// The property suite (PROTOCOL.md section 9): generators of settings, batches, caps and schedules,
// and one property per invariant, runnable from GoogleTest (RC_GTEST_PROP) and from `cpkv mutants`.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <rapidcheck.h>

#include "cpkv/model/batch.hpp"
#include "cpkv/model/plan.hpp"
#include "cpkv/model/setting.hpp"
#include "cpkv/properties/coverage.hpp"
#include "cpkv/sim/mutant.hpp"
#include "cpkv/sim/backend.hpp"
#include "cpkv/sim/runner.hpp"

namespace cpkv::properties {

// One generated test case: a setting, its batches, how the ranks are scheduled and what is injected.
struct Case {
  model::Setting setting;
  std::vector<model::Batch> batches;
  model::Variant variant = model::Variant::staging_direct;
  std::int32_t layers = 1;               // layers simulated
  std::vector<std::uint32_t> schedule;   // choices among runnable ranks; then round-robin
  bool schedule_bursts = false;          // drawn as bursts that let one rank run ahead (adversarial)
  std::int32_t ipc_missing_rank = -1;
  std::uint64_t seed = 1;                // content seed; free-running: also the fault knobs' seed
};
void showValue(const Case& c, std::ostream& os);

// What the generators may produce. Defaults are the suite's; the sim bounds keep a case cheap.
struct Bounds {
  std::int32_t cp_max = 8;
  std::int32_t page_size_log2_max = 8;   // P up to 256
  std::int32_t requests_max = 64;
  std::int32_t layers_max = 8;
  std::int64_t tokens_max = 4096;        // dense rows (slots x P: prefix and current pages) over the whole batch
  std::int32_t batches_max = 3;
};

// How a case's caps relate to its batches. fitting: every batch fits, or (mixed) some overflow and
// at least one fits, so something is always exchanged. edge: the staging slots land within two of
// some batch's current pages, on either side (property 3).
enum class CapsDraw : std::uint8_t { fitting, edge };

// What a property stresses. Every property draws cp, P, split and variant so that each value is
// reached at every RapidCheck size; the emphasis moves weight toward the inputs its invariant needs.
struct Emphasis {
  CapsDraw caps = CapsDraw::fitting;
  bool many_layers = false;            // 2..layers_max layers, back to back (parity, barrier)
  bool adversarial_schedule = false;   // mostly burst schedules: one rank runs ahead of the others
  bool idle_ranks = false;             // few, short requests: some rank often has no page to write
  bool repeated_shape = false;         // 2..4 batches of one shape with different page tables (plan)
  bool ipc_faults = false;             // a rank whose IPC probe fails in most cases (capability)
  std::vector<model::Variant> variants{model::kAllVariants.begin(), model::kAllVariants.end()};
};

rc::Gen<model::Setting> gen_setting(const Bounds& bounds, const Emphasis& emphasis);
rc::Gen<model::Batch> gen_batch(const model::Setting& setting, const Bounds& bounds, const Emphasis& emphasis);
rc::Gen<Case> gen_case(const Bounds& bounds, const Emphasis& emphasis);

// Runs a case on the scheduled simulator with `mutant`. Without check_bytes the dense buffers are not
// compared with the model (properties of other invariants than 6 do not look at mismatches).
// `recording`: what the run writes as it goes (sim/recording.hpp), e.g. a timeline.
harness::RunReport run_case(const Case& c, harness::Mutant mutant, bool check_bytes = true, const sim::Recording& recording = {});
// Runs a case free-running (processes) with swarm fault knobs drawn from the case seed
// (sim::swarm_faults(c.seed)).
harness::RunReport run_case_free(const Case& c, harness::Mutant mutant, const sim::Recording& recording = {});

// Writes the timeline (Chrome trace event format, sim/recording.hpp) of the case run again with
// `mutant` to `path` in a folder from harness::private_folder() (a fresh file renamed over it):
// scheduled, the very steps of the counterexample on the step clock; free-running, another run of
// the same knobs on the wall clock. Throws std::runtime_error naming the file when a write fails.
void write_timeline(const Case& c, harness::Mutant mutant, const std::string& path, bool free_running = false);

// Writes the case as a trace (and, scheduled, a schedule file) under `dir`, a folder from
// harness::private_folder() (a later write replaces an earlier one whole), and returns the `cpkv
// replay` line: scheduled, or free-running with `--swarm` and the seed of the knobs. Throws
// std::runtime_error naming the file when a write fails.
std::string write_replay(const Case& c, harness::Mutant mutant, const std::string& dir, const std::string& stem, bool free_running = false);

// Byte exactness (invariant 6) as one property body over any backend: draws a case, runs it on the
// backend `backend_for(case)` returns, and fails if any dense byte differs from the model or the run
// did not complete (and, with `require_no_violation`, if any checker reported anything). The suite
// runs it on the scheduled simulator; the GPU tests on the CUDA backend.
using BackendFactory = std::function<std::unique_ptr<harness::Backend>(const Case&)>;
void byte_exactness_on(const BackendFactory& backend_for, const Bounds& bounds, harness::Mutant mutant, bool require_no_violation);
std::unique_ptr<harness::Backend> scheduled_backend(const Case& c);  // the case's schedule, list kind

struct Property {
  std::string name;       // e.g. "1_page_writer_exclusivity"
  std::int32_t invariant; // 1..9 (0: every invariant, free-running)
  // The body draws its inputs with *gen, notes them (note_case) and fails through RC_FAIL on its own
  // invariant only; `mutant` is the planted bug.
  std::function<void(harness::Mutant)> body;
  std::vector<CoverageTarget> targets;  // met under the fixed seed (coverage.hpp)
};
const std::vector<Property>& all_properties();

// The last counterexample a property recorded, for the mutation table: the final shrunk failure is
// the last one recorded. Size: requests + schedule choices. Invariant: the one that fired (for the
// free-running property, read from the run's report: 8 for a deadlock). The replay throws
// std::runtime_error when the counterexample could not be written (a full $TMPDIR).
// reset_last_counterexample: forgets it (check_property calls it first), so a property that failed
// other than through its invariant check (an exception) reports no counterexample, not an older one.
void reset_last_counterexample();
// Where counterexamples go: `dir` (a `--out DIR` the CLI checked with harness::owned_output_folder),
// their names prefixed by `stem_prefix` (a soak's seed, so shards sharing DIR never collide); an
// empty `dir` restores the default, a private folder per run (harness::private_folder).
void set_counterexample_folder(const std::string& dir, const std::string& stem_prefix = "");
std::string counterexample_folder();
std::int64_t last_counterexample_size();
std::string last_counterexample_replay();
// The shrunk counterexample's timeline, written beside its trace (STEM.timeline.json) when first
// asked for (not at every shrinking step); empty when none was recorded. Throws as the replay does.
std::string last_counterexample_timeline();
std::int32_t last_counterexample_invariant();

}  // namespace cpkv::properties

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
  std::int32_t ipc_missing_rank = -1;
  std::uint64_t seed = 1;                // content seed
};
void showValue(const Case& c, std::ostream& os);

// What the generators may produce. Defaults are the suite's; the sim bounds keep a case cheap.
struct Bounds {
  std::int32_t cp_max = 8;
  std::int32_t page_size_log2_max = 8;   // P up to 256
  std::int32_t requests_max = 64;
  std::int32_t layers_max = 8;
  std::int64_t tokens_max = 4096;        // extend + prefix tokens over the whole batch
  std::int32_t batches_max = 3;
};

enum class CapsShape : std::uint8_t { tight, loose, absent, mib_override };

rc::Gen<model::Setting> gen_setting(const Bounds& bounds);
rc::Gen<model::Batch> gen_batch(const model::Setting& setting, const Bounds& bounds);
// A whole case; `tight_caps` biases caps toward the overflow edge, `ipc_faults` draws a rank whose
// IPC probe fails.
rc::Gen<Case> gen_case(const Bounds& bounds, bool tight_caps, bool ipc_faults);

// Runs a case on the scheduled simulator with `mutant`.
sim::RunReport run_case(const Case& c, sim::Mutant mutant);
// Runs a case free-running (processes) with seeded fault delays.
sim::RunReport run_case_free(const Case& c, sim::Mutant mutant);

// Writes the case as a trace and a schedule file under `dir` and returns the `cpkv replay` line.
std::string write_replay(const Case& c, sim::Mutant mutant, const std::string& dir, const std::string& stem);

// Byte exactness (invariant 6) as one property body over any backend: draws a case, runs it on the
// backend `backend_for(case)` returns, and fails if any dense byte differs from the model or the run
// did not complete (and, with `require_no_violation`, if any checker reported anything). The suite
// runs it on the scheduled simulator; the GPU tests on the CUDA backend.
using BackendFactory = std::function<std::unique_ptr<sim::Backend>(const Case&)>;
void byte_exactness_on(const BackendFactory& backend_for, const Bounds& bounds, sim::Mutant mutant, bool require_no_violation);
std::unique_ptr<sim::Backend> scheduled_backend(const Case& c);  // the case's schedule, list kind

struct Property {
  std::string name;       // e.g. "1_page_writer_exclusivity"
  std::int32_t invariant; // 1..8 (0: not tied to one)
  // The body draws its inputs with *gen and asserts with RC_ASSERT; `mutant` is the planted bug.
  std::function<void(sim::Mutant)> body;
};
const std::vector<Property>& all_properties();

// The size of the last counterexample a property recorded (requests + schedule choices), for the
// mutation table: the final shrunk failure is the last one recorded.
std::int64_t last_counterexample_size();
std::string last_counterexample_replay();
// The invariant whose checker fired first in the last counterexample's run (sim::first_invariant_fired).
std::int32_t last_counterexample_first_invariant();

}  // namespace cpkv::properties

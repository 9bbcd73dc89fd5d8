// What every backend shares: the run options, the report (per-rank totals, invariant violations),
// and the one Backend interface. The rank simulator (sim/) and the GPU backend (gpu/) both fill it;
// `cpkv replay`, the property tests and the benchmark drive either through it.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "cpkv/harness/mutants.hpp"
#include "cpkv/harness/source.hpp"
#include "cpkv/model/plan.hpp"

namespace cpkv::harness {

enum class ExpectedBytesFrom : std::uint8_t { spec_oracle, batch_layout };

struct RunOptions {
  model::Variant variant = model::Variant::staging_direct;
  std::int32_t layers = 1;                 // layers run per batch (<= the setting's)
  std::uint64_t seed = 1;
  Mutant mutant = Mutant::none;
  std::int32_t ipc_missing_rank = -1;      // fault: this rank's IPC probe fails (-1: none)
  bool check_bytes = true;                 // compare dense buffers with the model after every layer
  // Where the end-of-layer byte check takes its expected bytes: the plain oracle written from the
  // specification (model/oracle.hpp, the default), or the BatchLayout the gather itself runs on
  // (kept to show what the plain oracle adds: a self-consistent layout bug passes it). Simulator only.
  ExpectedBytesFrom expected_from = ExpectedBytesFrom::spec_oracle;
};

// One invariant violation (PROTOCOL.md section 9), a plain struct so that rank processes can write
// it into shared memory.
struct Violation {
  std::int32_t invariant = 0;  // 1..9, PROTOCOL.md section 9
  std::int32_t rank = -1;
  std::int64_t batch = -1;
  std::int32_t layer = -1;
  std::int64_t slot = -1;
  std::int64_t step = -1;
  char detail[160] = {};
  // The detail as text: up to the buffer's size, terminated or not (a rank process wrote it).
  std::string_view text() const { return {detail, ::strnlen(detail, sizeof detail)}; }
  // The detail from `text`, cut to the buffer and terminated.
  void set_detail(std::string_view text);
};
// Violations a run keeps (the count covers all of them); shared-memory reports hold this many.
inline constexpr std::int32_t kViolationsMax = 64;
inline constexpr std::int32_t kInvariants = 9;

// What a rank reports back to whoever launched it (a forked child cannot return a value): plain
// data, written into shared memory by rank processes. The simulator's step machine and the GPU
// ranks count into it directly; a report gathers it with add_rank.
struct Totals {
  std::int64_t batches = 0, layers = 0, barriers = 0, collectives = 0, overflows = 0, mismatches = 0;
  std::uint64_t bytes_gathered_from_peers = 0, bytes_reduced = 0, steps = 0;
  // Whose figures these are. By default the backend counts every one itself. Through an exchange
  // plugin (the cuda backend's plugin host), bytes_gathered_from_peers and barriers are the
  // plugin's own report (ctx->counters), collectives and bytes_reduced cpkv's count of the
  // all_reduce_sum calls it served, service_barriers the device barriers cpkv's services issued
  // (its IPC all-reduce's), and model_bytes_gathered_from_peers the model's figure for the variant
  // (model::layer_bytes, the gathers), which the plugin's must equal where it reports one.
  std::int32_t counters_of_plugin = 0;
  std::int64_t service_barriers = 0;
  std::uint64_t model_bytes_gathered_from_peers = 0;
  char first_mismatch[240] = {};
  // Adds mismatching kinds; the first non-empty description is kept (truncated to fit).
  void add_mismatches(std::int64_t kinds, std::string_view description);
};

struct RunReport {
  model::Variant variant = model::Variant::staging_direct;
  std::string mode;                       // the backend's name: "sim/scheduled", "sim/processes", "sim/threads", "cuda"
  std::int64_t batches = 0;
  std::vector<Totals> ranks;
  std::vector<Violation> violations;      // first kViolationsMax
  std::int64_t violation_count = 0;
  std::array<std::int64_t, kInvariants + 1> violations_by_invariant = {};  // [1..9]: every violation, kept or not
  bool deadlock = false;
  std::string failure;                    // deadlock report, dead rank, limit: empty when the run ended normally
  std::uint64_t steps = 0;
  bool passed() const { return failure.empty() && violation_count == 0 && mismatches() == 0; }
  std::int64_t mismatches() const;
};

// The one fold of a rank's totals into a report: the rank's row, and its steps in the run's sum.
void add_rank(RunReport& report, const Totals& rank);

// One line: invariant number and name, where, and the detail.
std::string describe(const Violation& violation);
// The same line for a finding that is not a Violation record (the conformance harness's checks of a
// foreign class, whose details outgrow Violation::detail): every front end prints one shape,
// "invariant 3 (overflow determinism): rank 1 batch 0: detail"; a field that does not apply is -1.
std::string violation_line(std::int32_t invariant, std::int32_t rank, std::int64_t batch, std::int32_t layer, std::int64_t slot,
                           std::int64_t step, std::string_view detail);

// The one backend interface: run every batch of a source through one exchange variant and report
// what happened (bytes, barriers, verdicts, mismatches against the model, invariant violations).
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual RunReport run(const BatchSource& source, const RunOptions& options) = 0;
};

}  // namespace cpkv::harness

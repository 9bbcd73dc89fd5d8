// Planted bugs (PROTOCOL.md section 9), as one table (as the variants are one table in
// model/variants.hpp): each row names the bug, the invariant it breaks, and which backends hold it.
// Every list, parser, help text and error message of planted bugs derives from this table: the CLI's
// --mutant, the mutants and explore commands, the GPU subset, Python's cpkv.MUTANTS.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace cpkv::harness {

// Each is a run-time switch, off by default; the only way to turn one on is to pass it explicitly
// in RunOptions (the CLI's --mutant).
enum class Mutant : std::uint8_t {
  none,
  single_half,
  no_barrier,
  arrive_before_fill,
  rank_local_overflow,
  address_keyed_plan_cache,
  token_split,
  skip_zero,
  unagreed_capability,
  barrier_reset_race,
  skip_idle_barrier,
  barrier_passes_early,
  plan_rebuilt_per_layer,
  reversed_request_order,
  unmatched_arrival,
  stale_page_inverse,
  reused_plan,
  unzeroed_rows,
  batch_as_one_sequence,
  causal_off_by_one,
  key_base_skips_prefix,
  allgather_skipped_reorder,
};

// Which backends can switch a planted bug on (a bit set: a bug may live in several).
enum BackendBits : std::uint8_t {
  kSimulatorHolds = 1u << 0,  // sim/: the step machine asks sim::MutantPolicy
  kGpuHolds = 1u << 1,        // gpu/: the executor asks cuda::GpuMutantPolicy
  // gpu/: the harness around any exchange plugin corrupts an input it hands over
  // (include/cpkv/exchange_abi.h); it applies to a plugin that reads that input (cpkv_exchange_v1.uses).
  kHarnessHolds = 1u << 2,
};

struct MutantInfo {
  Mutant mutant;
  std::string_view name;
  std::int32_t invariant;     // PROTOCOL.md section 9: the invariant it breaks (the first, when it breaks two)
  std::uint8_t backends;      // BackendBits
  std::string_view what;      // the bug, in one line
};

inline constexpr MutantInfo kMutantTable[] = {
    {Mutant::none, "none", 0, kSimulatorHolds | kGpuHolds | kHarnessHolds, "the correct protocol"},
    {Mutant::single_half, "single_half", 2, kSimulatorHolds | kGpuHolds, "every layer uses staging half 0"},
    {Mutant::no_barrier, "no_barrier", 2, kSimulatorHolds | kGpuHolds, "the counting barrier is skipped"},
    {Mutant::arrive_before_fill, "arrive_before_fill", 2, kSimulatorHolds, "arrive at the barrier before the fill, wait after it"},
    {Mutant::rank_local_overflow, "rank_local_overflow", 3, kSimulatorHolds, "overflow judged on this rank's own pages"},
    {Mutant::address_keyed_plan_cache, "address_keyed_plan_cache", 5, kSimulatorHolds, "plan cache keyed on the dense buffer address"},
    {Mutant::token_split, "token_split", 1, kSimulatorHolds, "in-seq split at token granularity: a page can get two writers"},
    {Mutant::skip_zero, "skip_zero", 6, kSimulatorHolds | kGpuHolds, "the zero step is skipped: stale tails survive"},
    {Mutant::unagreed_capability, "unagreed_capability", 7, kSimulatorHolds, "each rank takes its own IPC probe, not the group's MIN"},
    {Mutant::barrier_reset_race, "barrier_reset_race", 4, kSimulatorHolds, "one shared count reset by the first leaver (invariants 4 and 8)"},
    {Mutant::skip_idle_barrier, "skip_idle_barrier", 4, kSimulatorHolds, "a rank with no page to write skips the barrier (invariants 4 and 8)"},
    {Mutant::barrier_passes_early, "barrier_passes_early", 4, kSimulatorHolds | kGpuHolds,
     "the barrier waits for the previous phase only: a rank passes one phase early"},
    {Mutant::plan_rebuilt_per_layer, "plan_rebuilt_per_layer", 5, kSimulatorHolds, "the compose plan is rebuilt on every layer, not once per batch"},
    {Mutant::reversed_request_order, "reversed_request_order", 6, kSimulatorHolds,
     "the layout puts requests in reverse order: self-consistent, only a plain oracle sees it"},
    {Mutant::unmatched_arrival, "unmatched_arrival", 4, kSimulatorHolds,
     "rank 0 arrives once more after a batch's last layer, unwaited: only quiescence sees it"},
    {Mutant::stale_page_inverse, "stale_page_inverse", 6, kHarnessHolds,
     "the harness hands a plugin the first batch's page inverse on every later batch (a plugin that reads it)"},
    {Mutant::reused_plan, "reused_plan", 5, kHarnessHolds, "the harness hands a plugin the first batch's compose plan on every later batch"},
    {Mutant::unzeroed_rows, "unzeroed_rows", 6, kHarnessHolds, "the harness hands a plugin current rows whose partial pages' tails are not zeroed"},
    {Mutant::batch_as_one_sequence, "batch_as_one_sequence", 9, kSimulatorHolds,
     "the attention plan takes the batch's requests as one causal sequence: kv_len counts the earlier requests' keys"},
    {Mutant::causal_off_by_one, "causal_off_by_one", 9, kSimulatorHolds, "the attention plan's kv_len is one short: a query does not see itself"},
    {Mutant::key_base_skips_prefix, "key_base_skips_prefix", 9, kSimulatorHolds,
     "the attention plan's k_base is the request's first current row: its prefix keys are skipped"},
    {Mutant::allgather_skipped_reorder, "allgather_skipped_reorder", 6, kSimulatorHolds,
     "a token-split all-gather's re-ordering is skipped: the gathered rows, padding included, fill the current slots in gathered order"},
};
inline constexpr std::size_t kMutantRows = std::size(kMutantTable);

namespace detail {
constexpr bool mutant_table_follows_enum() {
  for (std::size_t i = 0; i < kMutantRows; ++i) {
    const MutantInfo& row = kMutantTable[i];
    if (static_cast<std::size_t>(row.mutant) != i || row.name.empty() || row.backends == 0) return false;
    if ((i == 0) != (row.invariant == 0) || row.invariant < 0 || row.invariant > 9) return false;
    for (std::size_t j = 0; j < i; ++j) {
      if (kMutantTable[j].name == row.name) return false;
    }
  }
  return true;
}
constexpr std::size_t count_held(std::uint8_t backend) {
  std::size_t n = 0;
  for (std::size_t i = 1; i < kMutantRows; ++i) n += (kMutantTable[i].backends & backend) != 0 ? 1 : 0;
  return n;
}
template <std::uint8_t Backend>
constexpr std::array<Mutant, count_held(Backend)> held_by() {
  std::array<Mutant, count_held(Backend)> out{};
  std::size_t n = 0;
  for (std::size_t i = 1; i < kMutantRows; ++i) {
    if ((kMutantTable[i].backends & Backend) != 0) out[n++] = kMutantTable[i].mutant;
  }
  return out;
}
}  // namespace detail
static_assert(detail::mutant_table_follows_enum(),
              "kMutantTable: one row per Mutant in enum order, unique names, none first with invariant 0, the rest 1..9, each held somewhere");
static_assert(static_cast<std::size_t>(Mutant::allgather_skipped_reorder) + 1 == kMutantRows,
              "kMutantTable: a row is missing (the last enumerator must close the table)");

// Every planted bug (none excluded), and the subsets each backend holds, in the table's order.
// kAllMutants: the protocol's planted bugs (every one the simulator holds); kHarnessMutants: the
// harness's own around a plugin.
inline constexpr std::uint8_t kEveryBackend = kSimulatorHolds | kGpuHolds | kHarnessHolds;
inline constexpr std::array<Mutant, detail::count_held(kSimulatorHolds | kGpuHolds)> kAllMutants = detail::held_by<kSimulatorHolds | kGpuHolds>();
inline constexpr auto kSimulatorMutants = detail::held_by<kSimulatorHolds>();
inline constexpr auto kGpuMutants = detail::held_by<kGpuHolds>();
inline constexpr auto kHarnessMutants = detail::held_by<kHarnessHolds>();
static_assert(kAllMutants.size() + kHarnessMutants.size() + 1 == kMutantRows, "every planted bug is held by some backend");
static_assert(kAllMutants.size() == kSimulatorMutants.size(), "the simulator holds every protocol planted bug");

constexpr const MutantInfo& info(Mutant mutant) { return kMutantTable[static_cast<std::size_t>(mutant)]; }
constexpr std::string_view to_string(Mutant mutant) { return info(mutant).name; }
constexpr bool held_by(Mutant mutant, std::uint8_t backends) { return (info(mutant).backends & backends) != 0; }
// "none" or a row's name; anything else: nullopt.
std::optional<Mutant> parse_mutant(std::string_view text);
// "none, single_half, ..." of the mutants a backend set holds (none included), for help texts and errors.
std::string mutant_names(std::uint8_t backends = kEveryBackend);

}  // namespace cpkv::harness

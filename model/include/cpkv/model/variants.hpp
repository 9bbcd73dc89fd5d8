// Every fact about one exchange variant, as one row of one table (as nccl-tests gives each
// collective one struct). `kAllVariants`, parsing, printing, the backends' path choice, the closed-form
// byte counts and the generators derive from it. Adding a variant: one enumerator, one row, one plan
// function (docs/ARCHITECTURE.md, "Adding a variant").
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace cpkv::model {

struct BatchLayout;
struct VariantPlan;

enum class Variant : std::uint8_t {
  legacy_span_ar,
  fused_ar,
  v2,
  v2_fallback,
  symm_dense,
  staging_publish,
  staging_direct,
};

// Where a rank reads the current pages its peers wrote.
enum class PeerPages : std::uint8_t {
  all_reduced,  // nowhere: every rank's pages arrive through the all-reduce
  dense,        // the peers' dense buffers (symmetric memory over IPC)
  staging,      // the peers' staging buffers (over IPC)
};

// Which sum all-reduces a rank issues per layer and buffer kind.
enum class AllReduceFamily : std::uint8_t {
  none,
  per_span,  // two per request (prefix span, current span) over the zeroed dense buffer
  dense,     // one over the whole zeroed dense buffer
  compact,   // one over the packed current pages of the batch (own pages packed, the rest zero)
};

// What the bench's isolated current-page exchange times (PROTOCOL.md section 7).
enum class IsolatedExchange : std::uint8_t {
  none,               // current pages do not move on their own: nothing isolated to time
  barrier_and_gather, // the counting barrier plus the gather of peers' current pages
  compact_allreduce,  // the compact all-reduce
};

// Builds the variant-specific part of one rank's plan (own_current is already filled in).
using PlanFunction = void (*)(const BatchLayout& layout, std::int32_t rank, VariantPlan& plan);

// The plan functions of the rows (model/src/plan.cpp).
namespace plans {
void span_allreduce(const BatchLayout& layout, std::int32_t rank, VariantPlan& plan);
void dense_allreduce(const BatchLayout& layout, std::int32_t rank, VariantPlan& plan);
void compact_allreduce(const BatchLayout& layout, std::int32_t rank, VariantPlan& plan);
void symmetric_dense(const BatchLayout& layout, std::int32_t rank, VariantPlan& plan);
void staging_publish(const BatchLayout& layout, std::int32_t rank, VariantPlan& plan);
void staging_direct(const BatchLayout& layout, std::int32_t rank, VariantPlan& plan);
}  // namespace plans

struct VariantInfo {
  Variant variant;
  std::string_view name;
  bool needs_ipc;               // reads peers' memory: without the IPC capability on every rank, v2_fallback runs
  PeerPages peer_pages;         // where peers' current pages are read from
  bool fill_to_staging;         // the fill writes own current pages straight into staging (no publish copy)
  AllReduceFamily allreduce;    // the all-reduces issued
  IsolatedExchange isolated;    // what the bench's isolated exchange times
  PlanFunction plan;            // the steps of one rank (VariantPlan)
};

inline constexpr VariantInfo kVariantTable[] = {
    {Variant::legacy_span_ar, "legacy_span_ar", false, PeerPages::all_reduced, false, AllReduceFamily::per_span,
     IsolatedExchange::none, &plans::span_allreduce},
    {Variant::fused_ar, "fused_ar", false, PeerPages::all_reduced, false, AllReduceFamily::dense, IsolatedExchange::none,
     &plans::dense_allreduce},
    {Variant::v2, "v2", true, PeerPages::all_reduced, false, AllReduceFamily::compact, IsolatedExchange::compact_allreduce,
     &plans::compact_allreduce},
    {Variant::v2_fallback, "v2_fallback", false, PeerPages::all_reduced, false, AllReduceFamily::dense, IsolatedExchange::none,
     &plans::dense_allreduce},
    {Variant::symm_dense, "symm_dense", true, PeerPages::dense, false, AllReduceFamily::none, IsolatedExchange::barrier_and_gather,
     &plans::symmetric_dense},
    {Variant::staging_publish, "staging_publish", true, PeerPages::staging, false, AllReduceFamily::none,
     IsolatedExchange::barrier_and_gather, &plans::staging_publish},
    {Variant::staging_direct, "staging_direct", true, PeerPages::staging, true, AllReduceFamily::none,
     IsolatedExchange::barrier_and_gather, &plans::staging_direct},
};
inline constexpr std::size_t kVariantCount = std::size(kVariantTable);

namespace detail {
constexpr bool table_follows_enum() {
  for (std::size_t i = 0; i < kVariantCount; ++i) {
    if (static_cast<std::size_t>(kVariantTable[i].variant) != i || kVariantTable[i].plan == nullptr) return false;
  }
  return true;
}
constexpr std::array<Variant, kVariantCount> all_variants() {
  std::array<Variant, kVariantCount> all{};
  for (std::size_t i = 0; i < kVariantCount; ++i) all[i] = kVariantTable[i].variant;
  return all;
}
}  // namespace detail
static_assert(detail::table_follows_enum(), "kVariantTable: one row per Variant, in enum order, each with a plan function");
static_assert(static_cast<std::size_t>(Variant::staging_direct) + 1 == kVariantCount,
              "kVariantTable: a row is missing (the last enumerator must close the table)");

inline constexpr std::array<Variant, kVariantCount> kAllVariants = detail::all_variants();

constexpr const VariantInfo& info(Variant variant) { return kVariantTable[static_cast<std::size_t>(variant)]; }
constexpr std::string_view to_string(Variant variant) { return info(variant).name; }
std::optional<Variant> parse_variant(std::string_view text);
// "legacy_span_ar, fused_ar, ..." for help texts.
std::string_view variant_names();
// The path a rank takes: the variant, or v2_fallback when it needs IPC and not every rank has it.
constexpr Variant path_variant(Variant variant, bool ipc_on_every_rank) {
  return info(variant).needs_ipc && !ipc_on_every_rank ? Variant::v2_fallback : variant;
}
// The dense all-reduce families zero every dense slot first and carry the prefix pages in the sum
// (each rank materializes its own); the others gather prefix pages from their owners' pools.
constexpr bool zeroes_dense(Variant variant) {
  return info(variant).allreduce == AllReduceFamily::per_span || info(variant).allreduce == AllReduceFamily::dense;
}
// The variants that exchange current pages through peers' memory behind a barrier (no all-reduce):
// the ones the interleaving explorer and the barrier properties exercise. staging_direct (the
// protocol's own variant, the table's last row) first: the table read backwards.
constexpr std::size_t barrier_variant_count() {
  std::size_t n = 0;
  for (const VariantInfo& row : kVariantTable) n += row.peer_pages != PeerPages::all_reduced ? 1 : 0;
  return n;
}
constexpr std::array<Variant, barrier_variant_count()> barrier_variants() {
  std::array<Variant, barrier_variant_count()> out{};
  std::size_t n = 0;
  for (std::size_t i = kVariantCount; i-- > 0;) {
    if (kVariantTable[i].peer_pages != PeerPages::all_reduced) out[n++] = kVariantTable[i].variant;
  }
  return out;
}

}  // namespace cpkv::model

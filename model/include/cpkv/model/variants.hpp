// Every fact about one exchange variant, as one row of one table (as nccl-tests gives each collective
// one struct). `kAllVariants`, parsing, printing, the backends' path choice, the cost model's counts
// and the generators derive from it. Adding a variant: one enumerator, one row (with its plan
// function and closed form), nothing else (docs/ARCHITECTURE.md, "Adding a variant").
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
  allgather_zigzag,
  allgather_continuous,
};

// Where a rank reads the current pages its peers wrote.
enum class PeerPages : std::uint8_t {
  all_reduced,  // nowhere: every rank's pages arrive through the all-reduce
  dense,        // the peers' dense buffers (symmetric memory over IPC)
  staging,      // the peers' staging buffers (over IPC)
  all_gathered, // nowhere: every rank's token rows arrive through one padded all-gather (PROTOCOL.md section 12)
};

// Whose rows a rank computes: the pages of the setting's page-aligned split (section 2), or the
// tokens of one of section 12's token splits (zigzag over 2*cp token blocks of each request, rank k
// taking blocks k and 2*cp-1-k; continuous: token t of a request to rank t % cp). A token split can
// give a page two writers: writer exclusivity (invariant 1) is then per token row.
enum class TokenSplit : std::uint8_t { none, zigzag, continuous };
inline constexpr std::size_t kTokenSplitCount = 3;

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
void allgather_zigzag(const BatchLayout& layout, std::int32_t rank, VariantPlan& plan);
void allgather_continuous(const BatchLayout& layout, std::int32_t rank, VariantPlan& plan);
}  // namespace plans

// A count of one layer and one buffer kind as a sum of the batch's counts (model::BatchCounts)
// with small coefficients: one + requests + slots + current pages + this rank's prefix pages (by
// storage owner) + this rank's current pages (by writer).
struct CountTerms {
  std::int8_t one = 0;
  std::int8_t requests = 0;
  std::int8_t slots = 0;
  std::int8_t current = 0;
  std::int8_t own_prefix = 0;
  std::int8_t own_current = 0;
};

// A variant's per-layer counts in closed form, per rank and active buffer kind: what
// model::layer_bytes(variant_plan(...)) counts, written as sums of batch counts so the cost model
// needs no plan (model/src/costs.cpp: layer_bytes_from_counts evaluates them and states no rule of
// its own). tests/model_plan_test.cpp checks every row's against the plan it builds.
struct ClosedForm {
  std::int8_t gathers = 0;        // gather launches (gather1, gather2)
  std::int8_t barriers = 0;       // counting barriers (per layer, not per kind)
  // All-gather calls (per kind), each of cp * max_rank_tokens rows of the row's token split, the
  // padding of the ranks with fewer tokens included (section 12); max_rank_tokens is a batch count
  // of its own (BatchCounts::max_rank_tokens), not a sum of the counts below.
  std::int8_t allgathers = 0;
  CountTerms allreduce_calls;     // sum all-reduce calls
  CountTerms allreduce_pages;     // pages summed by them, all calls together
  CountTerms pre_signal_pages;    // local copies before the compose launch's signal: publish, compact pack
  CountTerms unpack_pages;        // local copies after the all-reduce: compact unpack
  CountTerms materialize_pages;   // local copies of own prefix pages into the dense buffer
  // Pages the gathers read from rank p: its prefix pages (as storage owner), and its current pages
  // (as writer) when p is a peer / this rank itself.
  bool pulls_prefix = false;
  bool pulls_peer_current = false;
  bool pulls_own_current = false;
};

struct VariantInfo {
  Variant variant;
  std::string_view name;
  bool needs_ipc;               // reads peers' memory: without the IPC capability on every rank, v2_fallback runs
  PeerPages peer_pages;         // where peers' current pages are read from
  bool fill_to_staging;         // the fill writes own current pages straight into staging (no publish copy)
  AllReduceFamily allreduce;    // the all-reduces issued
  IsolatedExchange isolated;    // what the bench's isolated exchange times
  TokenSplit token_split;       // none: the rank computes the page split's pages; else section 12's token split
  PlanFunction plan;            // the steps of one rank (VariantPlan)
  ClosedForm counts;            // the plan's per-layer counts from batch counts (the cost model's)
};

// The `counts` column names only its non-zero fields; GCC 12 warns of the others (designated
// initializers leave them at zero by the language's rule, which is meant here).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
inline constexpr VariantInfo kVariantTable[] = {
    {Variant::legacy_span_ar, "legacy_span_ar", false, PeerPages::all_reduced, false, AllReduceFamily::per_span,
     IsolatedExchange::none, TokenSplit::none, &plans::span_allreduce,
     {.allreduce_calls = {.requests = 2}, .allreduce_pages = {.slots = 1}, .materialize_pages = {.own_prefix = 1}}},
    {Variant::fused_ar, "fused_ar", false, PeerPages::all_reduced, false, AllReduceFamily::dense, IsolatedExchange::none, TokenSplit::none,
     &plans::dense_allreduce,
     {.allreduce_calls = {.one = 1}, .allreduce_pages = {.slots = 1}, .materialize_pages = {.own_prefix = 1}}},
    {Variant::v2, "v2", true, PeerPages::all_reduced, false, AllReduceFamily::compact, IsolatedExchange::compact_allreduce, TokenSplit::none,
     &plans::compact_allreduce,
     {.gathers = 1, .allreduce_calls = {.one = 1}, .allreduce_pages = {.current = 1}, .pre_signal_pages = {.own_current = 1},
      .unpack_pages = {.current = 1}, .pulls_prefix = true}},
    {Variant::v2_fallback, "v2_fallback", false, PeerPages::all_reduced, false, AllReduceFamily::dense, IsolatedExchange::none, TokenSplit::none,
     &plans::dense_allreduce,
     {.allreduce_calls = {.one = 1}, .allreduce_pages = {.slots = 1}, .materialize_pages = {.own_prefix = 1}}},
    {Variant::symm_dense, "symm_dense", true, PeerPages::dense, false, AllReduceFamily::none, IsolatedExchange::barrier_and_gather, TokenSplit::none,
     &plans::symmetric_dense, {.gathers = 2, .barriers = 1, .pulls_prefix = true, .pulls_peer_current = true}},
    {Variant::staging_publish, "staging_publish", true, PeerPages::staging, false, AllReduceFamily::none,
     IsolatedExchange::barrier_and_gather, TokenSplit::none, &plans::staging_publish,
     {.gathers = 2, .barriers = 1, .pre_signal_pages = {.own_current = 1}, .pulls_prefix = true, .pulls_peer_current = true}},
    {Variant::staging_direct, "staging_direct", true, PeerPages::staging, true, AllReduceFamily::none,
     IsolatedExchange::barrier_and_gather, TokenSplit::none, &plans::staging_direct,
     {.gathers = 1, .barriers = 1, .pulls_prefix = true, .pulls_peer_current = true, .pulls_own_current = true}},
    // Section 12: the prefix gathered from the pool (IPC, as the others), the token rows all-gathered
    // (padded), then re-ordered into the dense current slots: one local copy of every current page.
    {Variant::allgather_zigzag, "allgather_zigzag", true, PeerPages::all_gathered, false, AllReduceFamily::none,
     IsolatedExchange::none, TokenSplit::zigzag, &plans::allgather_zigzag,
     {.gathers = 1, .allgathers = 1, .unpack_pages = {.current = 1}, .pulls_prefix = true}},
    {Variant::allgather_continuous, "allgather_continuous", true, PeerPages::all_gathered, false, AllReduceFamily::none,
     IsolatedExchange::none, TokenSplit::continuous, &plans::allgather_continuous,
     {.gathers = 1, .allgathers = 1, .unpack_pages = {.current = 1}, .pulls_prefix = true}},
};
#pragma GCC diagnostic pop
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
static_assert(static_cast<std::size_t>(Variant::allgather_continuous) + 1 == kVariantCount,
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
// The variants that exchange current pages through peers' memory behind a barrier (no collective):
// the ones the interleaving explorer and the barrier properties exercise. staging_direct (the
// protocol's own variant, the last such row) first: the table read backwards.
constexpr bool reads_peers_behind_barrier(const VariantInfo& row) {
  return row.peer_pages == PeerPages::dense || row.peer_pages == PeerPages::staging;
}
constexpr std::size_t barrier_variant_count() {
  std::size_t n = 0;
  for (const VariantInfo& row : kVariantTable) n += reads_peers_behind_barrier(row) ? 1 : 0;
  return n;
}
constexpr std::array<Variant, barrier_variant_count()> barrier_variants() {
  std::array<Variant, barrier_variant_count()> out{};
  std::size_t n = 0;
  for (std::size_t i = kVariantCount; i-- > 0;) {
    if (reads_peers_behind_barrier(kVariantTable[i])) out[n++] = kVariantTable[i].variant;
  }
  return out;
}
static_assert(barrier_variants()[0] == Variant::staging_direct, "barrier_variants: staging_direct first");
// Section 12's token-split variants: their rows travel by one all-gather, not by pages.
constexpr bool splits_tokens(Variant variant) { return info(variant).token_split != TokenSplit::none; }
constexpr std::string_view to_string(TokenSplit split) {
  return split == TokenSplit::zigzag ? "zigzag_tokens" : split == TokenSplit::continuous ? "continuous_tokens" : "pages";
}

}  // namespace cpkv::model

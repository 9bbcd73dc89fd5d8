#include "cpkv/sim/world.hpp"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "cpkv/model/assert.hpp"
#include <cstring>
#include <new>

namespace cpkv::sim {

// Harness names this file uses unqualified (sim's headers do not re-export them).
using harness::Violation;
using harness::Totals;
using harness::SharedMemoryFull;
using harness::SharedRegion;
using harness::shm_free_bytes;

namespace {
constexpr std::uint64_t kAlign = 256;
std::uint64_t align_up(std::uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Bump carve of the region: the same sequence of calls gives the same offsets in every process.
struct Bump {
  std::uint64_t next = 0;
  std::uint64_t take(std::uint64_t bytes) {
    const std::uint64_t at = align_up(next);
    next = at + bytes;
    return at;
  }
};
}  // namespace

struct World::Header {
  std::atomic<std::int64_t> violations{0};
  std::atomic<std::int64_t> by_invariant[harness::kInvariants + 1] = {};
  // Slot i of the kept violations is whole (a rank may read them while another records): the
  // count is bumped before the slot is filled, so a reader takes only the slots marked here.
  std::atomic<std::int32_t> written[World::kViolationsMax] = {};
};

std::uint64_t WorldGeometry::page_bytes_all_kinds() const {
  std::uint64_t sum = 0;
  for (std::size_t k = 0; k < row_bytes.size(); ++k) sum += page_bytes(k);
  return sum;
}

std::uint32_t WorldGeometry::row_bytes_max() const { return *std::max_element(row_bytes.begin(), row_bytes.end()); }

WorldGeometry geometry_for(const model::Setting& setting, std::int32_t layers, std::int64_t slot_count_max,
                           std::int64_t current_pages_max) {
  WorldGeometry g;
  g.cp = setting.cp;
  g.page_size = setting.page_size;
  g.layers = layers;
  for (const auto& kind : setting.kinds) g.row_bytes.push_back(kind.row_bytes);
  g.staging_slots = model::staging_capacity(setting).staging_slots;
  g.pool_pages_per_rank = setting.pool_pages_per_rank();
  g.slot_count_max = slot_count_max;
  g.current_pages_max = current_pages_max;
  return g;
}

namespace {
template <typename T>
void construct_array(std::uint8_t* base, std::uint64_t offset, std::uint64_t count) {
  T* first = reinterpret_cast<T*>(base + offset);
  for (std::uint64_t i = 0; i < count; ++i) new (first + i) T();
}
}  // namespace

model::ArenaCarve World::carve_for(const WorldGeometry& g) {
  model::Setting setting;
  setting.page_size = g.page_size;
  for (std::uint32_t row_bytes : g.row_bytes) setting.kinds.push_back({"", row_bytes, false});
  return model::carve_arena(setting, g.staging_slots, 0);
}

World::Offsets World::carve_world(const WorldGeometry& g, const model::ArenaCarve& carve) {
  Offsets off;
  const std::uint64_t cp = g.cp;
  const std::uint64_t kinds = g.row_bytes.size();
  off.stamps_per_half = static_cast<std::uint64_t>(std::max<std::int64_t>(g.staging_slots, g.current_pages_max));
  const std::uint64_t dense_stamps_per_rank = 2 * static_cast<std::uint64_t>(g.slot_count_max);
  Bump bump;
  off.header = bump.take(sizeof(Header));
  off.positions = bump.take(cp * sizeof(RankPosition));
  off.barrier = bump.take(cp * sizeof(Counter));
  off.collective = bump.take(cp * sizeof(Counter));
  off.batch = bump.take(cp * sizeof(Counter));
  off.reset = bump.take(sizeof(ResetBarrier));
  off.probes = bump.take(cp * sizeof(std::atomic<std::int32_t>));
  off.paths = bump.take(cp * sizeof(std::atomic<std::int32_t>));
  off.verdicts = bump.take(cp * sizeof(std::atomic<std::int32_t>));
  off.reading = bump.take(cp * sizeof(std::atomic<std::int64_t>));
  off.colllog = bump.take(cp * sizeof(CollectiveLog));
  off.stamps = bump.take(cp * 2 * off.stamps_per_half * sizeof(StagingStamp));
  off.dense_stamps = bump.take(cp * dense_stamps_per_rank * sizeof(StagingStamp));
  off.arrivals = bump.take(static_cast<std::uint64_t>(g.layers) * kBarrierUsesPerLayerMax * sizeof(BarrierShadow));
  off.totals = bump.take(cp * sizeof(Totals));
  off.fillers = bump.take(2 * off.stamps_per_half * sizeof(PageFillers));
  off.row_fillers = bump.take(static_cast<std::uint64_t>(g.current_pages_max) * g.page_size * sizeof(PageFillers));
  off.violations = bump.take(kViolationsMax * sizeof(Violation));
  // Pool slabs: per rank, per layer, per kind, pool_pages_per_rank pages. Only the pages a batch
  // references are ever written, but every page is reserved up front (a full /dev/shm must fail
  // at the start, not as a SIGBUS mid-run).
  std::uint64_t pool_layer = 0;
  for (std::size_t k = 0; k < kinds; ++k) {
    off.pool_kind.push_back(pool_layer);
    pool_layer += align_up(static_cast<std::uint64_t>(g.pool_pages_per_rank) * g.page_bytes(k));
  }
  off.pool_rank = pool_layer * g.layers;
  off.pool = bump.take(cp * off.pool_rank);
  off.staging_rank = align_up(carve.staging_bytes);
  off.staging = bump.take(cp * off.staging_rank);
  std::uint64_t dense_half = 0;
  for (std::size_t k = 0; k < kinds; ++k) {
    off.dense_kind.push_back(dense_half);
    dense_half += align_up(static_cast<std::uint64_t>(g.slot_count_max) * g.page_bytes(k));
  }
  off.dense_half = dense_half;
  off.dense_rank = 2 * dense_half;
  off.dense = bump.take(cp * off.dense_rank);
  std::uint64_t compact_rank = 0;
  for (std::size_t k = 0; k < kinds; ++k) {
    off.compact_kind.push_back(compact_rank);
    compact_rank += align_up(static_cast<std::uint64_t>(g.current_pages_max) * g.page_bytes(k));
  }
  off.compact_rank = compact_rank;
  off.compact = bump.take(cp * compact_rank);
  // The collective receive buffer: an all-reduce's dense range, or one kind's all-gathered token rows
  // (section 12: cp * max_rank_tokens rows; a rank's tokens are at most its share of every request
  // plus two, so cp * max_rank_tokens <= current pages * P + 2 * cp * requests, requests <= current pages).
  const std::uint64_t gathered_rows = static_cast<std::uint64_t>(g.current_pages_max) * (g.page_size + 2 * cp);
  off.scratch_rank = align_up(std::max<std::uint64_t>(static_cast<std::uint64_t>(g.slot_count_max) * g.page_size, gathered_rows) * g.row_bytes_max());
  off.scratch = bump.take(cp * off.scratch_rank);
  off.total = align_up(bump.next);
  return off;
}

// What the run will write, reserved up front (SharedRegion::create): everything but the pool slabs,
// and of those only the pages some batch references, on every layer and kind.
std::vector<SharedRegion::ByteRange> World::reserved_ranges(const WorldGeometry& g, const Offsets& off) {
  const std::uint64_t pool_end = off.pool + g.cp * off.pool_rank;
  std::vector<SharedRegion::ByteRange> ranges = {{0, off.pool}, {pool_end, off.total - pool_end}};
  if (!g.pool_pages_touched) {
    ranges.push_back({off.pool, pool_end - off.pool});
    return ranges;
  }
  const std::uint64_t per_layer = off.pool_rank / static_cast<std::uint64_t>(g.layers);
  std::vector<SharedRegion::ByteRange> pages;
  for (std::int64_t logical : *g.pool_pages_touched) {
    const std::uint64_t rank = static_cast<std::uint64_t>(logical % g.cp);
    const std::uint64_t local = static_cast<std::uint64_t>(logical / g.cp);
    for (std::int32_t layer = 0; layer < g.layers; ++layer) {
      for (std::size_t k = 0; k < g.row_bytes.size(); ++k) {
        pages.push_back({off.pool + rank * off.pool_rank + layer * per_layer + off.pool_kind[k] + local * g.page_bytes(k), g.page_bytes(k)});
      }
    }
  }
  std::sort(pages.begin(), pages.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
  for (const SharedRegion::ByteRange& page : pages) {  // adjacent pages in one call
    if (ranges.size() > 2 && ranges.back().offset + ranges.back().bytes == page.offset) {
      ranges.back().bytes += page.bytes;
    } else {
      ranges.push_back(page);
    }
  }
  return ranges;
}

namespace {
std::uint64_t sum_bytes(const std::vector<SharedRegion::ByteRange>& ranges) {
  std::uint64_t sum = 0;
  for (const SharedRegion::ByteRange& range : ranges) sum += range.bytes;
  return sum;
}

void check_needed(std::uint64_t needed) {
  const std::uint64_t free_bytes = shm_free_bytes();
  if (needed > free_bytes) {
    throw SharedMemoryFull(fmt::format("the simulated group needs {} of shared memory ({} bytes, pools included), /dev/shm has {} free "
                                       "(lower the staging size, the batch, the layers or cp)", harness::size_text(needed), needed, harness::size_text(free_bytes)));
  }
}

// Refuse before the region is made, naming what is needed and what is free; the reservation
// itself (posix_fallocate) still catches a /dev/shm that fills between this check and then.
std::vector<SharedRegion::ByteRange> checked(std::vector<SharedRegion::ByteRange> ranges) {
  check_needed(sum_bytes(ranges));
  return ranges;
}
}  // namespace

std::uint64_t World::reserved_bytes(const WorldGeometry& g) {
  const model::ArenaCarve carve = carve_for(g);
  return sum_bytes(reserved_ranges(g, carve_world(g, carve)));
}

// A region is mapped whole, its pools sparse (only the pages a batch touches are reserved). Linux
// on x86-64 and aarch64 gives a process 128 TiB of address space (47-bit), so no mapping above
// half of it can be made: a trace at the pool limit (2^31 - 1 pages, P 256, three kinds: 2 PiB)
// failed in mmap after the run's header, exit 1 (issue 22, item 13). It is refused here, before
// any output, as a run this machine cannot hold.
constexpr std::uint64_t kMappingBytesMax = std::uint64_t{1} << 46;

void World::check_space(const WorldGeometry& g) {
  const Offsets off = carve_world(g, carve_for(g));
  if (off.total > kMappingBytesMax) {
    const std::uint64_t needed = sum_bytes(reserved_ranges(g, off));
    throw SharedMemoryFull(fmt::format("the simulated group would map {} GiB of shared memory ({} bytes: the pool slabs of {} pages a rank are mapped whole), "
                                       "more than the {} GiB one process can map, to reserve {} of it; /dev/shm has {} free "
                                       "(lower pool_pages, page_size or the buffer kinds)",
                                       off.total >> 30, off.total, g.pool_pages_per_rank, kMappingBytesMax >> 30, harness::size_text(needed),
                                       harness::size_text(shm_free_bytes())));
  }
  check_needed(sum_bytes(reserved_ranges(g, off)));
}

World::World(const WorldGeometry& g, std::uint64_t seed)
    : geometry_(g),
      seed_(seed),
      carve_(carve_for(g)),
      off_(carve_world(g, carve_)),
      region_(SharedRegion::create(off_.total, checked(reserved_ranges(g, off_)))) {
  const std::uint64_t cp = g.cp;
  std::uint8_t* base = region_.base();
  new (base + off_.header) Header();
  construct_array<RankPosition>(base, off_.positions, cp);
  construct_array<Counter>(base, off_.barrier, cp);
  construct_array<Counter>(base, off_.collective, cp);
  construct_array<Counter>(base, off_.batch, cp);
  construct_array<ResetBarrier>(base, off_.reset, 1);
  construct_array<std::atomic<std::int32_t>>(base, off_.probes, cp);
  construct_array<std::atomic<std::int32_t>>(base, off_.paths, cp);
  construct_array<std::atomic<std::int32_t>>(base, off_.verdicts, cp);
  construct_array<std::atomic<std::int64_t>>(base, off_.reading, cp);
  construct_array<CollectiveLog>(base, off_.colllog, cp);
  construct_array<StagingStamp>(base, off_.stamps, cp * 2 * off_.stamps_per_half);
  construct_array<StagingStamp>(base, off_.dense_stamps, cp * 2 * static_cast<std::uint64_t>(g.slot_count_max));
  construct_array<BarrierShadow>(base, off_.arrivals, static_cast<std::uint64_t>(g.layers) * kBarrierUsesPerLayerMax);
  construct_array<Totals>(base, off_.totals, cp);
  construct_array<PageFillers>(base, off_.fillers, 2 * off_.stamps_per_half);
  construct_array<PageFillers>(base, off_.row_fillers, static_cast<std::uint64_t>(g.current_pages_max) * g.page_size);
  reset_flags();
  // Staging starts as garbage, as freshly allocated GPU memory would: a skipped zero shows.
  for (std::int32_t r = 0; r < g.cp; ++r) std::memset(base + off_.staging + r * off_.staging_rank, 0xA5, carve_.staging_bytes);
}

World::Header* World::header() const { return region_.at<Header>(off_.header); }

std::uint8_t* World::pool_page(std::int32_t rank, std::int32_t layer, std::size_t kind, std::int64_t local_page) const {
  const std::uint64_t per_layer = off_.pool_rank / static_cast<std::uint64_t>(geometry_.layers);  // exact: pool_rank = per_layer * layers
  return region_.base() + off_.pool + rank * off_.pool_rank + layer * per_layer + off_.pool_kind[kind] +
         static_cast<std::uint64_t>(local_page) * geometry_.page_bytes(kind);
}
std::uint8_t* World::staging_page(std::int32_t rank, std::int32_t half, std::size_t kind, std::int64_t slot) const {
  return region_.base() + off_.staging + rank * off_.staging_rank + carve_.slot_offset(half, kind, slot);
}
std::uint8_t* World::dense_page(std::int32_t rank, std::int32_t half, std::size_t kind, std::int64_t slot) const {
  return region_.base() + off_.dense + rank * off_.dense_rank + half * off_.dense_half + off_.dense_kind[kind] +
         static_cast<std::uint64_t>(slot) * geometry_.page_bytes(kind);
}
std::uint8_t* World::compact_page(std::int32_t rank, std::size_t kind, std::int64_t index) const {
  return region_.base() + off_.compact + rank * off_.compact_rank + off_.compact_kind[kind] +
         static_cast<std::uint64_t>(index) * geometry_.page_bytes(kind);
}
std::uint8_t* World::scratch(std::int32_t rank) const { return region_.base() + off_.scratch + rank * off_.scratch_rank; }

Counter& World::barrier_counter(std::int32_t rank) const { return region_.at<Counter>(off_.barrier)[rank]; }
Counter& World::collective_counter(std::int32_t rank) const { return region_.at<Counter>(off_.collective)[rank]; }
Counter& World::batch_counter(std::int32_t rank) const { return region_.at<Counter>(off_.batch)[rank]; }
ResetBarrier& World::reset_barrier() const { return *region_.at<ResetBarrier>(off_.reset); }
RankPosition& World::position(std::int32_t rank) const { return region_.at<RankPosition>(off_.positions)[rank]; }
std::atomic<std::int32_t>& World::ipc_probe(std::int32_t rank) const { return region_.at<std::atomic<std::int32_t>>(off_.probes)[rank]; }
std::atomic<std::int32_t>& World::chosen_path(std::int32_t rank) const { return region_.at<std::atomic<std::int32_t>>(off_.paths)[rank]; }
std::atomic<std::int32_t>& World::verdict(std::int32_t rank) const { return region_.at<std::atomic<std::int32_t>>(off_.verdicts)[rank]; }
std::atomic<std::int64_t>& World::reading_layer(std::int32_t rank) const { return region_.at<std::atomic<std::int64_t>>(off_.reading)[rank]; }
CollectiveLog& World::collectives(std::int32_t rank) const { return region_.at<CollectiveLog>(off_.colllog)[rank]; }
Totals& World::totals(std::int32_t rank) const { return region_.at<Totals>(off_.totals)[rank]; }
BarrierShadow& World::barrier_shadow(std::int32_t layer, std::int32_t use) const {
  return region_.at<BarrierShadow>(off_.arrivals)[layer * kBarrierUsesPerLayerMax + use];
}
PageFillers& World::fillers(std::int32_t half, std::int64_t current_index) const {
  return region_.at<PageFillers>(off_.fillers)[half * off_.stamps_per_half + current_index];
}

PageFillers& World::row_fillers(std::int64_t current_row) const {
  CPKV_ASSERT(current_row >= 0 && current_row < geometry_.current_pages_max * geometry_.page_size);
  return region_.at<PageFillers>(off_.row_fillers)[current_row];
}

StagingStamp& World::stamp(std::int32_t rank, std::int32_t half, std::int64_t slot) const {
  return region_.at<StagingStamp>(off_.stamps)[(rank * 2 + half) * off_.stamps_per_half + slot];
}
StagingStamp& World::dense_stamp(std::int32_t rank, std::int32_t half, std::int64_t slot) const {
  const std::uint64_t per_half = static_cast<std::uint64_t>(geometry_.slot_count_max);
  return region_.at<StagingStamp>(off_.dense_stamps)[(rank * 2 + half) * per_half + slot];
}

std::vector<World::ByteSpan> World::flag_spans() const {
  return {{off_.barrier, off_.totals - off_.barrier}, {off_.fillers, off_.violations - off_.fillers}};
}
World::ByteSpan World::pool_span(std::int32_t rank) const { return {off_.pool + rank * off_.pool_rank, off_.pool_rank}; }
World::ByteSpan World::staging_span(std::int32_t rank) const { return {off_.staging + rank * off_.staging_rank, off_.staging_rank}; }
World::ByteSpan World::dense_span(std::int32_t rank, std::int32_t half) const {
  return {off_.dense + rank * off_.dense_rank + half * off_.dense_half, off_.dense_half};
}
World::ByteSpan World::compact_span(std::int32_t rank) const { return {off_.compact + rank * off_.compact_rank, off_.compact_rank}; }
World::ByteSpan World::record_span() const { return {off_.header, off_.positions - off_.header}; }
World::ByteSpan World::scratch_span(std::int32_t rank) const { return {off_.scratch + rank * off_.scratch_rank, off_.scratch_rank}; }

void World::record(const Violation& violation) const {
  header()->by_invariant[std::clamp(violation.invariant, 0, harness::kInvariants)].fetch_add(1);
  const std::int64_t index = header()->violations.fetch_add(1);
  if (index >= kViolationsMax) return;
  region_.at<Violation>(off_.violations)[index] = violation;
  header()->written[index].store(1, std::memory_order_release);
}

std::vector<Violation> World::violations() const {
  const std::int64_t count = std::min<std::int64_t>(header()->violations.load(), kViolationsMax);
  const Violation* first = region_.at<Violation>(off_.violations);
  return {first, first + count};
}

std::vector<Violation> World::whole_violations() const {
  const std::int64_t count = std::min<std::int64_t>(header()->violations.load(), kViolationsMax);
  std::int64_t whole = 0;
  while (whole < count && header()->written[whole].load(std::memory_order_acquire) != 0) ++whole;
  const Violation* first = region_.at<Violation>(off_.violations);
  return {first, first + whole};
}

std::int64_t World::violation_count() const { return header()->violations.load(); }
std::int64_t World::violation_count(std::int32_t invariant) const { return header()->by_invariant[std::clamp(invariant, 0, harness::kInvariants)].load(); }

void World::reset_flags() const {
  for (std::int32_t r = 0; r < geometry_.cp; ++r) {
    barrier_counter(r).value = 0;
    collective_counter(r).value = 0;
    batch_counter(r).value = 0;
    reading_layer(r) = -1;
    verdict(r) = 0;
    chosen_path(r) = -1;
    collectives(r).calls = 0;
    collectives(r).signature = 0;
    position(r).state = static_cast<std::int32_t>(RankState::idle);
    totals(r) = Totals{};
  }
  for (std::int32_t l = 0; l < geometry_.layers; ++l) {
    for (std::int32_t u = 0; u < kBarrierUsesPerLayerMax; ++u) barrier_shadow(l, u).value = 0;
  }
  reset_barrier().count = 0;
  reset_barrier().generation = 0;
  header()->violations = 0;
  for (auto& count : header()->by_invariant) count = 0;
  for (auto& slot : header()->written) slot = 0;
}

}  // namespace cpkv::sim

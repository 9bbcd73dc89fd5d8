#include "state_hash.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "cpkv/model/assert.hpp"
#include "cpkv/model/content.hpp"

namespace cpkv::properties::detail {

namespace {
constexpr std::uint64_t kChunk = 64;
constexpr std::uint64_t kSeedA = 0x9e3779b97f4a7c15ULL;
constexpr std::uint64_t kSeedB = 0xc2b2ae3d27d4eb4fULL;

std::uint64_t rotl(std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
}  // namespace

RegionHash::RegionHash(sim::World& world) : world_(&world) {
  for (const sim::World::ByteSpan& s : world.flag_spans()) units_.push_back({s.offset, s.bytes, 0, 0, 0});
  flag_units_ = units_.size();
  const std::int32_t cp = world.geometry().cp;
  for (std::int32_t r = 0; r < cp; ++r) {
    for (const sim::World::ByteSpan& s : {world.staging_span(r), world.dense_span(r, 0), world.dense_span(r, 1), world.pool_span(r),
                                          world.compact_span(r), world.scratch_span(r)}) {
      units_.push_back({s.offset, s.bytes, 0, static_cast<std::size_t>(r) + 1, 0});
    }
  }
  std::size_t chunks = 0;
  std::size_t bucket = ~std::size_t{0};
  std::size_t bucket_first = 0;
  for (Unit& u : units_) {
    if (u.bucket != bucket) bucket_first = chunks;
    bucket = u.bucket;
    u.first_chunk = chunks;
    u.bucket_first_chunk = bucket_first;
    chunks += (u.bytes + kChunk - 1) / kChunk;
  }
  chunks_.resize(chunks);
  absolute_.assign(static_cast<std::size_t>(cp) + 1, Fingerprint{});
  relative_.assign(static_cast<std::size_t>(cp) + 1, Fingerprint{});
  for (const Unit& u : units_) {
    for (std::uint64_t c = 0; c * kChunk < u.bytes; ++c) {
      const std::size_t chunk = u.first_chunk + c;
      chunks_[chunk] = Fingerprint{};
      const Fingerprint zero_abs = absolute(chunk, Fingerprint{});
      // set_chunk moves the sums from the old hash to the new one: start them from the zero hash.
      total_.a += zero_abs.a;
      total_.b += zero_abs.b;
      absolute_[u.bucket].a += zero_abs.a;
      absolute_[u.bucket].b += zero_abs.b;
      set_chunk(u, chunk, chunk_hash(chunk - u.bucket_first_chunk, base() + u.offset + c * kChunk, std::min(kChunk, u.bytes - c * kChunk)));
    }
  }
}

// The absolute hash: the relative one salted by the chunk's id, so equal bytes in two chunks hash apart.
Fingerprint RegionHash::absolute(std::size_t chunk, const Fingerprint& relative) {
  return {model::mix64(relative.a ^ (chunk * 0xff51afd7ed558ccdULL + kSeedA)), model::mix64(relative.b + chunk * 0xc4ceb9fe1a85ec53ULL + kSeedB)};
}

// Replaces the chunk's relative hash, and moves the total and its bucket's sums with it.
void RegionHash::set_chunk(const Unit& u, std::size_t chunk, const Fingerprint& relative) {
  const Fingerprint old_rel = chunks_[chunk];
  const Fingerprint old_abs = absolute(chunk, old_rel);
  const Fingerprint new_abs = absolute(chunk, relative);
  total_.a += new_abs.a - old_abs.a;
  total_.b += new_abs.b - old_abs.b;
  absolute_[u.bucket].a += new_abs.a - old_abs.a;
  absolute_[u.bucket].b += new_abs.b - old_abs.b;
  relative_[u.bucket].a += relative.a - old_rel.a;
  relative_[u.bucket].b += relative.b - old_rel.b;
  chunks_[chunk] = relative;
}

// Two lanes of a multiply-rotate hash over the chunk's words, each finished by splitmix64's mix
// and salted by the chunk's index within its bucket (relative: the same for every rank).
Fingerprint RegionHash::chunk_hash(std::size_t chunk, const std::uint8_t* bytes, std::uint64_t n) const { return hash_bytes(chunk, bytes, n); }

Fingerprint RegionHash::hash_bytes(std::uint64_t chunk, const std::uint8_t* bytes, std::uint64_t n) {
  std::uint64_t a = kSeedA ^ (chunk * 0xff51afd7ed558ccdULL);
  std::uint64_t b = kSeedB ^ (chunk * 0xc4ceb9fe1a85ec53ULL);
  std::uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, bytes + i, 8);
    a = rotl(a ^ (w * 0x87c37b91114253d5ULL), 31) * 0x4cf5ad432745937fULL;
    b = rotl(b + (w ^ 0x52dce729da3ed7b5ULL) * 0x165667b19e3779f9ULL, 27) * 0x9fb21c651e98df25ULL;
  }
  for (; i < n; ++i) {
    a = (a ^ bytes[i]) * 0x100000001b3ULL;
    b = (b + bytes[i]) * 0xff51afd7ed558ccdULL;
  }
  return {model::mix64(a ^ n), model::mix64(b + 0x2545F4914F6CDD1DULL)};
}

void RegionHash::save(std::size_t unit) {
  CPKV_ASSERT(unit < units_.size());
  const Unit& u = units_[unit];
  const std::size_t at = bytes_.size();
  bytes_.resize(at + u.bytes);
  std::memcpy(bytes_.data() + at, base() + u.offset, u.bytes);
  log_.push_back({unit, at, chunk_log_.size(), false});
}

void RegionHash::fold_saved_since(std::size_t mark) {
  for (std::size_t e = mark; e < log_.size(); ++e) {
    Saved& s = log_[e];
    CPKV_ASSERT(!s.folded);
    const Unit& u = units_[s.unit];
    s.changes = chunk_log_.size();
    const std::uint8_t* now = base() + u.offset;
    const std::uint8_t* before = bytes_.data() + s.at;
    for (std::uint64_t c = 0; c * kChunk < u.bytes; ++c) {
      const std::uint64_t n = std::min(kChunk, u.bytes - c * kChunk);
      if (std::memcmp(now + c * kChunk, before + c * kChunk, n) == 0) continue;
      const std::size_t chunk = u.first_chunk + c;
      chunk_log_.push_back({s.unit, chunk, chunks_[chunk]});
      set_chunk(u, chunk, chunk_hash(chunk - u.bucket_first_chunk, now + c * kChunk, n));
    }
    s.folded = true;
  }
}

void RegionHash::undo_to(std::size_t mark) {
  CPKV_ASSERT(mark <= log_.size());
  while (log_.size() > mark) {
    const Saved s = log_.back();
    log_.pop_back();
    const Unit& u = units_[s.unit];
    if (s.folded) {
      while (chunk_log_.size() > s.changes) {
        const ChunkChange change = chunk_log_.back();
        chunk_log_.pop_back();
        set_chunk(units_[change.unit], change.chunk, change.before);
      }
    }
    std::memcpy(base() + u.offset, bytes_.data() + s.at, u.bytes);
    bytes_.resize(s.at);
  }
}

Fingerprint RegionHash::full() const {
  Fingerprint f;
  for (const Unit& u : units_) {
    for (std::uint64_t c = 0; c * kChunk < u.bytes; ++c) {
      const Fingerprint h = absolute(u.first_chunk + c, chunk_hash(u.first_chunk + c - u.bucket_first_chunk, base() + u.offset + c * kChunk,
                                                                   std::min(kChunk, u.bytes - c * kChunk)));
      f.a += h.a;
      f.b += h.b;
    }
  }
  return f;
}

std::vector<RegionHash::ChunkSpan> RegionHash::flag_chunks() const {
  std::vector<ChunkSpan> out;
  for (std::size_t u = 0; u < flag_units_; ++u) {
    const Unit& unit = units_[u];
    for (std::uint64_t c = 0; c * kChunk < unit.bytes; ++c) out.push_back({unit.first_chunk + c, unit.offset + c * kChunk, std::min(kChunk, unit.bytes - c * kChunk)});
  }
  return out;
}

namespace {
constexpr std::uint64_t kShadowMask = 0xFF;  // BarrierShadow: ((batch + 1) << 8) | ranks' arrival bits
std::uint64_t offset_of(const sim::World& world, const void* p) {
  return static_cast<std::uint64_t>(static_cast<const std::uint8_t*>(p) - world.region().base());
}
}  // namespace

// Every rank-indexed entry of the flag spans (sim/world.hpp) by rank; the barrier shadows' words;
// then the flag chunks that hold an idle rank's entry or a shadow word.
Orbits::Orbits(const sim::World& world, const RegionHash& hash, std::uint8_t idle, bool forget_shadow_bits)
    : world_(&world), idle_(idle), forget_shadow_bits_(forget_shadow_bits) {
  const sim::WorldGeometry& g = world.geometry();
  ranges_.resize(static_cast<std::size_t>(g.cp));
  for (std::int32_t r = 0; r < g.cp; ++r) {
    std::vector<Range>& mine = ranges_[static_cast<std::size_t>(r)];
    for (const sim::Counter* c : {&world.barrier_counter(r), &world.collective_counter(r), &world.batch_counter(r)}) mine.push_back({offset_of(world, c), sizeof(sim::Counter)});
    for (const std::atomic<std::int32_t>* w : {&world.ipc_probe(r), &world.chosen_path(r), &world.verdict(r)}) mine.push_back({offset_of(world, w), sizeof(*w)});
    mine.push_back({offset_of(world, &world.reading_layer(r)), sizeof(std::int64_t)});
    mine.push_back({offset_of(world, &world.collectives(r)), sizeof(sim::CollectiveLog)});
    for (std::int32_t half = 0; half < 2; ++half) {
      for (std::int64_t slot = 0; slot < world.current_capacity(); ++slot) mine.push_back({offset_of(world, &world.stamp(r, half, slot)), sizeof(sim::StagingStamp)});
      for (std::int64_t slot = 0; slot < g.slot_count_max; ++slot) mine.push_back({offset_of(world, &world.dense_stamp(r, half, slot)), sizeof(sim::StagingStamp)});
    }
  }
  for (std::int32_t layer = 0; layer < g.layers; ++layer) {
    for (std::int32_t use = 0; use < sim::kBarrierUsesPerLayerMax; ++use) shadows_.push_back(offset_of(world, &world.barrier_shadow(layer, use)));
  }
  for (const RegionHash::ChunkSpan& span : hash.flag_chunks()) {
    MaskedChunk m{span, {}, {}};
    const auto inside = [&](std::uint64_t at, std::uint64_t n) { return at < span.offset + span.bytes && at + n > span.offset; };
    for (std::int32_t r = 0; r < g.cp; ++r) {
      if (!(idle & (1u << r))) continue;
      for (const Range& range : ranges_[static_cast<std::size_t>(r)]) {
        if (!inside(range.offset, range.bytes)) continue;
        CPKV_ASSERT(range.offset >= span.offset && range.offset + range.bytes <= span.offset + span.bytes);  // entries never straddle chunks
        m.clear.push_back({range.offset - span.offset, range.bytes});
      }
    }
    for (std::uint64_t at : shadows_) {
      if (inside(at, 8)) m.shadows.push_back(at - span.offset);
    }
    if (!m.clear.empty() || !m.shadows.empty()) masked_.push_back(std::move(m));
  }
}

// Rank r's part, rank-relative: its units' relative sum, its flag entries' bytes, its barrier
// shadow bits, its machine's steps and batch.
Fingerprint Orbits::part(const RegionHash& hash, std::int32_t r, std::uint64_t steps, std::uint64_t batch) const {
  const std::uint8_t* base = world_->region().base();
  Fingerprint f = hash.bucket_relative(static_cast<std::size_t>(r) + 1);
  std::uint64_t index = 0;
  for (const Range& range : ranges_[static_cast<std::size_t>(r)]) {
    const Fingerprint h = RegionHash::hash_bytes(0x5157ULL + index++, base + range.offset, range.bytes);
    f.a += h.a;
    f.b += h.b;
  }
  std::uint64_t bits = 0;
  for (std::size_t i = 0; i < shadows_.size(); ++i) {
    std::uint64_t word;
    std::memcpy(&word, base + shadows_[i], 8);
    bits |= ((word >> r) & 1u) << i;
  }
  if (forget_shadow_bits_) bits = 0;
  return {model::mix64(f.a ^ model::mix64(bits + 0x1d8e4e27c47d124fULL)) + model::mix64(steps ^ (batch << 48)),
          model::mix64(f.b + model::mix64(bits ^ 0x9e3779b97f4a7c15ULL) + model::mix64(steps * 0x2545F4914F6CDD1DULL + batch))};
}

Fingerprint Orbits::key(const RegionHash& hash, const std::vector<std::uint64_t>& steps, const std::vector<std::uint64_t>& batches,
                        std::vector<std::uint8_t>& to_canonical) const {
  Fingerprint f = hash.value();
  const std::uint8_t* base = world_->region().base();
  // The flag chunks with idle entries, hashed with those entries cleared and the idle ranks' shadow bits off.
  std::uint8_t chunk[kChunk];
  for (const MaskedChunk& m : masked_) {
    std::memcpy(chunk, base + m.span.offset, m.span.bytes);
    for (const Range& c : m.clear) std::memset(chunk + c.offset, 0, c.bytes);
    for (std::uint64_t at : m.shadows) {
      std::uint64_t word;
      std::memcpy(&word, chunk + at, 8);
      word &= ~(std::uint64_t{idle_} & kShadowMask);
      std::memcpy(chunk + at, &word, 8);
    }
    const Fingerprint old = hash.chunk_absolute(m.span.chunk);
    const Fingerprint now = RegionHash::hash_bytes(m.span.chunk ^ 0x6a09e667f3bcc909ULL, chunk, m.span.bytes);
    f.a += now.a - old.a;
    f.b += now.b - old.b;
  }
  std::vector<std::pair<Fingerprint, std::uint8_t>> parts;
  for (std::uint32_t r = 0; r < steps.size(); ++r) {
    to_canonical[r] = static_cast<std::uint8_t>(r);
    if (idle_ & (1u << r)) {
      const Fingerprint units = hash.bucket_absolute(r + 1);
      f.a -= units.a;
      f.b -= units.b;
      parts.emplace_back(part(hash, static_cast<std::int32_t>(r), steps[r], batches[r]), static_cast<std::uint8_t>(r));
    } else {
      f.a += model::mix64((std::uint64_t{r} << 56) ^ (batches[r] << 40) ^ steps[r]);
      f.b += model::mix64(model::mix64(steps[r] + 0x51ed27ULL * (r + 1)) ^ batches[r]);
    }
  }
  // The idle ranks in the order of their parts take the idle places in rank order.
  std::sort(parts.begin(), parts.end(), [](const auto& x, const auto& y) { return x.first.a != y.first.a ? x.first.a < y.first.a : x.first.b < y.first.b; });
  std::uint32_t place = 0;
  for (const auto& [h, r] : parts) {
    f.a += model::mix64(h.a + 0x243f6a8885a308d3ULL);
    f.b += model::mix64(h.b ^ 0x13198a2e03707344ULL);
    while (!(idle_ & (1u << place))) ++place;
    to_canonical[r] = static_cast<std::uint8_t>(place++);
  }
  return f;
}

VisitedTable::VisitedTable() : slots_(1 << 16) {}

bool VisitedTable::insert(const Fingerprint& f, std::uint8_t sleep, std::uint8_t*& slot_sleep) {
  if (2 * (size_ + 1) > slots_.size()) grow();
  const std::uint64_t mask = slots_.size() - 1;
  for (std::uint64_t i = f.a & mask;; i = (i + 1) & mask) {
    Slot& s = slots_[i];
    if (!s.used) {
      s = {f, sleep, true};
      ++size_;
      slot_sleep = &s.sleep;
      return true;
    }
    if (s.f == f) {
      slot_sleep = &s.sleep;
      return false;
    }
  }
}

void VisitedTable::grow() {
  std::vector<Slot> old(slots_.size() * 2);
  old.swap(slots_);
  const std::uint64_t mask = slots_.size() - 1;
  for (const Slot& s : old) {
    if (!s.used) continue;
    std::uint64_t i = s.f.a & mask;
    while (slots_[i].used) i = (i + 1) & mask;
    slots_[i] = s;
  }
}

BitState::BitState(std::int32_t log2) {
  if (log2 < 10 || log2 > 36) throw std::invalid_argument("bitstate: 2^log2 bits with log2 in 10..36");
  bits_.assign((std::uint64_t{1} << log2) / 64, 0);
  mask_ = (std::uint64_t{1} << log2) - 1;
}

bool BitState::insert(const Fingerprint& f) {
  const std::uint64_t probes[3] = {f.a & mask_, f.b & mask_, (f.a >> 32 ^ f.b << 7 ^ f.b >> 40) & mask_};
  bool fresh = false;
  for (std::uint64_t p : probes) {
    std::uint64_t& word = bits_[p / 64];
    const std::uint64_t bit = std::uint64_t{1} << (p % 64);
    if (word & bit) continue;
    word |= bit;
    ++set_;
    fresh = true;
  }
  return fresh;
}

double BitState::fill() const { return static_cast<double>(set_) / static_cast<double>(bits_.size() * 64); }

}  // namespace cpkv::properties::detail

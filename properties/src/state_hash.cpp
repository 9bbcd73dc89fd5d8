#include "state_hash.hpp"

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
  for (const sim::World::ByteSpan& s : world.flag_spans()) units_.push_back({s.offset, s.bytes, 0});
  flag_units_ = units_.size();
  for (std::int32_t r = 0; r < world.geometry().cp; ++r) {
    for (const sim::World::ByteSpan& s : {world.staging_span(r), world.dense_span(r, 0), world.dense_span(r, 1), world.pool_span(r),
                                          world.compact_span(r), world.scratch_span(r)}) {
      units_.push_back({s.offset, s.bytes, 0});
    }
  }
  std::size_t chunks = 0;
  for (Unit& u : units_) {
    u.first_chunk = chunks;
    chunks += (u.bytes + kChunk - 1) / kChunk;
  }
  chunks_.resize(chunks);
  for (const Unit& u : units_) {
    for (std::uint64_t c = 0; c * kChunk < u.bytes; ++c) {
      const Fingerprint h = chunk_hash(u.first_chunk + c, base() + u.offset + c * kChunk, std::min(kChunk, u.bytes - c * kChunk));
      chunks_[u.first_chunk + c] = h;
      total_.a += h.a;
      total_.b += h.b;
    }
  }
}

// Two lanes of a multiply-rotate hash over the chunk's words, each finished by splitmix64's mix
// and salted by the chunk's id, so equal bytes in two chunks hash apart.
Fingerprint RegionHash::chunk_hash(std::size_t chunk, const std::uint8_t* bytes, std::uint64_t n) const {
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
      const Fingerprint h = chunk_hash(chunk, now + c * kChunk, n);
      chunk_log_.emplace_back(chunk, chunks_[chunk]);
      total_.a += h.a - chunks_[chunk].a;
      total_.b += h.b - chunks_[chunk].b;
      chunks_[chunk] = h;
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
        const auto [chunk, before] = chunk_log_.back();
        chunk_log_.pop_back();
        total_.a += before.a - chunks_[chunk].a;
        total_.b += before.b - chunks_[chunk].b;
        chunks_[chunk] = before;
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
      const Fingerprint h = chunk_hash(u.first_chunk + c, base() + u.offset + c * kChunk, std::min(kChunk, u.bytes - c * kChunk));
      f.a += h.a;
      f.b += h.b;
    }
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

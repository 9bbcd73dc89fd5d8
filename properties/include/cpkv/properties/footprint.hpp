// The locations each step of a rank step machine reads and writes, for the explorer's partial-order
// reduction (docs/properties.md, "Partial-order reduction"). A location is an abstract object of the
// shared World: one rank's staging half, its dense half, its pool slab, its compact buffer, its
// barrier / collective / batch counter, its read epoch, its verdict, its path, a layer's barrier
// shadow, one current page's fillers word, the reset barrier. Two steps of different ranks are
// dependent when one writes a location the other reads or writes, except that two shadow arrivals
// (an OR of a rank bit) commute, and two reset-barrier increments commute. The checkers' reads are
// part of a step's reads: a violation a step finds is a function of the locations it reads.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "cpkv/sim/machine.hpp"

namespace cpkv::properties {

inline constexpr std::int32_t kLocations = 1024;

struct LocationSet {
  std::array<std::uint64_t, kLocations / 64> bits{};
  void add(std::int32_t location) { bits[location / 64] |= std::uint64_t{1} << (location % 64); }
  bool has(std::int32_t location) const { return (bits[location / 64] >> (location % 64)) & 1u; }
  LocationSet& operator|=(const LocationSet& o) {
    for (std::size_t i = 0; i < bits.size(); ++i) bits[i] |= o.bits[i];
    return *this;
  }
  bool intersects(const LocationSet& o) const {
    for (std::size_t i = 0; i < bits.size(); ++i) {
      if (bits[i] & o.bits[i]) return true;
    }
    return false;
  }
};

// One step's accesses by mode. An OR-write (a shadow arrival) commutes with another OR-write; an
// add (the reset barrier's fetch_add) commutes with another add; anything else conflicts with any
// access but a read against a read.
struct Footprint {
  LocationSet reads, writes, ors, adds;
  bool top = false;  // unknown: conflicts with everything
  Footprint& operator|=(const Footprint& o) {
    reads |= o.reads;
    writes |= o.writes;
    ors |= o.ors;
    adds |= o.adds;
    top = top || o.top;
    return *this;
  }
};
bool conflict(const Footprint& a, const Footprint& b);

// The byte objects of the World a step may write, for the undo log and the state hash: id
// rank * kObjectsPerRank + one of the object enum below (the flags and shadows are saved whole).
inline constexpr std::uint32_t kObjectsPerRank = 6;
enum ByteObject : std::uint32_t { obj_staging = 0, obj_dense0, obj_dense1, obj_pool, obj_compact, obj_scratch };

class Footprints {
 public:
  Footprints(std::int32_t cp, std::int32_t layers, std::int64_t fillers_per_half, harness::Mutant mutant);
  // The accesses of `step` when `machine` runs it (the step is one of the machine's current program).
  Footprint of(const sim::RankMachine& machine, const sim::Step& step) const;
  // The byte objects `step` may write.
  void written_objects(const sim::RankMachine& machine, const sim::Step& step, std::vector<std::uint32_t>& out) const;

  // Location ids (exposed for tests and the closure).
  std::int32_t rank_location(std::int32_t rank, std::int32_t what) const { return rank * kPerRank + what; }
  static constexpr std::int32_t kPerRank = 64;
  // dense0 + slot, dense1 + slot: one dense slot of half 0 / 1 (bytes and dense stamp; slots past 7
  // share slot 7's location); the half as a whole is every one of them. reading: the read epoch as
  // a whole; reading + 1 + L: its being L (16 layers, then as a whole).
  static constexpr std::int32_t kDenseSlots = 8;
  enum : std::int32_t { staging0 = 0, staging1, dense0 = 2, dense1 = 10, pool = 18, compact, barrier, collective, batch, verdict, path, reading = 31 };
  static constexpr std::int32_t kEpochLayers = 16;
  // Every slot of a dense half, or one slot.
  void dense_half(LocationSet& set, std::int32_t rank, std::int32_t half) const;
  void dense_slot(LocationSet& set, std::int32_t rank, std::int32_t half, std::int64_t slot) const;
  bool writes_dense(const Footprint& f, std::int32_t rank, std::int32_t half) const;

 private:
  std::int32_t shadow_location(std::int32_t layer) const;
  Footprint token_fill_of(const sim::RankMachine& m, const sim::Step& s) const;
  std::int32_t fillers_location(std::int32_t half, std::int64_t index) const;
  void all_ranks(LocationSet& set, std::int32_t what, std::int32_t except) const;
  void sync_of(const sim::RankMachine& machine, const sim::Step& step, Footprint& f) const;
  void read_epochs(Footprint& f, std::int32_t rank, std::int32_t layer, std::int32_t half) const;
  void write_epoch(Footprint& f, std::int32_t rank, std::int32_t layer) const;

  std::int32_t cp_;
  std::int32_t layers_;
  std::int64_t fillers_per_half_;
  sim::MutantPolicy mutant_;
};

}  // namespace cpkv::properties

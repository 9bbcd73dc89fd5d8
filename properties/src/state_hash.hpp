// The explorer's state store: an incremental 128-bit fingerprint of the World's bytes, an undo log
// of the objects a step writes, and the visited set (a table of fingerprints with each state's
// sleep set, or a bitstate array).
#pragma once

#include <cstdint>
#include <vector>

#include "cpkv/sim/world.hpp"

namespace cpkv::properties::detail {

struct Fingerprint {
  std::uint64_t a = 0, b = 0;
  bool operator==(const Fingerprint&) const = default;
};

// The World's bytes as units (the flag spans, then per rank its staging, two dense halves, pool,
// compact and scratch), each cut in 64-byte chunks. The fingerprint is the sum over chunks of two
// independent 64-bit hashes of (chunk id, bytes): a step changes few chunks, and only those are
// rehashed. The undo log holds the bytes of the units a step may write, saved before it runs.
class RegionHash {
 public:
  explicit RegionHash(sim::World& world);
  Fingerprint value() const { return total_; }
  std::size_t flag_units() const { return flag_units_; }
  std::size_t units() const { return units_.size(); }
  std::size_t unit_of(std::uint32_t object) const { return flag_units_ + object; }

  // Saves the units before a step (a mark to undo to), then folds the changed chunks in.
  std::size_t mark() const { return log_.size(); }
  void save(std::size_t unit);
  void fold_saved_since(std::size_t mark);
  void undo_to(std::size_t mark);
  // From scratch, for the checks of verify_footprints.
  Fingerprint full() const;

 private:
  struct Unit {
    std::uint64_t offset = 0, bytes = 0;
    std::size_t first_chunk = 0;
  };
  struct Saved {
    std::size_t unit = 0;
    std::size_t at = 0;        // bytes_ offset
    std::size_t changes = 0;   // chunk_log_ size before its fold
    bool folded = false;
  };
  Fingerprint chunk_hash(std::size_t chunk, const std::uint8_t* bytes, std::uint64_t n) const;
  std::uint8_t* base() const { return world_->region().base(); }

  sim::World* world_;
  std::vector<Unit> units_;
  std::size_t flag_units_ = 0;
  std::vector<Fingerprint> chunks_;
  Fingerprint total_;
  std::vector<Saved> log_;
  std::vector<std::uint8_t> bytes_;
  std::vector<std::pair<std::size_t, Fingerprint>> chunk_log_;  // (chunk, its hash before)
};

// Open addressing over 128-bit fingerprints; each slot keeps the state's sleep set (a rank mask).
class VisitedTable {
 public:
  VisitedTable();
  // The slot of `f` (inserted with `sleep` when new): true when it was new.
  bool insert(const Fingerprint& f, std::uint8_t sleep, std::uint8_t*& slot_sleep);
  std::uint64_t size() const { return size_; }

 private:
  struct Slot {
    Fingerprint f;
    std::uint8_t sleep = 0;
    bool used = false;
  };
  void grow();
  std::vector<Slot> slots_;
  std::uint64_t size_ = 0;
};

// Bitstate (supertrace) hashing: 2^log2 bits, three per state.
class BitState {
 public:
  explicit BitState(std::int32_t log2);
  bool insert(const Fingerprint& f);  // true when some bit was clear (taken as new)
  double fill() const;                // share of bits set
 private:
  std::vector<std::uint64_t> bits_;
  std::uint64_t mask_;
  std::uint64_t set_ = 0;
};

}  // namespace cpkv::properties::detail

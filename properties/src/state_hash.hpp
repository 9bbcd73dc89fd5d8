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
// compact and scratch), each cut in 64-byte chunks. Each chunk has a relative hash of (its index
// within its bucket, bytes), a bucket being the flag spans or one rank's six units, and an absolute
// hash, the relative one salted by the chunk's id. The fingerprint is the sum of the absolute
// hashes: a step changes few chunks, and only those are rehashed. Per bucket the sums of both are
// kept too, so that symmetry (Orbits) can take an idle rank's part out of the fingerprint and put
// it back rank-relative: equal bytes in two ranks' units give equal relative sums. The undo log
// holds the bytes of the units a step may write, saved before it runs.
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
  // Bucket 0: the flag spans; bucket 1 + r: rank r's units. Sums of the absolute and relative hashes.
  Fingerprint bucket_absolute(std::size_t bucket) const { return absolute_[bucket]; }
  Fingerprint bucket_relative(std::size_t bucket) const { return relative_[bucket]; }
  // Chunk by chunk: a flag chunk's id, offset and size, and its absolute hash now.
  struct ChunkSpan {
    std::size_t chunk = 0;
    std::uint64_t offset = 0, bytes = 0;
  };
  std::vector<ChunkSpan> flag_chunks() const;
  Fingerprint chunk_absolute(std::size_t chunk) const { return absolute(chunk, chunks_[chunk]); }
  static Fingerprint hash_bytes(std::uint64_t salt, const std::uint8_t* bytes, std::uint64_t n);

 private:
  struct Unit {
    std::uint64_t offset = 0, bytes = 0;
    std::size_t first_chunk = 0;
    std::size_t bucket = 0;
    std::size_t bucket_first_chunk = 0;  // the first chunk of its bucket
  };
  struct Saved {
    std::size_t unit = 0;
    std::size_t at = 0;        // bytes_ offset
    std::size_t changes = 0;   // chunk_log_ size before its fold
    bool folded = false;
  };
  Fingerprint chunk_hash(std::size_t chunk, const std::uint8_t* bytes, std::uint64_t n) const;
  static Fingerprint absolute(std::size_t chunk, const Fingerprint& relative);
  void set_chunk(const Unit& u, std::size_t chunk, const Fingerprint& relative);
  std::uint8_t* base() const { return world_->region().base(); }

  sim::World* world_;
  std::vector<Unit> units_;
  std::size_t flag_units_ = 0;
  std::vector<Fingerprint> chunks_;  // relative hashes
  Fingerprint total_;
  std::vector<Fingerprint> absolute_, relative_;  // per bucket
  std::vector<Saved> log_;
  std::vector<std::uint8_t> bytes_;
  struct ChunkChange {
    std::size_t unit = 0, chunk = 0;
    Fingerprint before;  // its relative hash before
  };
  std::vector<ChunkChange> chunk_log_;
};

// Symmetry over the idle ranks (docs/properties.md, "Symmetry"): ranks with no page to write, no
// referenced prefix page and no query token, interchangeable. The canonical fingerprint takes each
// idle rank's part out of the state's (its units, its entries of the rank-indexed flag arrays, its
// bits of the barrier shadows, its machine's steps and batch), hashes each part rank-relatively and
// adds them as a multiset: two states get the same key when one is the other with the idle ranks
// permuted. The permutation found (sorting the idle ranks by their parts' hashes) maps the sleep
// sets kept with the visited states.
class Orbits {
 public:
  // forget_shadow_bits: test-only, a planted bug (ExploreOptions::plant_forget_shadow_bits).
  Orbits(const sim::World& world, const RegionHash& hash, std::uint8_t idle, bool forget_shadow_bits = false);
  std::uint8_t idle() const { return idle_; }
  // steps and batches: per rank, its machine's. to_canonical[r]: rank r's place in the canonical state.
  Fingerprint key(const RegionHash& hash, const std::vector<std::uint64_t>& steps, const std::vector<std::uint64_t>& batches,
                  std::vector<std::uint8_t>& to_canonical) const;

 private:
  struct Range {
    std::uint64_t offset = 0, bytes = 0;
  };
  // A flag chunk holding some idle rank's entry or shadow bits: where, in the chunk, to clear.
  struct MaskedChunk {
    RegionHash::ChunkSpan span;
    std::vector<Range> clear;                // offsets within the chunk
    std::vector<std::uint64_t> shadows;      // offsets within the chunk of barrier shadow words
  };
  Fingerprint part(const RegionHash& hash, std::int32_t r, std::uint64_t steps, std::uint64_t batch) const;

  const sim::World* world_;
  std::uint8_t idle_;
  bool forget_shadow_bits_;
  std::vector<std::vector<Range>> ranges_;  // per rank: its entries of the rank-indexed flag arrays
  std::vector<std::uint64_t> shadows_;      // offsets of the barrier shadow words
  std::vector<MaskedChunk> masked_;
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

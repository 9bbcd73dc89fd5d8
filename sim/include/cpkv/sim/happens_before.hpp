#pragma once
// Hazards judged by happens-before, not by one run's timing (invariant 2, PROTOCOL.md section 6).
//
// The state checker (checkers.hpp) judges the one interleaving that happened: a write into a parity
// half while a peer still reads it is seen only where the two really overlapped. Here, as
// ThreadSanitizer judges data races, every rank keeps a vector clock; program order advances it and
// synchronization joins it:
//   - a pass of barrier phase k joins the clocks of every arrival of phase k seen so far (a counting
//     barrier passes k once every counter reached k);
//   - a collective (the simulator's collectives and batch barrier) is the same with its own phases.
// A write to a staging location (owner, half, current index) and a read of it by another rank race
// when neither happens before the other. The verdict depends only on the order the synchronization
// imposes, so a lucky interleaving (the reader was done before the writer came) still shows it.
//
// judge_event_log reads a scheduled run's event log (docs/event-log.md); the Python conformance
// harness's per-batch events use the same Clocks through the bindings (cpkv._cpkv.HappensBefore).
#include <cstdint>
#include <istream>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace cpkv::sim {

// Race lines reported per batch (the first ones; the rest are counted): one hazard repeats on every
// slot and layer, and the first says what is wrong.
inline constexpr std::size_t kRaceLinesPerBatchMax = 4;
// Race pairs kept per batch: a racy exchange races on every slot of every layer, and the first few
// say what is wrong (memory stays bounded whatever the batch).
inline constexpr std::size_t kRacesKeptMax = 10'000;

struct HbAccess {
  std::int32_t rank = 0;
  std::int64_t epoch = 0;  // the accessing rank's own clock component at the access
  std::int32_t layer = 0;
  std::string what;        // "zero", "fill" or "read"
};

// Locations of section 12's token rows (a rank's all-gather send rows, by current row) use halves
// kHbTokenRowHalf + layer % 2, apart from the staging halves 0 and 1.
// Their slot is call * kHbTokenRowStride + current row: the collective that sends the row (each
// buffer kind's all-gather has send rows of its own).
inline constexpr std::int32_t kHbTokenRowHalf = 2;
inline constexpr std::int64_t kHbTokenRowStride = std::int64_t{1} << 32;

struct HbLocation {
  std::int32_t owner = 0;
  std::int32_t half = 0;
  std::int64_t slot = 0;  // the owner's current index
  auto operator<=>(const HbLocation&) const = default;
};

struct HbRace {
  HbAccess write;
  HbAccess read;
  HbLocation location;
};

// Vector clocks over cp ranks and the staging locations they touch (FastTrack's shape: per location,
// the last write and the reads since it). Memory: one cell per location touched, one clock per
// (barrier kind, phase) arrived at.
class HbClocks {
 public:
  explicit HbClocks(std::int32_t cp);

  void arrive(std::int32_t rank, const std::string& kind, std::int64_t phase);
  // The pass joins every arrival of its phase seen so far (an arrival not yet seen gives no order).
  void pass(std::int32_t rank, const std::string& kind, std::int64_t phase);
  // A collective every rank takes part in, as one step: each leaves it after all of them entered.
  void join_all();
  void write(std::int32_t rank, const HbLocation& location, std::int32_t layer, const std::string& what);
  void read(std::int32_t rank, const HbLocation& location, std::int32_t layer);

  // The races found since the last take (then forgotten), and the locations' history with them.
  std::vector<HbRace> take_races();
  void forget_locations() { cells_.clear(); }
  std::int32_t cp() const { return cp_; }

 private:
  struct Cell {
    bool written = false;
    HbAccess write;
    std::map<std::int32_t, HbAccess> reads;
  };
  std::int64_t tick(std::int32_t rank);
  bool before(const HbAccess& access, std::int32_t rank) const;
  void join(std::int32_t rank, const std::vector<std::int64_t>& other);
  void race(const HbAccess& write, const HbAccess& read, const HbLocation& location);

  std::int32_t cp_;
  std::vector<std::vector<std::int64_t>> clock_;
  std::map<std::tuple<std::string, std::int64_t>, std::map<std::int32_t, std::vector<std::int64_t>>> arrivals_;
  std::map<HbLocation, Cell> cells_;
  std::vector<HbRace> races_;
};

// One invariant 2 line per distinct hazard (writer, reader, their layers, the write's kind), at most
// `limit`, then one line counting the rest.
std::vector<std::string> race_lines(std::int64_t batch, const std::vector<HbRace>& races, std::size_t limit = kRaceLinesPerBatchMax);

// A line of an event log that is not `rank op layer x y z`; what() names the line.
class EventLogError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Happens-before over a scheduled run's event log of a staging variant (docs/event-log.md): the race
// lines of each batch (a batch is the steps from rank 0's batch_begin to its next). halves: the
// parity halves the run used (2; 1 for a run of the single_half planted bug: the log names the
// layer, and the half is the layer's under the run's rotation). A line may carry a seventh field,
// the half the step used, which then overrides the layer's (a log written by another tool).
std::vector<std::string> judge_event_log(std::istream& log, std::int32_t cp, std::int32_t halves = 2);

}  // namespace cpkv::sim

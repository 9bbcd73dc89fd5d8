// Vector clocks over the staging exchange's writes, reads and synchronization (happens_before.hpp).
#include "cpkv/sim/happens_before.hpp"

#include <algorithm>
#include <charconv>
#include <set>
#include <sstream>

#include <fmt/format.h>

namespace cpkv::sim {

HbClocks::HbClocks(std::int32_t cp) : cp_(cp), clock_(static_cast<std::size_t>(std::max(cp, 0)), std::vector<std::int64_t>(static_cast<std::size_t>(std::max(cp, 0)), 0)) {
  if (cp < 1) throw std::invalid_argument(fmt::format("HbClocks: cp {} is not at least 1", cp));
  for (std::int32_t r = 0; r < cp; ++r) clock_[r][r] = 1;
}

// Every access and arrival ticks first, so this is where a rank out of range is refused.
std::int64_t HbClocks::tick(std::int32_t rank) {
  if (rank < 0 || rank >= cp_) throw std::out_of_range(fmt::format("HbClocks: rank {} is not in 0..{}", rank, cp_ - 1));
  return ++clock_[rank][rank];
}

bool HbClocks::before(const HbAccess& access, std::int32_t rank) const {
  return access.rank == rank || access.epoch <= clock_[rank][access.rank];
}

void HbClocks::join(std::int32_t rank, const std::vector<std::int64_t>& other) {
  std::vector<std::int64_t>& mine = clock_[rank];
  for (std::int32_t q = 0; q < cp_; ++q) mine[q] = std::max(mine[q], other[q]);
}

void HbClocks::arrive(std::int32_t rank, const std::string& kind, std::int64_t phase) {
  tick(rank);
  arrivals_[{kind, phase}][rank] = clock_[rank];
}

void HbClocks::pass(std::int32_t rank, const std::string& kind, std::int64_t phase) {
  if (rank < 0 || rank >= cp_) throw std::out_of_range(fmt::format("HbClocks: rank {} is not in 0..{}", rank, cp_ - 1));
  const auto found = arrivals_.find({kind, phase});
  if (found != arrivals_.end()) {
    for (const auto& [peer, arrived] : found->second) join(rank, arrived);
  }
  tick(rank);
}

void HbClocks::join_all() {
  std::vector<std::int64_t> top(static_cast<std::size_t>(cp_), 0);
  for (const auto& c : clock_) {
    for (std::int32_t q = 0; q < cp_; ++q) top[q] = std::max(top[q], c[q]);
  }
  for (std::int32_t r = 0; r < cp_; ++r) {
    join(r, top);
    tick(r);
  }
}

void HbClocks::race(const HbAccess& write, const HbAccess& read, const HbLocation& location) {
  if (races_.size() < kRacesKeptMax) races_.push_back({write, read, location});
}

void HbClocks::write(std::int32_t rank, const HbLocation& location, std::int32_t layer, const std::string& what) {
  const HbAccess access{rank, tick(rank), layer, what};
  Cell& cell = cells_[location];
  for (const auto& [reader, read] : cell.reads) {
    if (!before(read, rank)) race(access, read, location);
  }
  cell.written = true;
  cell.write = access;
  cell.reads.clear();
}

void HbClocks::read(std::int32_t rank, const HbLocation& location, std::int32_t layer) {
  const HbAccess access{rank, tick(rank), layer, "read"};
  Cell& cell = cells_[location];
  if (cell.written && !before(cell.write, rank)) race(cell.write, access, location);
  cell.reads[rank] = access;
}

std::vector<HbRace> HbClocks::take_races() {
  std::vector<HbRace> taken;
  taken.swap(races_);
  return taken;
}

std::vector<std::string> race_lines(std::int64_t batch, const std::vector<HbRace>& races, std::size_t limit) {
  std::vector<std::string> lines;
  std::set<std::tuple<std::int32_t, std::int32_t, std::int32_t, std::int32_t, std::string>> seen;
  for (const HbRace& r : races) {
    if (!seen.insert({r.write.rank, r.read.rank, r.write.layer, r.read.layer, r.write.what}).second) continue;
    if (lines.size() < limit && r.location.half >= kHbTokenRowHalf) {
      // A token row of a section 12 exchange (its send rows, read through the collective).
      lines.push_back(fmt::format("invariant 2 (parity-half reuse safety): batch {}: rank {}'s {} of its all-gather row for current row {} on layer {} "
                                  "and rank {}'s read of it through the collective on layer {} are concurrent (happens-before: the write is "
                                  "not before the writer's entry into the collective, whatever this run's timing)",
                                  batch, r.write.rank, r.write.what, r.location.slot % kHbTokenRowStride, r.write.layer, r.read.rank, r.read.layer));
    } else if (lines.size() < limit) {
      lines.push_back(fmt::format("invariant 2 (parity-half reuse safety): batch {}: rank {}'s {} of its half {} slot {} on layer {} and rank {}'s "
                                  "read of it on layer {} are concurrent (happens-before: no barrier pass or collective orders them, "
                                  "whatever this run's timing)",
                                  batch, r.write.rank, r.write.what, r.location.half, r.location.slot, r.write.layer, r.read.rank, r.read.layer));
    }
  }
  if (seen.size() > limit) {
    lines.push_back(fmt::format("invariant 2 (parity-half reuse safety): batch {}: {} more concurrent write/read pairs (happens-before)", batch,
                                seen.size() - limit));
  }
  return lines;
}

namespace {

struct LogLine {
  std::int32_t rank = 0;
  std::string op;
  std::int32_t layer = 0;
  std::int64_t x = 0, y = 0, z = 0;
  std::int32_t half = -1;  // the optional seventh field; -1: the layer's
};

bool parse_integer(const std::string& text, std::int64_t& value) {
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc{} && end == text.data() + text.size();
}

LogLine parse_line(const std::string& line, std::int64_t number, std::int32_t cp) {
  std::istringstream in(line);
  std::vector<std::string> fields;
  for (std::string field; in >> field;) fields.push_back(field);
  if (fields.size() != 6 && fields.size() != 7) {
    throw EventLogError(fmt::format("event log line {}: {} fields, expected 6 (rank op layer x y z)", number, fields.size()));
  }
  std::int64_t values[6] = {0, 0, 0, 0, 0, -1};
  const std::size_t numeric[6] = {0, 2, 3, 4, 5, 6};
  for (std::size_t k = 0; k < 6; ++k) {
    if (numeric[k] >= fields.size()) continue;
    if (!parse_integer(fields[numeric[k]], values[k])) {
      throw EventLogError(fmt::format("event log line {}: '{}' is not rank op layer x y z (integers)", number, line));
    }
  }
  if (values[0] < 0 || values[0] >= cp) throw EventLogError(fmt::format("event log line {}: rank {} is not in 0..{}", number, values[0], cp - 1));
  if (fields.size() == 7 && (values[5] < 0 || values[5] > 1)) {
    throw EventLogError(fmt::format("event log line {}: half {} is not 0 or 1", number, values[5]));
  }
  return {static_cast<std::int32_t>(values[0]), fields[1], static_cast<std::int32_t>(values[1]), values[2], values[3], values[4],
          static_cast<std::int32_t>(values[5])};
}

// Ops that write the rank's own staging at current index x, and the barrier kinds of the sync ops.
const std::map<std::string, std::string> kStagingWrites = {{"zero_own", "zero"}, {"fill", "fill"}, {"publish", "fill"}};
const std::map<std::string, std::string> kArriveOps = {{"arrive", "barrier"}, {"coll_arrive", "collective"}, {"batch_arrive", "batch"}};
const std::map<std::string, std::string> kPassOps = {{"wait", "barrier"}, {"coll_wait", "collective"}, {"batch_wait", "batch"}};

// One log line applied to the clocks; `arrivals` counts each rank's arrivals per kind (a rank's
// n-th arrival of a kind is phase n, and its pass waits for the phase it last arrived at).
void apply(HbClocks& clocks, const LogLine& l, std::int32_t halves, std::map<std::pair<std::int32_t, std::string>, std::int64_t>& arrivals) {
  const std::int32_t half = l.half >= 0 ? l.half : (halves == 2 ? ((l.layer % 2) + 2) % 2 : 0);
  if (const auto w = kStagingWrites.find(l.op); w != kStagingWrites.end()) {
    clocks.write(l.rank, {l.rank, half, l.x}, l.layer, w->second);
  } else if (l.op == "gather" && l.z >= clocks.cp()) {
    clocks.read(l.rank, {static_cast<std::int32_t>(l.z % clocks.cp()), half, l.y}, l.layer);  // y: the source's current index
  } else if (const auto a = kArriveOps.find(l.op); a != kArriveOps.end()) {
    clocks.arrive(l.rank, a->second, ++arrivals[{l.rank, a->second}]);
  } else if (const auto p = kPassOps.find(l.op); p != kPassOps.end()) {
    clocks.pass(l.rank, p->second, arrivals[{l.rank, p->second}]);
  }
}

}  // namespace

std::vector<std::string> judge_event_log(std::istream& log, std::int32_t cp, std::int32_t halves) {
  if (halves != 1 && halves != 2) throw std::invalid_argument(fmt::format("judge_event_log: halves {} is not 1 or 2", halves));
  HbClocks clocks(cp);
  std::map<std::pair<std::int32_t, std::string>, std::int64_t> arrivals;
  std::vector<std::string> out;
  std::int64_t batch = -1;
  std::string line;
  for (std::int64_t number = 1; std::getline(log, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const LogLine parsed = parse_line(line, number, cp);
    if (parsed.op == "batch_begin" && parsed.rank == 0) {
      if (batch >= 0) {
        for (std::string& l : race_lines(batch, clocks.take_races())) out.push_back(std::move(l));
      }
      clocks.take_races();
      clocks.forget_locations();
      ++batch;
    }
    apply(clocks, parsed, halves, arrivals);
  }
  for (std::string& l : race_lines(std::max<std::int64_t>(batch, 0), clocks.take_races())) out.push_back(std::move(l));
  return out;
}

}  // namespace cpkv::sim

// Fault knobs of the free-running simulator: the swarm draw, their one-line description, and the
// injector a rank consults before every step.
#include <chrono>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "cpkv/model/content.hpp"
#include "cpkv/model/limits.hpp"
#include "fault_injector.hpp"

namespace cpkv::sim {

namespace {

std::string_view to_string(SlowRotation rotation) {
  switch (rotation) {
    case SlowRotation::fixed: return "fixed";
    case SlowRotation::per_layer: return "per_layer";
    case SlowRotation::per_batch: return "per_batch";
  }
  return "?";
}

std::string_view to_string(YieldAt at) {
  switch (at) {
    case YieldAt::nowhere: return "nowhere";
    case YieldAt::writes: return "writes";
    case YieldAt::reads: return "reads";
    case YieldAt::flags: return "flags";
    case YieldAt::every_step: return "every_step";
  }
  return "?";
}

template <typename T>
T pick(std::mt19937_64& rng, const std::vector<T>& values) {
  return values[std::uniform_int_distribution<std::size_t>(0, values.size() - 1)(rng)];
}


}  // namespace

FaultOptions swarm_faults(std::uint64_t seed) {
  // Knob values span "off" to "heavy": each run stresses a different mix, as VOPR's swarm does. The
  // holds are always on (every bug class needs one of them); their bounds differ. The largest bound
  // keeps a correct run of a bundled trace within a second of holds.
  std::mt19937_64 rng(model::mix64(seed ^ 0x5357'4152'4dULL));  // "SWARM": apart from content and rank streams
  FaultOptions f;
  f.seed = seed;
  f.delay_us_max = pick<std::int32_t>(rng, {20, 100, 500, 2000});
  f.flag_write_delay_probability = pick<double>(rng, {0.0, 0.01, 0.05, 0.2});
  f.gather_delay_probability = pick<double>(rng, {0.0, 0.002, 0.01, 0.05});
  f.write_delay_probability = pick<double>(rng, {0.0, 0.01, 0.05});
  // In a correct run both holds end as soon as the peers wait at a barrier, so the bounds can be long
  // enough for a loaded machine, where a peer may wait a hundred milliseconds for a core.
  f.slow_producer_delay_us = pick<std::int32_t>(rng, {50000, 200000, 500000});
  f.slow_reader_delay_us = pick<std::int32_t>(rng, {100000, 300000, 1000000});
  f.slow_rotation = pick<SlowRotation>(rng, {SlowRotation::fixed, SlowRotation::per_layer, SlowRotation::per_batch});
  f.slow_rank = std::uniform_int_distribution<std::int32_t>(0, model::limits::cp_max - 1)(rng);  // taken modulo cp
  f.slow_reader_offset = std::uniform_int_distribution<std::int32_t>(1, model::limits::cp_max - 1)(rng);
  f.yield_at = pick<YieldAt>(rng, {YieldAt::nowhere, YieldAt::writes, YieldAt::reads, YieldAt::flags, YieldAt::every_step});
  f.yield_probability = pick<double>(rng, {0.05, 0.25, 1.0});
  // A waiter that sleeps between polls: busy waiters see every count a barrier passes through, real
  // ranks (descheduled, or polling a flag across NVLink) do not.
  f.wait_poll_sleep_us = pick<std::int32_t>(rng, {10, 50, 200});
  return f;
}

std::string describe(const FaultOptions& f) {
  return fmt::format(
      "fault seed {} | delay_us_max {} | delay p: flag {} gather {} write {} | slow producer hold {} us, reader hold {} us, "
      "rank {} reader +{} rotation {} | yield {} p {} | poll sleep {} us",
      f.seed, f.delay_us_max, f.flag_write_delay_probability, f.gather_delay_probability, f.write_delay_probability, f.slow_producer_delay_us,
      f.slow_reader_delay_us, f.slow_rank, f.slow_reader_offset, to_string(f.slow_rotation), to_string(f.yield_at), f.yield_probability,
      f.wait_poll_sleep_us);
}

// ---------------------------------------------------------------------------------------------

namespace {
// How often a hold looks at the peers' positions: fine next to the millisecond bounds.
constexpr std::int64_t kHoldPollUs = 100;

bool writes_shared_data(Op op) { return op == Op::zero_own || op == Op::zero_dense || op == Op::fill || op == Op::publish; }
}  // namespace

FaultInjector::FaultInjector(const World& world, const FaultOptions& faults, std::int32_t rank, std::int32_t cp, std::int32_t layers)
    : world_(world),
      faults_(faults),
      rank_(rank),
      cp_(cp),
      layers_(layers),
      rng_(model::mix64(faults.seed ^ (0x1000ULL + rank))),
      delay_us_(1, std::max(1, faults.delay_us_max)) {}

std::int32_t FaultInjector::slow_rank_of(Role role, std::int64_t batch_index, std::int32_t layer) const {
  const std::int64_t batch = std::max<std::int64_t>(batch_index, 0);
  std::int64_t producer = faults_.slow_rank;
  if (faults_.slow_rotation == SlowRotation::per_layer) producer += batch * layers_ + layer;
  if (faults_.slow_rotation == SlowRotation::per_batch) producer += batch;
  const std::int64_t rank = role == Role::producer ? producer : producer + faults_.slow_reader_offset;
  return static_cast<std::int32_t>(rank % cp_);
}

void FaultInjector::enter_layer(const Step& step, std::int64_t batch_index) {
  if (step.layer == layer_ && batch_index == batch_) return;
  batch_ = batch_index;
  layer_ = step.layer;
  produced_slowly_ = false;
  read_slowly_ = false;
  arrived_in_layer_ = false;
}

// Until a peer has finished the layer's reads (it read this rank's pages unfilled: the window a
// broken barrier opens), or every peer waits for this rank (a correct barrier: nothing to open).
void FaultInjector::hold_producer() const {
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(faults_.slow_producer_delay_us);
  while (std::chrono::steady_clock::now() < until) {
    bool every_peer_waits = true;
    for (std::int32_t p = 0; p < cp_; ++p) {
      if (p == rank_) continue;
      if (peer_finished_reading(p)) return;
      every_peer_waits = every_peer_waits && peer_waits_for_this_rank(p);
    }
    if (every_peer_waits) return;
    std::this_thread::sleep_for(std::chrono::microseconds(kHoldPollUs));
  }
}

template <typename Predicate>
void FaultInjector::hold(std::int32_t bound_us, Predicate peer_moved_on) const {
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(bound_us);
  while (std::chrono::steady_clock::now() < until) {
    for (std::int32_t p = 0; p < cp_; ++p) {
      if (p != rank_ && peer_moved_on(p)) return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(kHoldPollUs));
  }
}

// Where a peer is relative to this rank's (batch, layer): -1 behind or in an earlier layer, 0 in
// this layer, 1 in a later layer of this batch, at this batch's closing batch barrier, or in a
// later batch. A batch's program opens with batch_begin, batch_arrive, batch_wait (steps 0..2), so
// a batch step past those is the closing barrier: the peer has finished every layer.
int FaultInjector::peer_layer_order(const RankPosition& pos) const {
  constexpr std::int64_t kOpeningBatchSteps = 3;
  const std::int64_t batch = pos.batch.load(std::memory_order_relaxed);
  if (batch != batch_) return batch > batch_ ? 1 : -1;
  const std::int32_t layer = pos.layer.load(std::memory_order_relaxed);
  if (layer >= 0) return layer > layer_ ? 1 : layer == layer_ ? 0 : -1;
  return pos.step.load(std::memory_order_relaxed) >= kOpeningBatchSteps ? 1 : -1;
}

// The peer is at the end of this layer or past it: it has done every read of the layer.
bool FaultInjector::peer_finished_reading(std::int32_t peer) const {
  const RankPosition& pos = world_.position(peer);
  const int order = peer_layer_order(pos);
  return order > 0 || (order == 0 && static_cast<Op>(pos.op.load(std::memory_order_relaxed)) == Op::layer_end);
}

// The peer waits in this layer at a barrier or collective that cannot open before this rank,
// which has not arrived at one yet this layer, arrives after its fill: holding longer opens no window.
bool FaultInjector::peer_waits_for_this_rank(std::int32_t peer) const {
  if (arrived_in_layer_) return false;
  const RankPosition& pos = world_.position(peer);
  const Op op = static_cast<Op>(pos.op.load(std::memory_order_relaxed));
  return peer_layer_order(pos) == 0 && (op == Op::wait || op == Op::coll_wait);
}

// The peer is past a later layer's zero and fill (or past every layer of this batch).
bool FaultInjector::peer_wrote_later_layer(std::int32_t peer) const {
  const RankPosition& pos = world_.position(peer);
  const Op op = static_cast<Op>(pos.op.load(std::memory_order_relaxed));
  return peer_layer_order(pos) > 0 && op != Op::layer_begin && op != Op::local_prefix && !writes_shared_data(op);
}

void FaultInjector::between_polls() const {
  if (faults_.wait_poll_sleep_us > 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(faults_.wait_poll_sleep_us));
  } else {
    std::this_thread::yield();
  }
}

bool FaultInjector::yields_before(Op op) const {
  switch (faults_.yield_at) {
    case YieldAt::nowhere: return false;
    case YieldAt::writes: return writes_shared_data(op);
    case YieldAt::reads: return op == Op::gather;
    case YieldAt::flags: return op == Op::arrive || op == Op::wait || op == Op::coll_arrive || op == Op::coll_wait;
    case YieldAt::every_step: return true;
  }
  return false;
}

void FaultInjector::before(const Step& step, std::int64_t batch_index) {
  const Op op = step.op;
  // A coin is drawn only where its probability is non-zero, so a knob that is off draws nothing.
  const auto chance = [this](double probability) { return probability > 0.0 && coin_(rng_) < probability; };
  const auto sleep_us = [](std::int64_t us) { std::this_thread::sleep_for(std::chrono::microseconds(us)); };
  if ((op == Op::arrive || op == Op::coll_arrive) && chance(faults_.flag_write_delay_probability)) sleep_us(delay_us_(rng_));
  if (op == Op::gather && chance(faults_.gather_delay_probability)) sleep_us(delay_us_(rng_));
  if (writes_shared_data(op) && chance(faults_.write_delay_probability)) sleep_us(delay_us_(rng_));
  if (step.layer >= 0) {
    enter_layer(step, batch_index);
    if (op == Op::arrive || op == Op::coll_arrive) arrived_in_layer_ = true;
    if (op == Op::fill && !produced_slowly_ && faults_.slow_producer_delay_us > 0 && slow_rank_of(Role::producer, batch_index, step.layer) == rank_) {
      produced_slowly_ = true;
      hold_producer();
    }
    // Only a rank that read a peer's page this layer has a read epoch to hold open, and only a
    // later layer of the same batch can race with it (a batch barrier ends every batch).
    if (op == Op::layer_end && step.layer + 1 < layers_ && !read_slowly_ && faults_.slow_reader_delay_us > 0 && slow_rank_of(Role::reader, batch_index, step.layer) == rank_ &&
        world_.reading_layer(rank_).load(std::memory_order_acquire) == step.layer) {
      read_slowly_ = true;
      hold(faults_.slow_reader_delay_us, [this](std::int32_t p) { return peer_wrote_later_layer(p); });
    }
  }
  if (yields_before(op) && chance(faults_.yield_probability)) std::this_thread::yield();
}

}  // namespace cpkv::sim

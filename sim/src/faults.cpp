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

std::string_view to_string(SlowAt at) {
  switch (at) {
    case SlowAt::fill: return "fill";
    case SlowAt::gather: return "gather";
    case SlowAt::read_end: return "read_end";
    case SlowAt::arrive: return "arrive";
  }
  return "?";
}

std::string_view to_string(SlowRotation rotation) {
  switch (rotation) {
    case SlowRotation::none: return "none";
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
  // Knob values span "off" to "heavy": each run stresses a different mix, as VOPR's swarm does.
  // The largest values keep a layer's injected delay in the milliseconds, so a process-mode replay
  // of the bundled traces stays within seconds.
  std::mt19937_64 rng(model::mix64(seed ^ 0x5357'4152'4dULL));  // "SWARM": apart from content and rank streams
  FaultOptions f;
  f.seed = seed;
  f.delay_us_max = pick<std::int32_t>(rng, {20, 100, 500, 2000});
  f.flag_write_delay_probability = pick<double>(rng, {0.0, 0.01, 0.05, 0.2});
  f.gather_delay_probability = pick<double>(rng, {0.0, 0.002, 0.01, 0.05});
  f.write_delay_probability = pick<double>(rng, {0.0, 0.01, 0.05});
  f.slow_producer_delay_us = pick<std::int32_t>(rng, {500, 2000, 5000});
  f.slow_at = pick<SlowAt>(rng, {SlowAt::fill, SlowAt::gather, SlowAt::read_end, SlowAt::arrive});
  f.slow_rotation = pick<SlowRotation>(rng, {SlowRotation::none, SlowRotation::fixed, SlowRotation::per_layer, SlowRotation::per_batch});
  f.slow_rank = std::uniform_int_distribution<std::int32_t>(0, model::limits::cp_max - 1)(rng);  // taken modulo cp
  f.yield_at = pick<YieldAt>(rng, {YieldAt::nowhere, YieldAt::writes, YieldAt::reads, YieldAt::flags, YieldAt::every_step});
  f.yield_probability = pick<double>(rng, {0.05, 0.25, 1.0});
  return f;
}

std::string describe(const FaultOptions& f) {
  return fmt::format("fault seed {} | delay_us_max {} | delay p: flag {} gather {} write {} | slow {} us at {} rank {} rotation {} | yield {} p {}",
                     f.seed, f.delay_us_max, f.flag_write_delay_probability, f.gather_delay_probability, f.write_delay_probability,
                     f.slow_producer_delay_us, to_string(f.slow_at), f.slow_rank, to_string(f.slow_rotation), to_string(f.yield_at),
                     f.yield_probability);
}

// ---------------------------------------------------------------------------------------------

FaultInjector::FaultInjector(const FaultOptions& faults, std::int32_t rank, std::int32_t cp, std::int32_t layers)
    : faults_(faults),
      rank_(rank),
      cp_(cp),
      layers_(layers),
      rng_(model::mix64(faults.seed ^ (0x1000ULL + rank))),
      delay_us_(1, std::max(1, faults.delay_us_max)) {}

void FaultInjector::sleep_us(std::int64_t us) const { std::this_thread::sleep_for(std::chrono::microseconds(us)); }

std::int32_t FaultInjector::slow_rank_of(std::int64_t batch_index, std::int32_t layer) const {
  const std::int64_t batch = std::max<std::int64_t>(batch_index, 0);
  switch (faults_.slow_rotation) {
    case SlowRotation::none: return -1;
    case SlowRotation::fixed: return faults_.slow_rank % cp_;
    case SlowRotation::per_layer: return static_cast<std::int32_t>((batch * layers_ + layer + faults_.slow_rank) % cp_);
    case SlowRotation::per_batch: return static_cast<std::int32_t>((batch + faults_.slow_rank) % cp_);
  }
  return -1;
}

// True once per (batch, layer), at the step slow_at names, on the layer's slow rank.
bool FaultInjector::slow_here(const Step& step, std::int64_t batch_index) {
  if (step.layer < 0) return false;
  if (step.layer != layer_ || batch_index != layer_batch_) {
    layer_ = step.layer;
    layer_batch_ = batch_index;
    gathers_in_layer_ = 0;
    slow_done_in_layer_ = false;
  }
  if (step.op == Op::gather) ++gathers_in_layer_;
  if (slow_done_in_layer_ || slow_rank_of(batch_index, step.layer) != rank_) return false;
  bool here = false;
  switch (faults_.slow_at) {
    case SlowAt::fill: here = step.op == Op::fill; break;
    case SlowAt::gather: here = step.op == Op::gather && gathers_in_layer_ == 2; break;  // after one read: the epoch is open
    case SlowAt::read_end: here = step.op == Op::layer_end; break;
    case SlowAt::arrive: here = step.op == Op::arrive; break;
  }
  slow_done_in_layer_ = here;
  return here;
}

bool FaultInjector::yields_before(Op op) const {
  switch (faults_.yield_at) {
    case YieldAt::nowhere: return false;
    case YieldAt::writes: return op == Op::zero_own || op == Op::zero_dense || op == Op::fill || op == Op::publish;
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
  const bool write = op == Op::zero_own || op == Op::zero_dense || op == Op::fill || op == Op::publish;
  if ((op == Op::arrive || op == Op::coll_arrive) && chance(faults_.flag_write_delay_probability)) sleep_us(delay_us_(rng_));
  if (op == Op::gather && chance(faults_.gather_delay_probability)) sleep_us(delay_us_(rng_));
  if (write && chance(faults_.write_delay_probability)) sleep_us(delay_us_(rng_));
  if (slow_here(step, batch_index) && faults_.slow_producer_delay_us > 0) sleep_us(faults_.slow_producer_delay_us);
  if (yields_before(op) && chance(faults_.yield_probability)) std::this_thread::yield();
}

}  // namespace cpkv::sim

// The fault points of a free-running rank (FaultOptions, runner.hpp), kept apart from the protocol:
// the rank calls before() ahead of every step; the injector may sleep, hold or yield, and reads the
// ranks' published positions to end a hold, but never changes a step.
#pragma once

#include <cstdint>
#include <random>

#include "cpkv/sim/machine.hpp"
#include "cpkv/sim/runner.hpp"
#include "cpkv/sim/world.hpp"

namespace cpkv::sim {

class FaultInjector {
 public:
  FaultInjector(const World& world, const FaultOptions& faults, std::int32_t rank, std::int32_t cp, std::int32_t layers);
  // Ahead of `step` of batch `batch_index`: the seeded delays, holds and yields of this rank.
  void before(const Step& step, std::int64_t batch_index);
  // Between two polls of a wait that is not yet satisfied: yield the core, or sleep (a waiter that
  // looks only now and then, as a descheduled rank does, can miss a short-lived state).
  void between_polls() const;

 private:
  enum class Role : std::uint8_t { producer, reader };
  std::int32_t slow_rank_of(Role role, std::int64_t batch_index, std::int32_t layer) const;
  void enter_layer(const Step& step, std::int64_t batch_index);
  // Hold up to `bound_us`, until `peer_moved_on` holds for some peer.
  template <typename Predicate>
  void hold(std::int32_t bound_us, Predicate peer_moved_on) const;
  int peer_layer_order(const RankPosition& pos) const;
  bool peer_finished_reading(std::int32_t peer) const;
  bool peer_waits_for_this_rank(std::int32_t peer) const;
  void hold_producer() const;
  bool peer_wrote_later_layer(std::int32_t peer) const;
  bool yields_before(Op op) const;

  const World& world_;
  FaultOptions faults_;
  std::int32_t rank_;
  std::int32_t cp_;
  std::int32_t layers_;
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> coin_{0.0, 1.0};
  std::uniform_int_distribution<std::int32_t> delay_us_;
  // Each role fires once per (batch, layer): where this rank is and what it did there.
  std::int64_t batch_ = -2;
  std::int32_t layer_ = -2;
  bool produced_slowly_ = false;
  bool read_slowly_ = false;
  bool arrived_in_layer_ = false;  // a barrier or collective arrival of this rank in this layer
};

}  // namespace cpkv::sim

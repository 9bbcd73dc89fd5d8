// The fault points of a free-running rank (FaultOptions, runner.hpp), kept apart from the protocol:
// the rank calls before() ahead of every step; the injector may sleep or yield, never steers a step.
#pragma once

#include <cstdint>
#include <random>

#include "cpkv/sim/machine.hpp"
#include "cpkv/sim/runner.hpp"

namespace cpkv::sim {

class FaultInjector {
 public:
  FaultInjector(const FaultOptions& faults, std::int32_t rank, std::int32_t cp, std::int32_t layers);
  // Ahead of `step` of batch `batch_index`: the seeded delays and yields of this rank.
  void before(const Step& step, std::int64_t batch_index);

 private:
  bool slow_here(const Step& step, std::int64_t batch_index);
  std::int32_t slow_rank_of(std::int64_t batch_index, std::int32_t layer) const;
  bool yields_before(Op op) const;
  void sleep_us(std::int64_t us) const;

  FaultOptions faults_;
  std::int32_t rank_;
  std::int32_t cp_;
  std::int32_t layers_;
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> coin_{0.0, 1.0};
  std::uniform_int_distribution<std::int32_t> delay_us_;
  // The slow point fires once per (batch, layer): where this rank last was and what it did there.
  std::int64_t layer_batch_ = -2;
  std::int32_t layer_ = -2;
  std::int32_t gathers_in_layer_ = 0;
  bool slow_done_in_layer_ = false;
};

}  // namespace cpkv::sim

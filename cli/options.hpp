// Numeric options: one validator for "a whole number in range" and one for "a finite number in
// range", so NaN, infinities, signs on unsigned values and values past the type's range are refused
// (exit 2) with the limit in the message, before any conversion or allocation. CLI11 runs a
// check() on the text as typed, before converting it.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cpkv/harness/request.hpp"

namespace cpkv::cli {

// Limits of options that the model's limits (model/limits.hpp) do not already give, with why.
namespace option_limits {
// A soak longer than a week is a mistake, not a plan (runs are resumed from the printed seed).
inline constexpr double soak_minutes_max = 7 * 24 * 60;
// One exploration longer than a day would not finish anyway: the state spaces explored are small.
inline constexpr double explore_seconds_max = 24 * 60 * 60;
// Far above any real link (H200 NVLink: 900 GB/s) so that a what-if run can make a cost vanish
// (tests pass --local-gbps 1e12), yet finite, so every modelled time stays a number.
inline constexpr double bandwidth_gbps_max = 1e12;
// A modelled barrier or call cost above one second is a unit mistake (microseconds are expected).
inline constexpr double latency_us_max = 1e6;
// Property cases, model repetitions and timing repetitions: enough for any measurement, small enough
// that a typo does not run for days.
inline constexpr std::int64_t repetitions_max = 1'000'000;
// A single wait of a free-running rank: an hour is far past any exchange step.
inline constexpr std::int64_t wait_ms_max = 3'600'000;
// The smallest value of a quantity that must be positive (a bandwidth in GB/s, a latency in us, a
// duration): smaller is a unit mistake, and 5e-324 GB/s made modelled times infinite ("inf") and
// 1e-300 printed 300-digit figures (issue 22, item 19).
inline constexpr double positive_min = 1e-6;
}  // namespace option_limits

// A whole number of type T in [low, high], written in decimal digits (a leading '-' only where T
// is signed).
template <typename T>
CLI::Validator whole_in(T low, T high) {
  return CLI::Validator(
      [low, high](std::string& text) -> std::string {
        T value{};
        const char* end = text.data() + text.size();
        const auto [stop, error] = std::from_chars(text.data(), end, value);
        if (error == std::errc::result_out_of_range || (error == std::errc() && stop == end && (value < low || value > high))) {
          return fmt::format("{} is outside {}..{}", text, low, high);
        }
        if (error != std::errc() || stop != end || text.empty()) return fmt::format("'{}' is not a whole number in {}..{}", text, low, high);
        return {};
      },
      fmt::format("{}..{}", low, high));
}

// A finite number in [low, high], or with low_open (a bandwidth or duration: > low) in
// [low + option_limits::positive_min, high], so no quantity is too small to compute with.
inline CLI::Validator finite_in(double low, double high, bool low_open) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        char* stop = nullptr;
        const double value = std::strtod(text.c_str(), &stop);
        const double least = low_open ? low + option_limits::positive_min : low;
        const std::string range = fmt::format("[{}, {}]", least, high);
        if (text.empty() || stop != text.c_str() + text.size()) return fmt::format("'{}' is not a number in {}", text, range);
        if (!std::isfinite(value)) return fmt::format("{} is not a finite number (expected a number in {})", text, range);
        if (value < least || value > high) return fmt::format("{} is outside {}", text, range);
        return {};
      },
      fmt::format("number in [{}, {}]", low_open ? low + option_limits::positive_min : low, high));
}

// The request's knobs that the environment may also set (harness/request.hpp: kKnobTable), as
// `cpkv replay` and `cpkv bench` take them; check_request reads the environment where one is not given.
void add_knob_options(CLI::App* cmd, harness::ReplayRequest& request);

// The one seed of a run: any unsigned 64-bit value, decimal.
inline CLI::Validator seed_value() { return whole_in<std::uint64_t>(0, std::numeric_limits<std::uint64_t>::max()); }

}  // namespace cpkv::cli

// cpkv replay TRACE --backend model: the plan, verdict, bytes and modelled time of every batch of a
// trace for every variant, without moving content (cli/model_replay.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

namespace cpkv::cli {

struct ModelReplayOptions {
  std::optional<std::string> ceilings_path;
  std::optional<double> peer_gbps;
  std::optional<double> local_gbps;
  std::optional<double> barrier_us;
  std::optional<double> allreduce_gbps;
  std::optional<double> allreduce_latency_us;
  std::optional<std::string> chart_path;
  std::int64_t repeat = 1;
  bool exact_model = false;
  bool given() const;  // any of these set (they mean something only with --backend model)
};

// Adds the options above to the replay subcommand.
void add_model_replay_options(CLI::App* replay, ModelReplayOptions& options);

void run_model_replay(const std::string& trace_path, std::optional<std::int64_t> batch,
                      const std::optional<std::string>& json_path, const ModelReplayOptions& options);

}  // namespace cpkv::cli

// The cpkv subcommands. Each registers itself on the app and runs when selected.
#pragma once

#include <optional>
#include <string>

#include <stdexcept>

#include <CLI/CLI.hpp>

namespace cpkv::cli {

// Exit statuses shared by every subcommand.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;    // the run found a violation or mismatch
inline constexpr int kExitBadInput = 2;   // malformed trace or impossible option

// An impossible option found after parsing (a batch or rank that does not exist): one line, exit 2.
struct OptionError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The status the selected subcommand wants main() to return.
int& exit_status();

void register_plan(CLI::App& app);
void register_replay(CLI::App& app);
void register_mutants(CLI::App& app);
void register_explore(CLI::App& app);
void register_soak(CLI::App& app);
void register_merge(CLI::App& app);  // cpkv merge: shard files of cpkv mutants into one table
void register_import(CLI::App& app);
void register_bench(CLI::App& app);  // a backend that benches (harness::BackendEntry::bench): cuda where built
// `cpkv mutants --backend cuda`: the GPU planted bugs and the verify self-test (CUDA builds only).
void run_gpu_mutants(const std::optional<std::string>& exchange);

}  // namespace cpkv::cli

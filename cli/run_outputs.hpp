// What `cpkv soak`, `cpkv mutants` and `cpkv explore` write besides the report on stdout: a --json
// file (what `cpkv merge` folds, docs/sharding.md), a --junit file and the counterexamples' folder
// (--out DIR). The three options, their checks before any work and the final writes, in one place.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "files.hpp"

namespace cpkv::cli {

struct RunOutputOptions {
  std::optional<std::string> json_path;
  std::optional<std::string> junit_path;
  std::optional<std::string> out;  // the counterexamples' folder (files.hpp use_out_folder)
  bool any() const { return json_path || junit_path || out; }
};

// Adds --json, --junit and --out to `cmd`. `rows` says what the JSON file holds besides what was
// asked and the shard ("the rows", "each seed's row"); `unit` what one JUnit testcase is.
void add_run_output_options(CLI::App& cmd, RunOutputOptions& o, const std::string& rows, const std::string& unit);

// The outputs, checked (files.hpp's output rules: OutputFile, not the same file twice; the --out
// folder made or checked and set for the property suite). A bad one is an OptionError (one line,
// exit 2); nothing is written until write().
struct RunOutputs {
  std::unique_ptr<OutputFile> json;
  std::unique_ptr<OutputFile> junit;
  std::string out;  // the --out DIR as given, "" for the private per-run folder

  // Writes the files asked for; each text is built only when its file was asked for.
  void write(const std::function<std::string()>& json_text, const std::function<std::string()>& junit_text);
};
RunOutputs open_run_outputs(const RunOutputOptions& o);

}  // namespace cpkv::cli

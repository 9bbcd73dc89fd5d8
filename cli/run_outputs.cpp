#include "run_outputs.hpp"

#include <fmt/format.h>

namespace cpkv::cli {

void add_run_output_options(CLI::App& cmd, RunOutputOptions& o, const std::string& rows, const std::string& unit) {
  cmd.add_option("--json", o.json_path, fmt::format("write {}, what was asked and the shard to this JSON file (cpkv merge folds shards)", rows));
  cmd.add_option("--junit", o.junit_path, fmt::format("write a JUnit XML report: one testcase per {}", unit));
  cmd.add_option("--out", o.out,
                 "put counterexamples (trace and schedule) in this folder (made 0700 if new; default: a private folder per run in $TMPDIR)");
}

RunOutputs open_run_outputs(const RunOutputOptions& o) {
  RunOutputs outputs;
  if (o.json_path) outputs.json = std::make_unique<OutputFile>("--json", *o.json_path);
  if (o.junit_path) outputs.junit = std::make_unique<OutputFile>("--junit", *o.junit_path);
  refuse_same_files({}, {outputs.json.get(), outputs.junit.get()});
  outputs.out = use_out_folder(o.out);
  return outputs;
}

void RunOutputs::write(const std::function<std::string()>& json_text, const std::function<std::string()>& junit_text) {
  if (json) json->write(json_text());
  if (junit) junit->write(junit_text());
}

}  // namespace cpkv::cli

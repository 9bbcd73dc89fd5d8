// cpkv plan: the batch-logical plan of every batch of a trace, without moving any content.
#include <cstdio>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "files.hpp"
#include "options.hpp"
#include "cpkv/model/limits.hpp"
#include "cpkv/model/batch.hpp"
#include "cpkv/model/plan.hpp"
#include "cpkv/model/staging.hpp"
#include "cpkv/traces/trace.hpp"

namespace cpkv::cli {
namespace {

struct PlanOptions {
  std::string trace_path;
  std::optional<std::int64_t> batch;
  std::optional<std::int32_t> rank;
  std::string variant_name = "staging_direct";
  bool json = false;
};

std::vector<std::vector<std::int32_t>> writers_by_request(const model::BatchLayout& layout, std::size_t requests) {
  std::vector<std::vector<std::int32_t>> writers(requests);
  for (const model::CurrentPage& page : layout.current) writers[page.request].push_back(page.writer);
  return writers;
}

void print_batch(const PlanOptions& options, const model::Setting& setting, const model::StagingCapacity& capacity,
                 model::Variant variant, std::int64_t index, const model::Batch& batch) {
  const model::BatchLayout layout = model::layout_batch(setting, batch);
  const model::Verdict verdict = model::overflow_verdict(layout.current_pages_total, capacity.staging_slots);
  const auto writers = writers_by_request(layout, batch.requests.size());
  // A rejected batch moves nothing: no rank writes staging or waits at a barrier.
  const auto matrix = verdict.overflow ? std::vector<std::vector<std::uint64_t>>() : model::batch_bytes_pulled(setting, layout, variant);
  const std::int32_t rank_first = options.rank.value_or(0);
  const std::int32_t rank_end = options.rank ? *options.rank + 1 : setting.cp;
  if (options.json) {
    nlohmann::json out;
    out["batch"] = index;
    out["requests"] = batch.requests.size();
    out["current_pages_total"] = layout.current_pages_total;
    out["slot_count"] = layout.slot_count;
    out["staging_slots"] = capacity.staging_slots;
    out["staging_source"] = model::to_string(capacity.source);
    out["verdict"] = verdict.overflow ? "overflow" : "ok";
    out["verdict_detail"] = verdict.describe();
    out["writers"] = writers;
    out["variant"] = model::to_string(variant);
    out["layers"] = setting.layer_count();
    nlohmann::json ranks = nlohmann::json::array();
    for (std::int32_t rank = rank_first; rank < rank_end; ++rank) {
      ranks.push_back({{"rank", rank}, {"bytes_pulled_from", verdict.overflow ? nlohmann::json(nullptr) : nlohmann::json(matrix[rank])}});
    }
    out["ranks"] = ranks;
    fmt::print("{}\n", out.dump());
    return;
  }
  fmt::print("batch {}: {} requests, current_pages_total {}, slot_count {}, staging_slots {} ({}), verdict {}\n", index,
             batch.requests.size(), layout.current_pages_total, layout.slot_count, capacity.staging_slots,
             model::to_string(capacity.source), verdict.describe());
  for (std::size_t r = 0; r < writers.size(); ++r) {
    fmt::print("  request {}: prefix {} + extend {} tokens, writers of its {} current pages: [{}]\n", r,
               batch.requests[r].prefix_len, batch.requests[r].extend_len, writers[r].size(), fmt::join(writers[r], " "));
  }
  if (verdict.overflow) {
    fmt::print("  rejected before any rank writes staging or waits: no bytes move\n");
    return;
  }
  fmt::print("  bytes pulled per batch ({}, {} layers), from ranks 0..{}:\n", model::to_string(variant),
             setting.layer_count(), setting.cp - 1);
  for (std::int32_t rank = rank_first; rank < rank_end; ++rank) {
    fmt::print("    rank {}: [{}]\n", rank, fmt::join(matrix[rank], " "));
  }
}

void run_plan(const PlanOptions& options) {
  const auto variant = model::parse_variant(options.variant_name);
  if (!variant) throw OptionError(fmt::format("--variant: unknown variant '{}'", options.variant_name));
  // The trace is read twice: a pipe is read once, into a private spool file.
  const InputFile trace("trace", options.trace_path, /*spool=*/true);
  // Pass 1 validates the whole trace, so a bad line late in the file leaves no partial output.
  std::int64_t batches = 0;
  {
    traces::TraceReader reader(trace.path());
    model::Batch batch;  // one batch reused: this pass only checks and counts
    while (reader.next(batch)) ++batches;
    if (options.rank && *options.rank >= reader.header().setting.cp) {
      throw OptionError(fmt::format("--rank: {} is not a rank of the trace's cp = {} group", *options.rank,
                                    reader.header().setting.cp));
    }
  }
  if (options.batch && *options.batch >= batches) {
    throw OptionError(fmt::format("--batch: {} is not in {} ({} batches)", *options.batch, options.trace_path, batches));
  }
  traces::TraceReader reader(trace.path());
  const model::Setting& setting = reader.header().setting;
  const model::StagingCapacity capacity = model::staging_capacity(setting);
  while (auto batch = reader.next()) {
    if (options.batch && reader.batch_index() != *options.batch) continue;
    print_batch(options, setting, capacity, *variant, reader.batch_index(), *batch);
  }
}

}  // namespace

void register_plan(CLI::App& app) {
  auto options = std::make_shared<PlanOptions>();
  CLI::App* cmd = app.add_subcommand(
      "plan",
      "Print the batch-logical plan of every batch of a trace: current_pages_total, slot_count, staging_slots, the "
      "overflow verdict, the writer of each current page per request, and per rank the bytes pulled from each peer.");
  cmd->add_option("trace", options->trace_path, "batch trace (JSON Lines, format cpkv-batch-trace v1)")->required();
  cmd->add_option("--batch", options->batch, "only this batch (0-based)")->check(whole_in<std::int64_t>(0, std::numeric_limits<std::int64_t>::max()));
  cmd->add_option("--rank", options->rank, "only this rank's bytes")->check(whole_in<std::int32_t>(0, model::limits::cp_max - 1));
  cmd->add_option("--variant", options->variant_name, fmt::format("exchange variant whose bytes are counted: {}", model::variant_names()))
      ->capture_default_str();
  cmd->add_flag("--json", options->json, "one JSON object per batch, for scripts");
  cmd->callback([options] { run_plan(*options); });
}

}  // namespace cpkv::cli

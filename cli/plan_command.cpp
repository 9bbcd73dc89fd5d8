// cpkv plan: the batch-logical plan of every batch of a trace, without moving any content: the page
// split's (staging, verdict, writers) or, for section 12's token-split all-gather variants, the
// token split's (tokens per rank, the padded all-gather, prefix pulls by owner).
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "files.hpp"
#include "options.hpp"
#include "cpkv/harness/plan_report.hpp"
#include "cpkv/model/limits.hpp"
#include "cpkv/model/attention.hpp"
#include "cpkv/model/batch.hpp"
#include "cpkv/model/plan.hpp"
#include "cpkv/model/staging.hpp"
#include "cpkv/model/token_plan.hpp"
#include "cpkv/traces/trace.hpp"

namespace cpkv::cli {
namespace {

struct PlanOptions {
  std::string trace_path;
  std::optional<std::int64_t> batch;
  std::optional<std::int32_t> rank;
  std::string variant_name = "staging_direct";
  std::optional<std::string> json_path;
};

// Each rank's bytes by the rank that holds them. The rank's own entry is local (its own memory,
// copied, never pulled): rows that are equal as vectors still split differently into local and
// pulled, so an equal row is printed once and each rank's split after it.
std::string bytes_text(const harness::PlannedBatch& p, const model::Setting& setting, model::Variant variant) {
  std::string text = fmt::format("  bytes each rank reads per batch ({}, {} layers), by the rank that holds them; a rank's own entry is "
                                 "local (its own memory, not pulled), the others are pulled from peers{}:\n",
                                 model::to_string(variant), setting.layer_count(),
                                 model::splits_tokens(variant) ? " (the all-gather's peer blocks counted from the ring predecessor, as the cost model counts them)" : "");
  bool same = p.rank_end - p.rank_first > 1;
  for (std::int32_t rank = p.rank_first + 1; rank < p.rank_end; ++rank) same = same && p.matrix[rank] == p.matrix[p.rank_first];
  if (same) text += fmt::format("    every rank reads [{}] from ranks 0..{}\n", fmt::join(p.matrix[p.rank_first], " "), setting.cp - 1);
  for (std::int32_t rank = p.rank_first; rank < p.rank_end; ++rank) {
    const std::vector<std::uint64_t>& row = p.matrix[rank];
    text += fmt::format("    rank {}: local {}, pulled from peers {}", rank, row[rank], harness::pulled_from_peers(row, rank));
    if (!same) {
      std::vector<std::string> peers;
      for (std::int32_t from = 0; from < setting.cp; ++from) {
        if (from != rank) peers.push_back(fmt::format("{} from rank {}", row[from], from));
      }
      text += fmt::format(" ({})", fmt::join(peers, ", "));
    }
    text += "\n";
  }
  return text;
}

// Each rank's attention plan in the neutral form of PROTOCOL.md section 11, one segment per
// maximal run of its consecutive current pages of one request.
std::string attention_text(const harness::PlannedBatch& p) {
  std::string text = "  attention plan of each rank, segments (request, q_base, q_len, kv_len, k_base): queries are the request's current "
                     "tokens q_base..q_base+q_len-1, the last sees kv_len keys from dense row k_base:\n";
  for (std::int32_t rank = p.rank_first; rank < p.rank_end; ++rank) {
    std::vector<std::string> segments;
    for (const model::AttentionSegment& s : p.attention[rank]) {
      segments.push_back(fmt::format("({}, {}, {}, {}, {})", s.request, s.q_base, s.q_len, s.kv_len, s.k_base));
    }
    text += fmt::format("    rank {}: {}\n", rank, segments.empty() ? std::string("no queries") : fmt::format("{}", fmt::join(segments, " ")));
  }
  return text;
}

// A rank's tokens as runs: "request 0: 0..1 5; request 1: 1..7 step 2".
std::string token_runs_text(const std::vector<model::TokenRun>& runs) {
  std::string text;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const model::TokenRun& run = runs[i];
    if (i == 0 || runs[i - 1].request != run.request) text += fmt::format("{}request {}:", i == 0 ? "" : "; ", run.request);
    const std::int64_t last = run.first + (run.count - 1) * run.step;
    text += run.count == 1 ? fmt::format(" {}", run.first) : fmt::format(" {}..{}", run.first, last);
    if (run.count > 1 && run.step != 1) text += fmt::format(" step {}", run.step);
  }
  return text.empty() ? std::string("no tokens") : text;
}

// Section 12's plan in words: the split, the padded all-gather, each rank's tokens, its all-gather
// and prefix bytes; the model's row of bytes and the attention plans follow.
std::string token_split_text(const harness::PlannedBatch& p, const model::Setting& setting) {
  const model::TokenSplitPlan& t = *p.tokens;
  std::string text = fmt::format("  token split {}: {} current tokens, max_rank_tokens {}; each all-gather moves cp {} x {} = {} rows, {} of them "
                                 "padding; {} all-gathers per batch (one per layer and active kind)\n",
                                 model::to_string(t.split), t.tokens_total, t.max_rank_tokens, setting.cp, t.max_rank_tokens, t.allgather_rows,
                                 t.padding_rows, t.allgathers);
  text += "  tokens each rank computes and sends, per request, in its send order (extend offsets; a..b step s: every s-th); its send rows "
          "past its count are padding:\n";
  for (std::int32_t rank = p.rank_first; rank < p.rank_end; ++rank) {
    const model::TokenSplitRank& r = t.ranks[rank];
    text += fmt::format("    rank {}: {} tokens, {} padding rows: {}\n", rank, r.token_count, r.padding_rows, token_runs_text(r.tokens));
  }
  text += fmt::format("  bytes per batch ({} layers): the gathered buffer each rank ends with (padding counted) and of it the peers' blocks; "
                      "the prefix pages and bytes it pulls from the pool by owner (its own entry is local):\n",
                      setting.layer_count());
  for (std::int32_t rank = p.rank_first; rank < p.rank_end; ++rank) {
    const model::TokenSplitRank& r = t.ranks[rank];
    text += fmt::format("    rank {}: all-gather {}, from peers {}; prefix pages [{}], bytes [{}]\n", rank, r.allgather_bytes, r.allgather_peer_bytes,
                        fmt::join(r.prefix_pages_from, " "), fmt::join(r.prefix_bytes_from, " "));
  }
  return text;
}

std::string batch_text(const harness::PlannedBatch& p, const model::Setting& setting, model::Variant variant,
                       std::int64_t index, const model::Batch& batch) {
  if (p.tokens) {
    std::string text = fmt::format("batch {}: {} requests, current_pages_total {}, slot_count {}, {}\n", index, batch.requests.size(),
                                   p.layout.current_pages_total, p.layout.slot_count, p.tokens->no_staging_detail);
    for (std::size_t r = 0; r < batch.requests.size(); ++r) {
      text += fmt::format("  request {}: prefix {} + extend {} tokens\n", r, batch.requests[r].prefix_len, batch.requests[r].extend_len);
    }
    return text + token_split_text(p, setting) + bytes_text(p, setting, variant) + attention_text(p);
  }
  std::string text = fmt::format("batch {}: {} requests, current_pages_total {}, slot_count {}, staging_slots {} ({}), verdict {}\n", index,
                                 batch.requests.size(), p.layout.current_pages_total, p.layout.slot_count, p.capacity.staging_slots,
                                 model::to_string(p.capacity.source), p.verdict.describe());
  for (std::size_t r = 0; r < p.writers.size(); ++r) {
    text += fmt::format("  request {}: prefix {} + extend {} tokens, writers of its {} current pages: [{}]\n", r, batch.requests[r].prefix_len,
                        batch.requests[r].extend_len, p.writers[r].size(), fmt::join(p.writers[r], " "));
  }
  if (p.verdict.overflow) return text + "  rejected before any rank writes staging or waits: no bytes move\n";
  return text + bytes_text(p, setting, variant) + attention_text(p);
}

// The report goes to stdout batch by batch; with --json it is held until the JSON file is written,
// so a failed write leaves nothing on stdout but the error. The JSON object is the harness's
// (harness::plan_json), the one Python's cpkv.plan returns.
void plan_batch(const PlanOptions& options, const model::Setting& setting, model::Variant variant, std::int64_t index, const model::Batch& batch,
                OutputFile* json, std::string& held) {
  const harness::PlannedBatch p = harness::plan_batch(setting, batch, index, variant, options.rank);
  const std::string text = batch_text(p, setting, variant, index, batch);
  if (json == nullptr) {
    fmt::print("{}", text);
    return;
  }
  json->stream() << harness::plan_json(p).dump() << "\n";
  held += text;
}

void run_plan(const PlanOptions& options) {
  const auto variant = model::parse_variant(options.variant_name);
  if (!variant) throw OptionError(fmt::format("--variant: unknown variant '{}'", options.variant_name));
  // The trace is read twice: a pipe is read once, into a private spool file.
  const InputFile trace("trace", options.trace_path, /*spool=*/true);
  std::unique_ptr<OutputFile> json;
  if (options.json_path) json = std::make_unique<OutputFile>("--json", *options.json_path);
  refuse_same_files({&trace}, {json.get()});
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
  std::string held;
  while (auto batch = reader.next()) {
    if (options.batch && reader.batch_index() != *options.batch) continue;
    plan_batch(options, setting, *variant, reader.batch_index(), *batch, json.get(), held);
  }
  if (json) {
    json->commit();
    fmt::print("{}", held);
  }
}

}  // namespace

void register_plan(CLI::App& app) {
  auto options = std::make_shared<PlanOptions>();
  CLI::App* cmd = app.add_subcommand(
      "plan",
      "Print the batch-logical plan of every batch of a trace: current_pages_total, slot_count, staging_slots, the "
      "overflow verdict, the writer of each current page per request, and per rank the bytes pulled from each peer and its attention plan; "
      "under a token-split all-gather variant (allgather_zigzag, allgather_continuous: no staging, no verdict) per rank its tokens, the "
      "padded all-gather's bytes, the prefix pages pulled from each owner and the token split's attention plan.");
  cmd->add_option("trace", options->trace_path, "batch trace (JSON Lines, format cpkv-batch-trace v1)")->required();
  cmd->add_option("--batch", options->batch, "only this batch (0-based)")->check(whole_in<std::int64_t>(0, std::numeric_limits<std::int64_t>::max()));
  cmd->add_option("--rank", options->rank, "only this rank's bytes")->check(whole_in<std::int32_t>(0, model::limits::cp_max - 1));
  cmd->add_option("--variant", options->variant_name, fmt::format("exchange variant whose plan is printed: {}", model::variant_names()))
      ->capture_default_str();
  cmd->add_option("--json", options->json_path,
                  "also write the plan as JSON Lines to this file, one object per batch (a regular file, replaced only when the run "
                  "completes; stdout still carries the report)");
  cmd->callback([options] { run_plan(*options); });
}

}  // namespace cpkv::cli

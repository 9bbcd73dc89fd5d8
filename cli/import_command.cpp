// cpkv import mooncake: a Mooncake FAST'25 request log becomes a batch trace through a prefix cache,
// a paged pool and a prefill scheduler under the admission caps (traces/README.md, "Imported traces").
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "files.hpp"
#include "options.hpp"
#include "cpkv/model/limits.hpp"
#include "cpkv/model/staging.hpp"
#include "cpkv/traces/mooncake.hpp"
#include "cpkv/traces/text.hpp"
#include "cpkv/traces/trace.hpp"

namespace cpkv::cli {
namespace {

namespace mc = traces::mooncake;

// Defaults: DeepSeek-V3.2 on 8xH200 (traces/README.md says why each).
struct ImportCommandOptions {
  std::string input_path;
  std::string output_path;
  std::int32_t cp = 8;
  std::int32_t page_size = 64;
  std::string buffer_kinds = "kv_fp8,indexer_k";
  std::int32_t layers = 61;
  std::optional<std::string> layer_pattern;  // default: every layer F
  std::int64_t pool_pages = 65536;
  std::string split = "zigzag";
  std::int64_t max_total_extend_tokens = 16384;
  std::int64_t max_batch_requests = 16;
  std::optional<std::int64_t> staging_mib;
  std::int64_t block_tokens = mc::kBlockTokensDefault;
  std::optional<std::int64_t> cache_pages;
  std::optional<std::int64_t> cache_tokens;
  bool cache_unbounded = false;
  std::optional<std::int64_t> max_requests;
  std::int64_t skip_batches = 0;
  std::optional<std::int64_t> max_batches;
  bool skip_bad = false;
  std::optional<std::string> source_note;
};

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    items.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return items;
}

// The option that sets each field model::validate and mc::validate name, so a refusal names what
// the user typed.
std::string option_of(const std::string& field) {
  static const std::pair<const char*, const char*> kOptions[] = {
      {"cp", "--cp"}, {"page_size", "--page-size"}, {"buffer_kinds", "--buffer-kinds"}, {"layers.count", "--layers"},
      {"layers.pattern", "--layer-pattern"}, {"pool_pages", "--pool-pages"}, {"max_total_extend_tokens", "--max-total-extend-tokens"},
      {"max_batch_requests", "--max-batch-requests"}, {"caps", "--max-total-extend-tokens/--max-batch-requests"},
      {"staging_mib", "--staging-mib"}, {"block_tokens", "--block-tokens"}, {"cache", "--cache-pages/--cache-tokens"},
      {"max_requests", "--max-requests"}, {"max_batches", "--max-batches"}, {"skip_batches", "--skip-batches"}, {"split", "--split"}};
  for (const auto& [name, option] : kOptions) {
    if (field == name || field.rfind(std::string(name) + "[", 0) == 0 || field.rfind(std::string(name) + ".", 0) == 0) return option;
  }
  return field;
}

// Every impossible option is refused here, before the input is opened.
mc::ImportOptions to_import_options(const ImportCommandOptions& c) {
  mc::ImportOptions o;
  model::Setting& s = o.setting;
  s.cp = c.cp;
  s.page_size = c.page_size;
  for (const std::string& name : split_list(c.buffer_kinds)) {
    const auto kind = model::find_buffer_kind(name);
    if (!kind) throw OptionError(fmt::format("--buffer-kinds: unknown buffer kind '{}' (known: kv_fp8, kv_bf16, indexer_k)", name));
    s.kinds.push_back(*kind);
  }
  if (c.layers < 1) throw OptionError(fmt::format("--layers: {} is less than 1", c.layers));
  s.layer_pattern = c.layer_pattern.value_or(std::string(static_cast<std::size_t>(c.layers), 'F'));
  if (static_cast<std::int32_t>(s.layer_pattern.size()) != c.layers) {
    throw OptionError(fmt::format("--layer-pattern: {} characters for --layers {}", s.layer_pattern.size(), c.layers));
  }
  s.pool_pages = c.pool_pages;
  const auto split = model::parse_split_policy(c.split);
  if (!split) throw OptionError(fmt::format("--split: unknown policy '{}' (zigzag, contiguous, round_robin, zigzag_tokens, continuous_tokens)", c.split));
  s.split = *split;
  if (c.max_total_extend_tokens < 1) throw OptionError(fmt::format("--max-total-extend-tokens: {} is less than 1", c.max_total_extend_tokens));
  if (c.max_batch_requests < 1) throw OptionError(fmt::format("--max-batch-requests: {} is less than 1", c.max_batch_requests));
  s.caps.max_total_extend_tokens = c.max_total_extend_tokens;
  s.caps.max_batch_requests = c.max_batch_requests;
  s.caps.staging_mib_override = c.staging_mib;
  o.block_tokens = c.block_tokens;
  const int cache_choices = (c.cache_pages ? 1 : 0) + (c.cache_tokens ? 1 : 0) + (c.cache_unbounded ? 1 : 0);
  if (cache_choices > 1) throw OptionError("--cache-pages, --cache-tokens and --cache-unbounded exclude each other");
  if (c.cache_unbounded) o.cache_mode = mc::CacheMode::unbounded;
  if (c.cache_pages) {
    o.cache_mode = mc::CacheMode::capacity;
    o.cache_capacity_pages = *c.cache_pages;
  }
  if (c.cache_tokens) {
    if (c.page_size < 1) throw OptionError(fmt::format("--page-size: {} is less than 1", c.page_size));
    o.cache_mode = mc::CacheMode::capacity;
    o.cache_capacity_pages = *c.cache_tokens / c.page_size;
  }
  o.max_requests = c.max_requests;
  o.skip_batches = c.skip_batches;
  o.max_batches = c.max_batches;
  if (auto problem = mc::validate(o)) throw OptionError(fmt::format("{}: {}", option_of(problem->field), problem->reason));
  return o;
}

// The options as written into the trace header: everything that shapes the batches.
nlohmann::json options_json(const ImportCommandOptions& c, const mc::ImportOptions& o) {
  nlohmann::json j = {{"block_tokens", c.block_tokens},
                      {"cache", o.cache_mode == mc::CacheMode::pool        ? "pool"
                                : o.cache_mode == mc::CacheMode::unbounded ? "unbounded"
                                                                           : "capacity"},
                      {"skip_batches", c.skip_batches},
                      {"skip_bad", c.skip_bad}};
  if (o.cache_mode == mc::CacheMode::capacity) j["cache_capacity_pages"] = o.cache_capacity_pages;
  j["max_requests"] = c.max_requests ? nlohmann::json(*c.max_requests) : nlohmann::json(nullptr);
  j["max_batches"] = c.max_batches ? nlohmann::json(*c.max_batches) : nlohmann::json(nullptr);
  return j;
}

// Why the batches written can or cannot overflow staging (traces/README.md, "Overflow"): the
// scheduler admits a batch under the caps, at most ceil(T / P) + R current pages, which is exactly
// what the caps size staging for. Only a staging override below the batches makes any overflow; the
// note names the largest --staging-mib that makes this import's fullest batch overflow.
std::string overflow_note(const model::Setting& s, const model::StagingCapacity& capacity, std::int64_t current_pages_peak) {
  const std::int64_t admitted_max = (*s.caps.max_total_extend_tokens + s.page_size - 1) / s.page_size + *s.caps.max_batch_requests;
  const auto slot_bytes = static_cast<std::int64_t>(2 * s.page_size * s.row_bytes_all_kinds());
  const std::int64_t mib = (current_pages_peak * slot_bytes + (std::int64_t{1} << 20) - 1) / (std::int64_t{1} << 20) - 1;
  model::Setting smaller = s;
  smaller.caps.staging_mib_override = mib;
  const std::string how = mib >= 1 ? fmt::format("; to import batches that do, give less staging: --staging-mib {} ({} slots, below this import's fullest batch of {} pages)",
                                                 mib, model::staging_capacity(smaller).staging_slots, current_pages_peak)
                                   : "";
  if (capacity.staging_slots >= admitted_max) {
    return fmt::format("no batch can overflow: the caps admit at most ceil({} / {}) + {} = {} current pages a batch and staging holds {}{}",
                       *s.caps.max_total_extend_tokens, s.page_size, *s.caps.max_batch_requests, admitted_max, capacity.staging_slots, how);
  }
  return fmt::format("staging ({} slots, --staging-mib) is below the {} current pages the caps admit: a batch above it overflows", capacity.staging_slots,
                     admitted_max);
}

void run_import(const ImportCommandOptions& c) {
  const mc::ImportOptions options = to_import_options(c);
  // The note goes into the trace's JSON header, which holds UTF-8 only: refused now, not as
  // nlohmann's message once the log is read (issue 22, item 7).
  if (c.source_note && traces::escape_bytes(*c.source_note) != *c.source_note) {
    throw OptionError(fmt::format("--source-note: not UTF-8 text: {}", traces::escape_bytes(*c.source_note)));
  }
  // The log is read once (a pipe works as it is); the output is checked before anything is written.
  const InputFile input("file", c.input_path);
  OutputFile output("-o", c.output_path);
  refuse_same_files({&input}, {&output});
  mc::MooncakeReader reader(input.path(), options.block_tokens, c.skip_bad);
  traces::TraceHeader header;
  header.setting = options.setting;
  header.source = mc::import_source(c.input_path, options, options_json(c, options));
  if (c.source_note) header.source["note"] = *c.source_note;  // checked as UTF-8 with the options
  // Written to a temporary file beside the target and renamed at the end: a failed import leaves
  // the old file as it was and no partial trace (OutputFile removes its temporary file).
  mc::ImportStats stats;
  std::int64_t current_pages_peak = 0;  // of the batches written
  try {
    traces::TraceWriter writer(output.stream(), header);
    stats = mc::import_mooncake(reader, options, [&](const model::Batch& batch) {
      std::int64_t pages = 0;
      for (const model::Request& r : batch.requests) pages += model::current_page_count(r.extend_len, options.setting.page_size);
      current_pages_peak = std::max(current_pages_peak, pages);
      writer.write(batch);
    });
  } catch (const traces::TraceError&) {
    throw;
  } catch (const OptionError&) {
    throw;
  } catch (const std::exception& e) {
    // A failed write of the trace is the disk's fault (exit 1); anything else is the log's content
    // the importer cannot schedule (a pool too small for a request): bad input.
    if (!output.stream()) throw std::runtime_error(fmt::format("-o: cannot write {}: {}", c.output_path, e.what()));
    throw OptionError(e.what());
  }
  // --skip-bad on a file of garbage wrote an empty trace, exit 0, and said nothing (issue 22, item
  // 20): a log with no usable line is refused, and skipped lines are always said on stderr.
  if (stats.lines_skipped > 0 && stats.requests == 0) {
    throw OptionError(fmt::format("file: no line of {} is a usable request ({} skipped as bad; first: {})", c.input_path, stats.lines_skipped,
                                  stats.first_skip_reason));
  }
  output.commit();
  if (stats.lines_skipped > 0) {
    std::fputs(fmt::format("cpkv import mooncake: skipped {} bad line{} of {}; first: {}\n", stats.lines_skipped, stats.lines_skipped == 1 ? "" : "s",
                           stats.lines_read, traces::escape_bytes(stats.first_skip_reason, /*controls=*/true)).c_str(), stderr);
  }
  const model::StagingCapacity capacity = model::staging_capacity(options.setting);
  fmt::print("cpkv import mooncake: {} -> {}\n", c.input_path, c.output_path);
  fmt::print("  lines {} (skipped as bad: {}){}\n", stats.lines_read, stats.lines_skipped,
             stats.lines_skipped > 0 ? fmt::format("; first: {}", stats.first_skip_reason) : "");
  fmt::print("  requests {} ({} finished, {} chunked), input tokens {}\n", stats.requests, stats.requests_finished,
             stats.chunked_requests, stats.input_tokens);
  fmt::print("  prefix cache hit rate {:.4f} ({} of {} input tokens), evicted blocks {}, cached pages peak {}, pool pages in use peak {} of {}\n",
             stats.hit_rate(), stats.cache_hit_tokens, stats.input_tokens, stats.evicted_blocks, stats.cached_pages_peak,
             stats.pool_used_pages_peak, options.setting.pool_pages);
  fmt::print("  batches {} scheduled, {} written (skipped {}); extend tokens {}, chunk-prefix tokens {}\n", stats.batches,
             stats.batches_emitted, std::min(c.skip_batches, stats.batches), stats.extend_tokens, stats.chunk_prefix_tokens);
  fmt::print("  overflow batches {} (staging_slots {} from {}): {}\n", stats.overflow_batches, capacity.staging_slots,
             model::to_string(capacity.source), overflow_note(options.setting, capacity, current_pages_peak));
}

}  // namespace

void register_import(CLI::App& app) {
  auto c = std::make_shared<ImportCommandOptions>();
  CLI::App* import = app.add_subcommand("import", "Turn a request log into a batch trace (format cpkv-batch-trace v1).");
  import->require_subcommand(1);
  CLI::App* cmd = import->add_subcommand(
      "mooncake",
      "Import a Mooncake FAST'25 request log (JSON Lines: timestamp ms, input_length, output_length, hash_ids of 512-token "
      "prefix blocks). Requests in file (arrival) order go through a prefix cache keyed on the block hashes, a paged pool "
      "that hands out logical page ids from a FIFO free list, and a prefill scheduler under the admission caps with chunked "
      "prefill. Defaults: DeepSeek-V3.2 on 8xH200. Prints a summary (hit rate, batches, overflows). See traces/README.md.");
  cmd->add_option("file", c->input_path, "Mooncake request log (JSON Lines)")->required();
  cmd->add_option("-o,--output", c->output_path, "batch trace to write (a regular file, not the input; replaced only when the import succeeds)")->required();
  cmd->add_option("--cp", c->cp, fmt::format("ranks in the CP group (1..{})", model::limits::cp_max))->capture_default_str()->check(whole_in<std::int32_t>(1, model::limits::cp_max));
  cmd->add_option("--page-size", c->page_size, "tokens per KV page (power of two, 1..256, dividing --block-tokens)")->capture_default_str()->check(whole_in<std::int32_t>(1, model::limits::page_size_max));
  cmd->add_option("--buffer-kinds", c->buffer_kinds, "comma-separated KV buffer kinds: kv_fp8, kv_bf16, indexer_k")->capture_default_str();
  cmd->add_option("--layers", c->layers, "model layers (DeepSeek-V3.2: 61)")->capture_default_str()->check(whole_in<std::int32_t>(1, model::limits::layer_count_max));
  cmd->add_option("--layer-pattern", c->layer_pattern, "one F (runs the indexer) or S per layer (default: every layer F, as V3.2)");
  cmd->add_option("--pool-pages", c->pool_pages, "logical pages of the paged KV pool; cached blocks and in-flight requests share it")->capture_default_str()->check(whole_in<std::int64_t>(1, model::limits::pool_pages_max));
  cmd->add_option("--split", c->split, "writer policy recorded in the trace: zigzag, contiguous, round_robin (pages, section 2), or zigzag_tokens, continuous_tokens (an engine's token split, section 12)")->capture_default_str();
  cmd->add_option("--max-total-extend-tokens", c->max_total_extend_tokens, "admission cap: extend tokens per batch (>= page size); longer requests are chunked")->capture_default_str()->check(whole_in<std::int64_t>(1, model::limits::request_tokens_max));
  cmd->add_option("--max-batch-requests", c->max_batch_requests, "admission cap: requests (or chunks) per batch (>= 1)")->capture_default_str()->check(whole_in<std::int64_t>(1, model::limits::batch_requests_max));
  cmd->add_option("--staging-mib", c->staging_mib, "staging size override recorded in the trace (MiB; default: sized by the caps)")->check(whole_in<std::int64_t>(1, model::limits::staging_mib_max));
  cmd->add_option("--block-tokens", c->block_tokens, "tokens per prefix hash block of the log (Mooncake: 512)")->capture_default_str()->check(whole_in<std::int64_t>(1, model::limits::request_tokens_max));
  cmd->add_option("--cache-pages", c->cache_pages, "prefix cache capacity in pages, LRU eviction (default: bounded only by the pool)")->check(whole_in<std::int64_t>(0, model::limits::pool_pages_max));
  cmd->add_option("--cache-tokens", c->cache_tokens, "prefix cache capacity in tokens (rounded down to pages), LRU eviction")->check(whole_in<std::int64_t>(0, std::numeric_limits<std::int64_t>::max()));
  cmd->add_flag("--cache-unbounded", c->cache_unbounded, "never evict: the pool must hold every distinct block (pool exhaustion is an error)");
  cmd->add_option("--max-requests", c->max_requests, "read at most this many requests (a slice of the log)")->check(whole_in<std::int64_t>(1, std::numeric_limits<std::int64_t>::max()));
  cmd->add_option("--skip-batches", c->skip_batches, "schedule but do not write the first N batches (warms the cache)")->capture_default_str()->check(whole_in<std::int64_t>(0, std::numeric_limits<std::int64_t>::max()));
  cmd->add_option("--max-batches", c->max_batches, "write at most this many batches, then stop reading")->check(whole_in<std::int64_t>(1, std::numeric_limits<std::int64_t>::max()));
  cmd->add_flag("--skip-bad", c->skip_bad, "skip malformed lines and count them (default: refuse the log at the first one)");
  cmd->add_option("--source-note", c->source_note, "free text recorded as source.note in the header (attribution of the log)");
  cmd->callback([c] { run_import(*c); });
}

}  // namespace cpkv::cli

// Mooncake request logs to batch traces (mooncake.hpp; decisions in traces/README.md).
#include "cpkv/traces/mooncake.hpp"
#include "cpkv/traces/text.hpp"

#include <algorithm>
#include "cpkv/model/assert.hpp"
#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "cpkv/model/staging.hpp"
#include "json_line.hpp"

namespace cpkv::traces::mooncake {

namespace {

using nlohmann::json;

// Quoted input values are cut so one bad line cannot make a huge message. A container is named,
// not dumped: its dump would be as long as the line (and nlohmann's dump recurses per level).
std::string quote(const json& value) {
  if (value.is_array()) return "an array";
  if (value.is_object()) return "an object";
  return detail::clip(value.dump(-1, ' ', false, json::error_handler_t::replace), limits::quoted_value_bytes);
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Reader

MooncakeReader::MooncakeReader(const std::string& path, std::int64_t block_tokens, bool skip_bad)
    : name_(path), block_tokens_(block_tokens), skip_bad_(skip_bad) {
  auto file = std::make_unique<std::ifstream>(path);
  if (!file->is_open()) throw TraceError(path, 0, "file", fmt::format("cannot open: {}", std::strerror(errno)));
  in_ = std::move(file);
}

MooncakeReader::MooncakeReader(std::unique_ptr<std::istream> in, std::string name, std::int64_t block_tokens, bool skip_bad)
    : in_(std::move(in)), name_(std::move(name)), block_tokens_(block_tokens), skip_bad_(skip_bad) {}

std::optional<MooncakeRequest> MooncakeReader::next() {
  std::string text;
  while (true) {
    const detail::LineRead read = detail::read_line(*in_, text);
    if (read == detail::LineRead::end) break;
    ++line_;
    if (read == detail::LineRead::too_long) throw detail::line_too_long(name_, line_);  // never skipped: the rest of the line is not read
    try {
      MooncakeRequest request = parse(text);
      last_timestamp_ms_ = request.timestamp_ms;
      return request;
    } catch (const TraceError& e) {
      if (!skip_bad_) throw;
      if (skipped_ == 0) first_skip_reason_ = e.what();
      ++skipped_;
    }
  }
  if (in_->bad()) throw TraceError(name_, line_, "file", "read error");
  return std::nullopt;
}

MooncakeRequest MooncakeReader::parse(const std::string& text) const {
  const auto fail = [&](std::string field, std::string reason) -> void {
    throw TraceError(name_, line_, std::move(field), std::move(reason));
  };
  if (!text.empty() && text.back() == '\r') return parse(text.substr(0, text.size() - 1));
  if (text.find_first_not_of(" \t") == std::string::npos) fail("json", "blank line (every line must hold one request object)");
  // Other keys are ignored, but the whole line must still be JSON within the reader's limits: no
  // duplicate key (which of two input_length would count?), no nesting deeper than json_depth_max.
  detail::LineProblem problem;
  const std::optional<json> parsed = detail::parse_line(text, problem);
  if (!parsed) fail(problem.field, problem.reason);
  const json& object = *parsed;
  if (!object.is_object()) fail("json", "expected one JSON object per line");
  const auto integer = [&](const char* key, std::int64_t minimum) -> std::int64_t {
    const auto it = object.find(key);
    if (it == object.end() || it->is_null()) fail(key, "missing");
    if (!it->is_number_integer()) fail(key, fmt::format("expected an integer, got {}", quote(*it)));
    if (it->is_number_unsigned() && it->get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX)) fail(key, "too large");
    const auto value = it->get<std::int64_t>();
    if (value < minimum) fail(key, fmt::format("{} is less than {}", value, minimum));
    return value;
  };
  MooncakeRequest request;
  request.line = line_;
  request.timestamp_ms = integer("timestamp", 0);
  request.input_length = integer("input_length", 1);
  request.output_length = integer("output_length", 0);
  if (request.input_length > model::limits::request_tokens_max) {
    fail("input_length", fmt::format("{} exceeds the limit {} tokens per request", request.input_length, model::limits::request_tokens_max));
  }
  const auto ids = object.find("hash_ids");
  if (ids == object.end() || ids->is_null()) fail("hash_ids", "missing");
  if (!ids->is_array()) fail("hash_ids", fmt::format("expected an array, got {}", quote(*ids)));
  const std::int64_t blocks_expected = ceil_div(request.input_length, block_tokens_);
  if (static_cast<std::int64_t>(ids->size()) != blocks_expected) {
    fail("hash_ids", fmt::format("{} ids for input_length {} (expected ceil({} / {}) = {})", ids->size(), request.input_length,
                                 request.input_length, block_tokens_, blocks_expected));
  }
  request.hash_ids.reserve(ids->size());
  for (std::size_t k = 0; k < ids->size(); ++k) {
    const json& id = (*ids)[k];
    if (!id.is_number_integer() || (id.is_number_integer() && !id.is_number_unsigned() && id.get<std::int64_t>() < 0) ||
        (id.is_number_unsigned() && id.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))) {
      fail(fmt::format("hash_ids[{}]", k), fmt::format("expected a non-negative integer, got {}", quote(id)));
    }
    request.hash_ids.push_back(id.get<std::int64_t>());
  }
  if (line_ > 1 && request.timestamp_ms < last_timestamp_ms_) {
    fail("timestamp", fmt::format("{} is earlier than the previous request's {} (requests must be in arrival order)",
                                  request.timestamp_ms, last_timestamp_ms_));
  }
  return request;
}

// ---------------------------------------------------------------------------------------------
// Pool allocator

PageAllocator::PageAllocator(std::int64_t pool_pages) : pool_pages_(pool_pages) { CPKV_ASSERT(pool_pages >= 1); }

std::optional<std::int64_t> PageAllocator::allocate() {
  if (next_fresh_ < pool_pages_) return next_fresh_++;
  if (freed_.empty()) return std::nullopt;
  const std::int64_t page = freed_.front();
  freed_.pop_front();
  return page;
}

void PageAllocator::release(std::int64_t page) {
  CPKV_ASSERT(page >= 0 && page < next_fresh_);
  freed_.push_back(page);
  CPKV_ASSERT(static_cast<std::int64_t>(freed_.size()) <= next_fresh_);
}

// ---------------------------------------------------------------------------------------------
// Prefix cache

PrefixCache::PrefixCache(std::int64_t pages_per_block, std::optional<std::int64_t> capacity_pages)
    : pages_per_block_(pages_per_block), capacity_pages_(capacity_pages) {
  CPKV_ASSERT(pages_per_block >= 1);
}

std::int64_t PrefixCache::peek(std::span<const std::int64_t> hash_ids) const {
  std::int64_t blocks = 0;
  while (blocks < static_cast<std::int64_t>(hash_ids.size()) && blocks_.count(hash_ids[blocks]) != 0) ++blocks;
  return blocks;
}

std::int64_t PrefixCache::match_and_lock(std::span<const std::int64_t> hash_ids, std::int64_t max_blocks,
                                         std::vector<std::int64_t>& pages) {
  std::int64_t blocks = 0;
  const std::int64_t limit = std::min<std::int64_t>(max_blocks, static_cast<std::int64_t>(hash_ids.size()));
  while (blocks < limit) {
    const auto it = blocks_.find(hash_ids[blocks]);
    if (it == blocks_.end()) break;
    Block& block = it->second;
    if (block.locks++ == 0) lru_.erase(block.lru);
    pages.insert(pages.end(), block.pages.begin(), block.pages.end());
    ++blocks;
  }
  return blocks;
}

void PrefixCache::unlock(std::span<const std::int64_t> hash_ids, std::int64_t blocks) {
  // Deepest first: the parent ends up more recent than its child.
  for (std::int64_t k = blocks - 1; k >= 0; --k) {
    const auto it = blocks_.find(hash_ids[k]);
    CPKV_ASSERT(it != blocks_.end());
    Block& block = it->second;
    CPKV_ASSERT(block.locks > 0);
    if (--block.locks == 0) {
      lru_.push_front(hash_ids[k]);
      block.lru = lru_.begin();
    }
  }
}

bool PrefixCache::insert(std::int64_t hash_id, std::span<const std::int64_t> pages) {
  CPKV_ASSERT(static_cast<std::int64_t>(pages.size()) == pages_per_block_);
  const auto [it, inserted] = blocks_.try_emplace(hash_id);
  Block& block = it->second;
  if (!inserted) {
    if (block.locks == 0) lru_.splice(lru_.begin(), lru_, block.lru);  // touch
    return false;
  }
  block.pages.assign(pages.begin(), pages.end());
  lru_.push_front(hash_id);
  block.lru = lru_.begin();
  cached_pages_ += pages_per_block_;
  return true;
}

bool PrefixCache::evict_one(PageAllocator& pool) {
  if (lru_.empty()) return false;
  const std::int64_t victim = lru_.back();
  lru_.pop_back();
  const auto it = blocks_.find(victim);
  CPKV_ASSERT(it != blocks_.end() && it->second.locks == 0);
  for (std::int64_t page : it->second.pages) pool.release(page);
  blocks_.erase(it);
  cached_pages_ -= pages_per_block_;
  ++evicted_blocks_;
  return true;
}

void PrefixCache::enforce_capacity(PageAllocator& pool) {
  if (!capacity_pages_) return;
  while (cached_pages_ > *capacity_pages_ && evict_one(pool)) {
  }
}

// ---------------------------------------------------------------------------------------------
// Options

std::optional<model::Problem> validate(const ImportOptions& o) {
  if (auto problem = model::validate(o.setting)) return problem;
  const model::Setting& s = o.setting;
  if (!s.caps.max_total_extend_tokens || !s.caps.max_batch_requests) {
    return model::Problem{"caps", "the scheduler needs both max_total_extend_tokens and max_batch_requests"};
  }
  const std::int64_t cap_tokens = *s.caps.max_total_extend_tokens;
  const std::int64_t cap_requests = *s.caps.max_batch_requests;
  if (cap_tokens < s.page_size) {
    return model::Problem{"max_total_extend_tokens", fmt::format("{} is less than page_size {}: a chunk must hold at least one whole page", cap_tokens, s.page_size)};
  }
  if (cap_requests > model::limits::batch_requests_max) {
    return model::Problem{"max_batch_requests", fmt::format("{} exceeds the limit {}", cap_requests, model::limits::batch_requests_max)};
  }
  if (o.block_tokens < 1) return model::Problem{"block_tokens", fmt::format("{} is less than 1", o.block_tokens)};
  if (o.block_tokens % s.page_size != 0) {
    return model::Problem{"page_size", fmt::format("{} does not divide the prefix block size {} (the cache matches whole blocks of whole pages)", s.page_size, o.block_tokens)};
  }
  // One full batch must fit the pool with nothing cached: ceil(tokens / P) + requests pages.
  const std::int64_t batch_pages_max = ceil_div(cap_tokens, s.page_size) + cap_requests;
  if (s.pool_pages < batch_pages_max) {
    return model::Problem{"pool_pages", fmt::format("{} pages cannot hold one full batch (ceil({} / {}) + {} = {} pages)", s.pool_pages, cap_tokens, s.page_size, cap_requests, batch_pages_max)};
  }
  if (o.cache_mode == CacheMode::capacity && o.cache_capacity_pages < 0) {
    return model::Problem{"cache", fmt::format("capacity {} pages is negative", o.cache_capacity_pages)};
  }
  if (o.max_requests && *o.max_requests < 1) return model::Problem{"max_requests", "must be at least 1"};
  if (o.max_batches && *o.max_batches < 1) return model::Problem{"max_batches", "must be at least 1"};
  if (o.skip_batches < 0) return model::Problem{"skip_batches", "is negative"};
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// Scheduler

struct BatchScheduler::InFlight {
  MooncakeRequest request;
  std::int64_t hit_blocks = 0;      // leading blocks locked in the cache
  std::int64_t borrowed_pages = 0;  // pages[0, borrowed_pages) belong to the cache
  std::vector<std::int64_t> pages;  // the request's KV pages in sequence order
  std::int64_t computed_tokens = 0; // tokens whose KV exists (a multiple of P until the last chunk)
  std::int64_t chunks = 0;
  bool done() const { return computed_tokens == request.input_length; }
};

BatchScheduler::BatchScheduler(MooncakeReader& reader, const ImportOptions& options)
    : reader_(reader),
      options_(options),
      pages_per_block_(options.block_tokens / options.setting.page_size),
      pool_(options.setting.pool_pages),
      cache_(pages_per_block_, options.cache_mode == CacheMode::capacity ? std::optional<std::int64_t>(options.cache_capacity_pages)
                                                                          : std::nullopt) {
  if (auto problem = validate(options)) throw std::invalid_argument(fmt::format("{}: {}", problem->field, problem->reason));
}

BatchScheduler::~BatchScheduler() = default;

std::optional<MooncakeRequest> BatchScheduler::peek_request() {
  if (pending_) return pending_;
  if (input_done_) return std::nullopt;
  if (options_.max_requests && stats_.requests >= *options_.max_requests) {
    input_done_ = true;
    return std::nullopt;
  }
  pending_ = reader_.next();
  if (!pending_) input_done_ = true;
  return pending_;
}

bool BatchScheduler::allocate_pages(std::int64_t count, std::vector<std::int64_t>& pages) {
  // Evict first, then allocate: a failed admission leaves the free list's order untouched.
  while (pool_.free_pages() < count) {
    if (options_.cache_mode == CacheMode::unbounded || !cache_.evict_one(pool_)) return false;
  }
  for (std::int64_t k = 0; k < count; ++k) pages.push_back(*pool_.allocate());
  return true;
}

bool BatchScheduler::admit(InFlight& flight, std::int64_t budget_tokens, model::Batch& batch) {
  const std::int32_t page_size = options_.setting.page_size;
  const std::int64_t remaining = flight.request.input_length - flight.computed_tokens;
  // A chunk that is not the last ends on a page boundary, so the next chunk's prefix is whole pages.
  const std::int64_t chunk = remaining <= budget_tokens ? remaining : budget_tokens / page_size * page_size;
  if (chunk == 0) return false;
  CPKV_ASSERT(flight.computed_tokens % page_size == 0);
  CPKV_ASSERT(static_cast<std::int64_t>(flight.pages.size()) == flight.computed_tokens / page_size);
  const std::int64_t pages_needed = ceil_div(flight.computed_tokens + chunk, page_size) - static_cast<std::int64_t>(flight.pages.size());
  if (!allocate_pages(pages_needed, flight.pages)) return false;
  model::Request request;
  request.prefix_len = flight.computed_tokens;
  request.extend_len = chunk;
  request.prefix_pages.assign(flight.pages.begin(), flight.pages.begin() + flight.computed_tokens / page_size);
  batch.requests.push_back(std::move(request));
  if (flight.chunks > 0) stats_.chunk_prefix_tokens += flight.computed_tokens;
  stats_.extend_tokens += chunk;
  flight.computed_tokens += chunk;
  ++flight.chunks;
  if (flight.chunks == 2) ++stats_.chunked_requests;
  return true;
}

void BatchScheduler::finish(InFlight& flight) {
  const std::int64_t full_blocks = flight.request.input_length / options_.block_tokens;
  std::vector<bool> given_to_cache(flight.pages.size(), false);
  // New full blocks enter the cache deepest first, then the matched chain is unlocked deepest first:
  // parents stay more recent than children.
  for (std::int64_t block = full_blocks - 1; block >= flight.hit_blocks; --block) {
    const std::int64_t first = block * pages_per_block_;
    CPKV_ASSERT(first >= flight.borrowed_pages);
    const std::span<const std::int64_t> pages(flight.pages.data() + first, static_cast<std::size_t>(pages_per_block_));
    if (cache_.insert(flight.request.hash_ids[block], pages)) {
      std::fill(given_to_cache.begin() + first, given_to_cache.begin() + first + pages_per_block_, true);
    }
  }
  for (std::size_t k = static_cast<std::size_t>(flight.borrowed_pages); k < flight.pages.size(); ++k) {
    if (!given_to_cache[k]) pool_.release(flight.pages[k]);
  }
  cache_.unlock(flight.request.hash_ids, flight.hit_blocks);
  ++stats_.requests_finished;
}

void BatchScheduler::release_finished() {
  for (auto& flight : finished_) finish(*flight);
  finished_.clear();
  cache_.enforce_capacity(pool_);
}

std::optional<model::Batch> BatchScheduler::next_batch() {
  release_finished();
  const model::Setting& s = options_.setting;
  std::int64_t budget_tokens = *s.caps.max_total_extend_tokens;
  std::int64_t budget_requests = *s.caps.max_batch_requests;
  model::Batch batch;
  const auto pool_too_small = [&](const InFlight& flight) {
    return std::runtime_error(fmt::format(
        "request at line {} ({} tokens, {} computed): the pool of {} pages cannot hold its next chunk even with every "
        "unlocked cached block evicted ({} pages in use); raise --pool-pages",
        flight.request.line, flight.request.input_length, flight.computed_tokens, pool_.pool_pages(), pool_.used_pages()));
  };
  if (chunked_) {
    // The request being chunked leads the batch (SGLang schedules its next chunk first).
    if (!admit(*chunked_, budget_tokens, batch)) throw pool_too_small(*chunked_);
    budget_tokens -= batch.requests.back().extend_len;
    --budget_requests;
    if (!chunked_->done()) {
      stats_.cached_pages_peak = std::max(stats_.cached_pages_peak, cache_.cached_pages());
      stats_.pool_used_pages_peak = std::max(stats_.pool_used_pages_peak, pool_.used_pages());
      ++stats_.batches;
      return batch;
    }
    finished_.push_back(std::move(chunked_));
  }
  while (budget_requests > 0 && budget_tokens > 0) {
    const std::optional<MooncakeRequest> next = peek_request();
    if (!next) break;
    auto flight = std::make_unique<InFlight>();
    flight->request = *next;
    const std::int64_t full_blocks = flight->request.input_length / options_.block_tokens;
    flight->hit_blocks = cache_.match_and_lock(flight->request.hash_ids, full_blocks, flight->pages);
    // At least one token is computed; the cached prefix is whole pages.
    const std::int64_t last_prefix_max = (flight->request.input_length - 1) / s.page_size * s.page_size;
    const std::int64_t hit_tokens = std::min(flight->hit_blocks * options_.block_tokens, last_prefix_max);
    flight->borrowed_pages = hit_tokens / s.page_size;
    flight->pages.resize(static_cast<std::size_t>(flight->borrowed_pages));
    flight->computed_tokens = hit_tokens;
    if (!admit(*flight, budget_tokens, batch)) {
      cache_.unlock(flight->request.hash_ids, flight->hit_blocks);
      if (batch.requests.empty()) throw pool_too_small(*flight);
      break;
    }
    pending_.reset();
    ++stats_.requests;
    stats_.input_tokens += flight->request.input_length;
    stats_.cache_hit_tokens += hit_tokens;
    budget_tokens -= batch.requests.back().extend_len;
    --budget_requests;
    if (!flight->done()) {
      chunked_ = std::move(flight);
      break;
    }
    finished_.push_back(std::move(flight));
  }
  if (batch.requests.empty()) {
    stats_.evicted_blocks = cache_.evicted_blocks();
    return std::nullopt;
  }
  stats_.cached_pages_peak = std::max(stats_.cached_pages_peak, cache_.cached_pages());
  stats_.pool_used_pages_peak = std::max(stats_.pool_used_pages_peak, pool_.used_pages());
  ++stats_.batches;
  return batch;
}

// ---------------------------------------------------------------------------------------------
// The whole import

nlohmann::json import_source(const std::string& input_path, const ImportOptions& options, const nlohmann::json& command_options) {
  (void)options;
  return {{"kind", "imported"},
          {"format", "mooncake-fast25"},
          {"importer", "cpkv import mooncake"},
          {"file", escape_bytes(input_path)},  // a name of any bytes; JSON holds UTF-8 only
          {"options", command_options},
          {"see", "traces/README.md"}};
}

ImportStats import_mooncake(MooncakeReader& reader, const ImportOptions& options,
                            const std::function<void(const model::Batch&)>& write) {
  BatchScheduler scheduler(reader, options);
  const model::StagingCapacity capacity = model::staging_capacity(options.setting);
  std::int64_t emitted = 0;
  std::int64_t overflow_batches = 0;
  while (!options.max_batches || emitted < *options.max_batches) {
    const std::optional<model::Batch> batch = scheduler.next_batch();
    if (!batch) break;
    if (scheduler.stats().batches <= options.skip_batches) continue;
    std::int64_t current_pages_total = 0;
    for (const model::Request& r : batch->requests) current_pages_total += model::current_page_count(r.extend_len, options.setting.page_size);
    if (model::overflow_verdict(current_pages_total, capacity.staging_slots).overflow) ++overflow_batches;
    write(*batch);
    ++emitted;
  }
  ImportStats stats = scheduler.stats();
  stats.batches_emitted = emitted;
  stats.overflow_batches = overflow_batches;
  stats.evicted_blocks = scheduler.cache().evicted_blocks();
  stats.lines_read = reader.lines_read();
  stats.lines_skipped = reader.lines_skipped();
  stats.first_skip_reason = reader.first_skip_reason();
  return stats;
}

}  // namespace cpkv::traces::mooncake

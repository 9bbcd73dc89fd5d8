// Import of Mooncake FAST'25 request logs (PROTOCOL.md section 10): one JSON object per request
// (`timestamp` ms, `input_length`, `output_length`, `hash_ids` of 512-token prefix blocks) becomes a
// batch trace the way a paged serving system would batch it:
//   MooncakeReader  -> requests, strictly checked (or skipped and counted)
//   PrefixCache     -> the longest run of leading cached blocks, LRU eviction of unlocked leaves
//   PageAllocator   -> logical page ids from a FIFO free list, as a paged pool hands them out
//   BatchScheduler  -> prefill batches in arrival order under the admission caps, chunked prefill
// Everything streams: memory is bounded by the pool, the caps and one request, never by the input.
// The decisions (what is cached, when pages are freed, how chunks are cut) are in traces/README.md.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <istream>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "cpkv/model/batch.hpp"
#include "cpkv/model/setting.hpp"
#include "cpkv/traces/trace.hpp"

namespace cpkv::traces::mooncake {

// Mooncake hashes prefixes in blocks of 512 tokens.
inline constexpr std::int64_t kBlockTokensDefault = 512;

struct MooncakeRequest {
  std::int64_t timestamp_ms = 0;
  std::int64_t input_length = 0;   // tokens, >= 1
  std::int64_t output_length = 0;  // tokens; read and checked, not used (decode is not modelled)
  std::vector<std::int64_t> hash_ids;  // ceil(input_length / block_tokens) of them
  std::int64_t line = 0;               // where it came from, 1-based
};

// Reads one request per line. A malformed line throws TraceError `FILE:LINE: FIELD: REASON`, or,
// with skip_bad, is counted (and its first reason kept) and skipped.
class MooncakeReader {
 public:
  MooncakeReader(const std::string& path, std::int64_t block_tokens, bool skip_bad);
  MooncakeReader(std::unique_ptr<std::istream> in, std::string name, std::int64_t block_tokens, bool skip_bad);

  std::optional<MooncakeRequest> next();
  std::int64_t lines_read() const { return line_; }
  std::int64_t lines_skipped() const { return skipped_; }
  const std::string& first_skip_reason() const { return first_skip_reason_; }

 private:
  MooncakeRequest parse(const std::string& text) const;  // throws TraceError
  std::unique_ptr<std::istream> in_;
  std::string name_;
  std::int64_t block_tokens_;
  bool skip_bad_;
  std::int64_t line_ = 0;
  std::int64_t skipped_ = 0;
  std::string first_skip_reason_;
  std::int64_t last_timestamp_ms_ = 0;
};

// Logical page ids of a paged pool of `pool_pages` pages, handed out like a FIFO free list that
// starts as 0, 1, ..., pool_pages-1: never-used ids first in order, then freed ids in the order they
// were freed. So a prefix that was cached, evicted and recomputed lands on scattered pages.
class PageAllocator {
 public:
  explicit PageAllocator(std::int64_t pool_pages);
  std::optional<std::int64_t> allocate();
  void release(std::int64_t page);
  std::int64_t free_pages() const { return pool_pages_ - next_fresh_ + static_cast<std::int64_t>(freed_.size()); }
  std::int64_t used_pages() const { return pool_pages_ - free_pages(); }
  std::int64_t pool_pages() const { return pool_pages_; }

 private:
  std::int64_t pool_pages_;
  std::int64_t next_fresh_ = 0;
  std::deque<std::int64_t> freed_;
};

// Cached prefix blocks keyed on their hash id. A block holds pages_per_block pages. Blocks matched
// by an in-flight request are locked (never evicted). Unlocked blocks sit in an LRU list; a request
// touches its chain deepest block first, so a parent is always more recent than its children and
// the LRU victim is always a leaf (as a radix cache evicts leaves).
class PrefixCache {
 public:
  // capacity_pages: nullopt = no capacity of its own (evicted only when the pool needs pages).
  PrefixCache(std::int64_t pages_per_block, std::optional<std::int64_t> capacity_pages);

  // The longest run of leading blocks of `hash_ids` (at most max_blocks) that is cached; locks them
  // and appends their pages to `pages`. Returns the number of blocks.
  std::int64_t match_and_lock(std::span<const std::int64_t> hash_ids, std::int64_t max_blocks,
                              std::vector<std::int64_t>& pages);
  // The leading run without locking or touching (for tests and reports).
  std::int64_t peek(std::span<const std::int64_t> hash_ids) const;
  // Unlocks the first `blocks` blocks of a chain locked by match_and_lock, deepest first.
  void unlock(std::span<const std::int64_t> hash_ids, std::int64_t blocks);
  // Caches a block as most recent. False (and nothing changes but its recency) if already cached:
  // the caller keeps and frees its pages.
  bool insert(std::int64_t hash_id, std::span<const std::int64_t> pages);
  // Evicts the least recently used unlocked block; false if none. Its pages go back to `pool`.
  bool evict_one(PageAllocator& pool);
  // Evicts until within the capacity (as far as unlocked blocks allow).
  void enforce_capacity(PageAllocator& pool);

  std::int64_t cached_pages() const { return cached_pages_; }
  std::int64_t cached_blocks() const { return static_cast<std::int64_t>(blocks_.size()); }
  std::int64_t evicted_blocks() const { return evicted_blocks_; }
  std::optional<std::int64_t> capacity_pages() const { return capacity_pages_; }
  bool contains(std::int64_t hash_id) const { return blocks_.count(hash_id) != 0; }

 private:
  struct Block {
    std::vector<std::int64_t> pages;
    std::int64_t locks = 0;
    std::list<std::int64_t>::iterator lru;  // valid while locks == 0; front = most recent
  };
  std::int64_t pages_per_block_;
  std::optional<std::int64_t> capacity_pages_;
  std::unordered_map<std::int64_t, Block> blocks_;  // looked up only, never iterated: no order leaks
  std::list<std::int64_t> lru_;
  std::int64_t cached_pages_ = 0;
  std::int64_t evicted_blocks_ = 0;
};

enum class CacheMode : std::uint8_t {
  pool,       // no capacity of its own: cached blocks live until the pool needs their pages (SGLang's radix cache)
  capacity,   // at most capacity_pages cached pages, LRU eviction after every batch (and on pool pressure)
  unbounded,  // never evicted: the pool must hold every distinct block (pool exhaustion is an error)
};

struct ImportOptions {
  model::Setting setting;  // cp, P, kinds, layers, pool, split, caps (both admission caps required)
  std::int64_t block_tokens = kBlockTokensDefault;
  CacheMode cache_mode = CacheMode::pool;
  std::int64_t cache_capacity_pages = 0;  // CacheMode::capacity only
  std::optional<std::int64_t> max_requests;  // read at most this many requests
  std::int64_t skip_batches = 0;             // schedule but do not emit the first batches
  std::optional<std::int64_t> max_batches;   // emit at most this many batches
};

// A reason the options cannot work, or nullopt. Checked before any input is read.
std::optional<model::Problem> validate(const ImportOptions& options);

struct ImportStats {
  std::int64_t requests = 0;           // admitted (read and scheduled)
  std::int64_t requests_finished = 0;  // whose last chunk was in a batch
  std::int64_t input_tokens = 0;       // of admitted requests
  std::int64_t cache_hit_tokens = 0;   // prefix tokens served by the prefix cache (first chunks)
  std::int64_t chunk_prefix_tokens = 0;  // prefix tokens of later chunks (the request's earlier chunks)
  std::int64_t extend_tokens = 0;
  std::int64_t chunked_requests = 0;  // split into more than one chunk
  std::int64_t batches = 0;           // scheduled (emitted or skipped)
  std::int64_t batches_emitted = 0;
  std::int64_t overflow_batches = 0;  // of the emitted ones, against the setting's staging
  std::int64_t evicted_blocks = 0;
  std::int64_t cached_pages_peak = 0;
  std::int64_t pool_used_pages_peak = 0;
  std::int64_t lines_read = 0;
  std::int64_t lines_skipped = 0;
  std::string first_skip_reason;
  double hit_rate() const { return input_tokens == 0 ? 0.0 : static_cast<double>(cache_hit_tokens) / input_tokens; }
};

// Forms prefill batches from the reader's requests. A request is matched against the cache when it
// is admitted to a batch, and its blocks enter the cache when the batch after its last chunk is
// formed (the batch has run by then). Throws TraceError for bad input and std::runtime_error when
// the pool cannot hold what the caps admit.
class BatchScheduler {
 public:
  BatchScheduler(MooncakeReader& reader, const ImportOptions& options);
  ~BatchScheduler();
  std::optional<model::Batch> next_batch();
  const ImportStats& stats() const { return stats_; }
  const PrefixCache& cache() const { return cache_; }
  const PageAllocator& pool() const { return pool_; }

 private:
  struct InFlight;
  std::optional<MooncakeRequest> peek_request();
  bool admit(InFlight& flight, std::int64_t budget_tokens, model::Batch& batch);
  bool allocate_pages(std::int64_t count, std::vector<std::int64_t>& pages);
  void finish(InFlight& flight);
  void release_finished();

  MooncakeReader& reader_;
  ImportOptions options_;
  std::int64_t pages_per_block_;
  PageAllocator pool_;
  PrefixCache cache_;
  std::optional<MooncakeRequest> pending_;
  std::unique_ptr<InFlight> chunked_;                // the one request whose next chunk leads the next batch
  std::vector<std::unique_ptr<InFlight>> finished_;  // finished in the last batch, released before the next
  bool input_done_ = false;
  ImportStats stats_;
};

// The header `source` object of an imported trace: origin, file, options, attribution.
nlohmann::json import_source(const std::string& input_path, const ImportOptions& options,
                             const nlohmann::json& command_options);

// Runs the whole import, writing batches with `write` as they are formed.
ImportStats import_mooncake(MooncakeReader& reader, const ImportOptions& options,
                            const std::function<void(const model::Batch&)>& write);

}  // namespace cpkv::traces::mooncake

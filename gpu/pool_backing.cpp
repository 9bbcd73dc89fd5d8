#include "pool_backing.hpp"

#include <algorithm>
#include <stdexcept>
#include <string_view>

#include <fmt/format.h>

#include "cpkv/model/staging.hpp"

namespace cpkv::cuda {

namespace {

std::uint64_t align_256(std::uint64_t v) { return (v + 255) / 256 * 256; }

// The pad, the barrier status and state, the pad table: small buffers, each its own allocation.
constexpr std::uint64_t kFlagBytes = 4 * 256;
constexpr std::uint64_t kVerifyResultBytes = 16;  // sizeof(kernels::VerifyResult), per layer and kind

double gib(std::uint64_t bytes) { return static_cast<double>(bytes) / static_cast<double>(1ULL << 30); }

std::string_view name(PoolMemory m) { return m == PoolMemory::sparse ? "sparse" : "dense"; }

std::string ranks_text(const std::vector<std::int32_t>& ranks) {
  std::string text;
  for (std::int32_t r : ranks) text += fmt::format("{}{}", text.empty() ? "" : " ", r);
  return text;
}

std::string gpu_text(const GpuNeed& g) {
  const RankNeed& n = g.need;
  return fmt::format("GPU {} (ranks {}) needs {:.2f} GiB: pool {:.2f} GiB backed of {:.2f} GiB reserved, staging/dense/compact/scratch {:.2f} GiB, "
                     "bench {:.2f} GiB, {:.2f} GiB for {} rank context(s); {:.2f} GiB free",
                     g.gpu, ranks_text(g.ranks), gib(n.total()), gib(n.pool_backed), gib(n.pool_reserved), gib(n.other), gib(n.bench), gib(n.overhead),
                     g.ranks.size(), gib(g.free));
}

}  // namespace

BufferLayout buffer_layout(const model::Setting& setting, std::int32_t layers, const harness::SourceShape& shape) {
  BufferLayout b;
  const std::size_t kinds = setting.kinds.size();
  for (std::size_t k = 0; k < kinds; ++k) b.page_bytes.push_back(std::uint64_t{setting.kinds[k].row_bytes} * setting.page_size);
  b.pool_pages_per_rank = setting.pool_pages_per_rank();
  b.pool_offset.assign(layers, std::vector<std::uint64_t>(kinds));
  for (std::int32_t l = 0; l < layers; ++l) {
    for (std::size_t k = 0; k < kinds; ++k) {
      b.pool_offset[l][k] = b.pool_bytes;
      b.pool_bytes = align_256(b.pool_bytes + static_cast<std::uint64_t>(b.pool_pages_per_rank) * b.page_bytes[k]);
    }
  }
  b.guard_bytes = kGuardBytesMin;
  for (std::size_t k = 0; k < kinds; ++k) b.guard_bytes = std::max(b.guard_bytes, align_256(b.page_bytes[k]));
  b.dense_offset.assign(2, std::vector<std::uint64_t>(kinds));
  for (int h = 0; h < 2; ++h) {
    for (std::size_t k = 0; k < kinds; ++k) {
      b.dense_offset[h][k] = b.dense_bytes;
      b.dense_bytes = align_256(b.dense_bytes + shape.slot_count_max * b.page_bytes[k] + b.guard_bytes);
    }
  }
  std::uint64_t page_bytes_max = 0;
  for (std::size_t k = 0; k < kinds; ++k) {
    b.compact_offset.push_back(b.compact_bytes);
    b.compact_bytes = align_256(b.compact_bytes + shape.current_pages_max * b.page_bytes[k]);
    page_bytes_max = std::max(page_bytes_max, b.page_bytes[k]);
  }
  b.staging_bytes = std::max<std::uint64_t>(model::carve_arena(setting, model::staging_capacity(setting).staging_slots, 0).staging_bytes, 256);
  b.scratch_bytes = std::max<std::uint64_t>(256, std::max(shape.slot_count_max, shape.current_pages_max) * page_bytes_max);
  return b;
}

std::vector<std::int64_t> local_pages(const std::vector<std::int64_t>& pages_touched, std::int32_t cp, std::int32_t rank) {
  std::vector<std::int64_t> local;
  for (std::int64_t g : pages_touched) {
    if (g % cp == rank) local.push_back(g / cp);
  }
  std::sort(local.begin(), local.end());
  local.erase(std::unique(local.begin(), local.end()), local.end());
  return local;
}

std::uint64_t round_up(std::uint64_t bytes, std::uint64_t granularity) { return (bytes + granularity - 1) / granularity * granularity; }

std::vector<ByteRun> backed_runs(const BufferLayout& layout, const std::vector<std::int64_t>& local, std::uint64_t granularity) {
  if (granularity == 0 || (granularity & (granularity - 1)) != 0) throw std::invalid_argument(fmt::format("granularity {} is not a power of two", granularity));
  std::vector<std::uint64_t> chunks;  // chunk indices holding a byte of a referenced page
  for (const std::vector<std::uint64_t>& layer : layout.pool_offset) {
    for (std::size_t k = 0; k < layer.size(); ++k) {
      for (std::int64_t page : local) {
        if (page < 0 || page >= layout.pool_pages_per_rank) {
          throw std::invalid_argument(fmt::format("local pool page {} is outside 0..{}", page, layout.pool_pages_per_rank - 1));
        }
        const std::uint64_t begin = layer[k] + static_cast<std::uint64_t>(page) * layout.page_bytes[k];
        for (std::uint64_t c = begin / granularity; c <= (begin + layout.page_bytes[k] - 1) / granularity; ++c) chunks.push_back(c);
      }
    }
  }
  std::sort(chunks.begin(), chunks.end());
  chunks.erase(std::unique(chunks.begin(), chunks.end()), chunks.end());
  std::vector<ByteRun> runs;
  for (std::uint64_t c : chunks) {
    if (!runs.empty() && runs.back().offset + runs.back().bytes == c * granularity) {
      runs.back().bytes += granularity;
    } else {
      runs.push_back({c * granularity, granularity});
    }
  }
  return runs;
}

std::uint64_t total_bytes(const std::vector<ByteRun>& runs) {
  std::uint64_t sum = 0;
  for (const ByteRun& r : runs) sum += r.bytes;
  return sum;
}

bool page_backed(const BufferLayout& layout, const std::vector<ByteRun>& runs, std::int32_t layer, std::size_t kind, std::int64_t page) {
  const std::uint64_t begin = layout.pool_offset[layer][kind] + static_cast<std::uint64_t>(page) * layout.page_bytes[kind];
  const std::uint64_t end = begin + layout.page_bytes[kind];
  // The last run starting at or before `begin`; runs never touch (adjacent ones are merged), so it alone can hold the page.
  auto it = std::upper_bound(runs.begin(), runs.end(), begin, [](std::uint64_t v, const ByteRun& r) { return v < r.offset; });
  if (it == runs.begin()) return false;
  --it;
  return end <= it->offset + it->bytes;
}

PoolMemory pool_memory_from(const char* value) {
  if (value == nullptr || std::string_view(value) == "sparse") return PoolMemory::sparse;
  if (std::string_view(value) == "dense") return PoolMemory::dense;
  throw std::invalid_argument(fmt::format("pool memory '{}' is neither sparse nor dense", value));
}

namespace {

PoolPlan pool_plan(const model::Setting& setting, std::int32_t layers, const harness::SourceShape& shape, const NeedInputs& in) {
  PoolPlan plan;
  plan.cp = setting.cp;
  plan.memory = in.pool_memory;
  plan.layout = buffer_layout(setting, layers, shape);
  if (in.pool_memory == PoolMemory::dense) {
    plan.reserved = std::max<std::uint64_t>(plan.layout.pool_bytes, 256);
    return plan;
  }
  plan.reserved = round_up(plan.layout.pool_bytes, in.granularity);
  for (std::int32_t r = 0; r < setting.cp; ++r) plan.runs.push_back(backed_runs(plan.layout, local_pages(shape.pool_pages_touched, setting.cp, r), in.granularity));
  return plan;
}

RankNeed rank_need(const PoolPlan& plan, std::int32_t rank, const NeedInputs& in) {
  const BufferLayout& layout = plan.layout;
  RankNeed need;
  need.pool_reserved = plan.reserved;
  need.pool_backed = plan.memory == PoolMemory::sparse ? total_bytes(plan.runs.at(rank)) : plan.reserved;
  const std::uint64_t layers = layout.pool_offset.size(), kinds = layout.page_bytes.size();
  need.other = layout.staging_bytes + std::max<std::uint64_t>(layout.dense_bytes, 256) + std::max<std::uint64_t>(layout.compact_bytes, 256) +
               layout.scratch_bytes + kFlagBytes + layers * kinds * kVerifyResultBytes;
  need.bench = in.measure_ceilings ? in.bench_buffer_bytes : 0;
  return need;
}

std::vector<GpuNeed> gpu_needs(const PoolPlan& plan, std::int32_t gpus, const std::vector<std::uint64_t>& free_bytes, const NeedInputs& in) {
  std::vector<GpuNeed> needs;
  for (std::int32_t g = 0; g < std::min(gpus, plan.cp); ++g) {
    GpuNeed gpu;
    gpu.gpu = g;
    gpu.free = g < static_cast<std::int32_t>(free_bytes.size()) ? free_bytes[g] : 0;
    gpu.need.overhead = 0;
    for (std::int32_t r = g; r < plan.cp; r += gpus) {
      const RankNeed n = rank_need(plan, r, in);
      gpu.ranks.push_back(r);
      gpu.need.pool_reserved += n.pool_reserved;
      gpu.need.pool_backed += n.pool_backed;
      gpu.need.other += n.other;
      gpu.need.bench += n.bench;
      gpu.need.overhead += n.overhead;
    }
    needs.push_back(gpu);
  }
  return needs;
}

// "gpu memory (sparse pool): GPU 0 (ranks 0 1) needs ...": every GPU's need on one line.
std::string need_line(const std::vector<GpuNeed>& needs, PoolMemory pool_memory) {
  std::string line = fmt::format("gpu memory ({} pool):", name(pool_memory));
  for (std::size_t i = 0; i < needs.size(); ++i) line += fmt::format("{} {}", i == 0 ? "" : " |", gpu_text(needs[i]));
  return line;
}

// Empty when every GPU fits; else the one line of the refusal, naming the first GPU that does not.
std::string refusal(const std::vector<GpuNeed>& needs, PoolMemory pool_memory) {
  for (const GpuNeed& g : needs) {
    if (g.fits()) continue;
    return fmt::format("cuda: the run does not fit: {} ({} pool{}); nothing was allocated", gpu_text(g), name(pool_memory),
                       pool_memory == PoolMemory::dense ? ": CPKV_POOL_MEMORY=sparse backs only the pages the batches read" : "");
  }
  return {};
}

}  // namespace

PoolVerdict pool_verdict(const model::Setting& setting, std::int32_t layers, const harness::SourceShape& shape, const NeedInputs& in,
                         const std::vector<std::uint64_t>& free_bytes) {
  PoolVerdict v;
  v.plan = pool_plan(setting, layers, shape, in);
  v.needs = gpu_needs(v.plan, static_cast<std::int32_t>(free_bytes.size()), free_bytes, in);
  v.need_line = need_line(v.needs, in.pool_memory);
  v.refusal = refusal(v.needs, in.pool_memory);
  return v;
}

}  // namespace cpkv::cuda

// The plugin host's guards (plugin_guards.hpp): guard regions, the pool's page hashes, the
// milestones that name a device fault, the model's figure beside a plugin's counters.
#include "plugin_guards.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "cpkv/model/plan.hpp"

namespace cpkv::cuda {

DeviceMilestones::DeviceMilestones() {
  void* host = nullptr;
  CPKV_CUDA_CHECK(cudaHostAlloc(&host, sizeof(std::uint64_t), cudaHostAllocMapped | cudaHostAllocPortable));
  host_word_ = static_cast<volatile std::uint64_t*>(host);
  *host_word_ = 0;
  void* device = nullptr;
  CPKV_CUDA_CHECK(cudaHostGetDevicePointer(&device, host, 0));
  device_word_ = static_cast<std::uint64_t*>(device);
}

DeviceMilestones::~DeviceMilestones() { (void)cudaFreeHost(const_cast<std::uint64_t*>(host_word_)); }

std::uint64_t DeviceMilestones::next(std::string work_after) {
  after_[++issued_] = std::move(work_after);
  return issued_;
}

void DeviceMilestones::stamp(cudaStream_t stream, std::string work_after) {
  const std::uint64_t value = next(std::move(work_after));
  CPKV_CUDA_CHECK(kernels::launch_stamp(device_word_, value, stream));
}

std::string DeviceMilestones::place() const {
  if (!context_lost()) return {};
  const std::uint64_t reached = *host_word_;
  const auto it = after_.find(reached);
  return it == after_.end() ? std::string() : it->second;
}

PluginGuards::PluginGuards(Rank& r) : r_(r), layers_(r.ctx.options.layers) {
  CPKV_CUDA_CHECK(cudaMalloc(&results_, static_cast<std::size_t>(std::max(layers_, 1)) * sizeof(kernels::GuardResult)));
  CPKV_CUDA_CHECK(cudaMalloc(&compare_, sizeof(kernels::HashCompare)));
  const model::Setting& setting = r.ctx.source.setting;
  for (std::int32_t half = 0; half < 2; ++half) {
    for (std::size_t k = 0; k < setting.kinds.size(); ++k) {
      add_region(r.mem.dense_half(half, k) + r.ctx.shape.slot_count_max * r.page_bytes(k), fmt::format("dense buffer of {} half {}", setting.kinds[k].name, half));
    }
  }
  list_pool_pages();
}

PluginGuards::~PluginGuards() {
  for (void* p : {static_cast<void*>(regions_dev_), static_cast<void*>(results_), static_cast<void*>(pages_dev_), static_cast<void*>(reference_),
                  static_cast<void*>(compare_)}) {
    if (p != nullptr) (void)cudaFree(p);
  }
}

void PluginGuards::add_region(std::uint8_t* base, std::string what) {
  CPKV_ASSERT(regions_dev_ == nullptr && regions_.size() < static_cast<std::size_t>(kernels::kGuardRegionsMax));
  const std::uint64_t bytes = r_.mem.layout.guard_bytes;
  std::vector<std::uint8_t> poison(bytes);
  for (std::uint64_t i = 0; i < bytes; ++i) poison[i] = kernels::guard_byte(i);
  CPKV_CUDA_CHECK(cudaMemcpy(base, poison.data(), bytes, cudaMemcpyHostToDevice));
  regions_.push_back({base, bytes});
  region_names_.push_back(std::move(what));
}

void PluginGuards::seal() {
  CPKV_CUDA_CHECK(cudaMalloc(&regions_dev_, regions_.size() * sizeof(kernels::GuardRegion)));
  CPKV_CUDA_CHECK(cudaMemcpy(regions_dev_, regions_.data(), regions_.size() * sizeof(kernels::GuardRegion), cudaMemcpyHostToDevice));
}

// The pages of the own slabs with memory behind them: every page of a dense pool; of a sparse
// one, the pages that lie whole inside a backed run (the runs hold every referenced page, and the
// neighbours that share their 2-MiB chunks).
void PluginGuards::list_pool_pages() {
  const BufferLayout& layout = r_.mem.layout;
  const PoolPlan& plan = r_.ctx.pool_share->plan;
  const std::vector<ByteRun> dense_run = {ByteRun{0, layout.pool_bytes}};
  const std::vector<ByteRun>& runs = plan.memory == PoolMemory::dense ? dense_run : plan.runs[r_.ctx.rank];
  const std::size_t kinds = layout.page_bytes.size();
  for (std::size_t l = 0; l < layout.pool_offset.size(); ++l) {
    for (std::size_t k = 0; k < kinds; ++k) {
      const std::uint64_t base = layout.pool_offset[l][k], pb = layout.page_bytes[k];
      const auto pages = static_cast<std::uint64_t>(layout.pool_pages_per_rank);
      for (const ByteRun& run : runs) {
        const std::uint64_t first = run.offset <= base ? 0 : (run.offset - base + pb - 1) / pb;
        const std::uint64_t end_bytes = run.offset + run.bytes;
        const std::uint64_t last = end_bytes <= base ? 0 : std::min(pages, (end_bytes - base) / pb);  // one past
        for (std::uint64_t q = first; q < last; ++q) {
          pages_.push_back({base + q * pb, pb});
          page_slab_.push_back(static_cast<std::uint32_t>(l * kinds + k));
          page_local_.push_back(static_cast<std::int64_t>(q));
        }
      }
    }
  }
  if (pages_.empty()) return;
  CPKV_CUDA_CHECK(cudaMalloc(&pages_dev_, pages_.size() * sizeof(kernels::HashedPage)));
  CPKV_CUDA_CHECK(cudaMemcpy(pages_dev_, pages_.data(), pages_.size() * sizeof(kernels::HashedPage), cudaMemcpyHostToDevice));
  CPKV_CUDA_CHECK(cudaMalloc(&reference_, pages_.size() * sizeof(std::uint64_t)));
}

void PluginGuards::begin_batch() {
  const std::vector<kernels::GuardResult> init(static_cast<std::size_t>(std::max(layers_, 1)), kernels::GuardResult{0, ~0ULL});
  CPKV_CUDA_CHECK(cudaMemcpyAsync(results_, init.data(), init.size() * sizeof(kernels::GuardResult), cudaMemcpyHostToDevice, r_.stream));
}

void PluginGuards::hash_pool_reference() {
  CPKV_CUDA_CHECK(kernels::launch_hash_pages(r_.mem.pool, pages_dev_, static_cast<std::int64_t>(pages_.size()), reference_, false, compare_, r_.stream));
}

void PluginGuards::garbage_dense() {
  const model::Setting& setting = r_.ctx.source.setting;
  for (std::int32_t half = 0; half < 2; ++half) {
    for (std::size_t k = 0; k < setting.kinds.size(); ++k) {
      CPKV_CUDA_CHECK(cudaMemsetAsync(r_.mem.dense_half(half, k), 0x5A, r_.ctx.shape.slot_count_max * r_.page_bytes(k), r_.stream));
    }
  }
}

void PluginGuards::check_layer(std::int32_t layer, std::uint64_t* milestone, std::uint64_t milestone_value) {
  CPKV_CUDA_CHECK(kernels::launch_guard_check(regions_dev_, static_cast<std::int32_t>(regions_.size()), results_ + layer, milestone, milestone_value, r_.stream));
}

std::string PluginGuards::read_layers(std::int64_t batch) {
  std::vector<kernels::GuardResult> found(static_cast<std::size_t>(std::max(layers_, 1)));
  CPKV_CUDA_CHECK(cudaMemcpy(found.data(), results_, found.size() * sizeof(kernels::GuardResult), cudaMemcpyDeviceToHost));
  for (std::int32_t l = 0; l < layers_; ++l) {
    if (found[l].wrong_bytes == 0) continue;
    const std::uint64_t region = found[l].first_wrong >> 40, offset = (found[l].first_wrong >> 8) & 0xffffffffULL;
    const auto got = static_cast<std::uint8_t>(found[l].first_wrong & 0xff);
    CPKV_CUDA_CHECK(kernels::launch_guard_poison(regions_dev_, static_cast<std::int32_t>(regions_.size()), r_.stream));
    CPKV_CUDA_CHECK(cudaStreamSynchronize(r_.stream));
    return fmt::format("rank {} batch {} layer {}: wrote outside its buffers: {} byte(s) of the guard past rank {}'s {} changed, the first at byte {} past its "
                       "end ({:#04x}, the poison {:#04x}) (every buffer the host hands a plugin is followed by {} poisoned bytes, checked after every "
                       "layer; any rank may have written it through its mapping)",
                       r_.ctx.rank, batch, l, found[l].wrong_bytes, r_.ctx.rank, region_names_[region], offset, got, kernels::guard_byte(offset),
                       r_.mem.layout.guard_bytes);
  }
  return {};
}

std::string PluginGuards::check_pool(std::int64_t batch) {
  if (pages_.empty()) return {};
  const kernels::HashCompare init{0, ~0ULL};
  CPKV_CUDA_CHECK(cudaMemcpyAsync(compare_, &init, sizeof(init), cudaMemcpyHostToDevice, r_.stream));
  CPKV_CUDA_CHECK(kernels::launch_hash_pages(r_.mem.pool, pages_dev_, static_cast<std::int64_t>(pages_.size()), reference_, true, compare_, r_.stream));
  kernels::HashCompare found{};
  CPKV_CUDA_CHECK(cudaMemcpyAsync(&found, compare_, sizeof(found), cudaMemcpyDeviceToHost, r_.stream));
  r_.sync_stream();
  if (found.changed == 0) return {};
  const model::Setting& setting = r_.ctx.source.setting;
  const std::size_t p = found.first_changed, kinds = setting.kinds.size();
  const std::size_t layer = page_slab_[p] / kinds, kind = page_slab_[p] % kinds;
  return fmt::format("rank {} batch {}: wrote outside its buffers: rank {}'s pool slab of {} changed on layer {} (local page {}, logical page {}; {} "
                     "page(s) changed) (the pool is read-only to the exchange: PROTOCOL.md section 1; any rank may have written it through its mapping)",
                     r_.ctx.rank, batch, r_.ctx.rank, setting.kinds[kind].name, layer, page_local_[p], page_local_[p] * r_.cp() + r_.ctx.rank,
                     found.changed);
}

std::uint64_t model_peer_gather_bytes(const model::Setting& setting, const model::BatchLayout& layout, model::Variant variant, std::int32_t rank,
                                      std::int32_t layers) {
  const model::VariantPlan plan = model::variant_plan(layout, variant, rank);
  const std::int32_t cp = setting.cp;
  std::uint64_t sum = 0;
  for (std::int32_t l = 0; l < layers; ++l) {
    const model::LayerBytes bytes = model::layer_bytes(setting, plan, l);
    const std::uint64_t ring = cp > 1 ? 2 * static_cast<std::uint64_t>(cp - 1) * bytes.allreduce_bytes / cp : 0;  // as layer_bytes adds it
    sum += bytes.pulled_from_peers() - ring;
  }
  return sum;
}

}  // namespace cpkv::cuda

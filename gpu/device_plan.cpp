#include "device_plan.hpp"

#include <array>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

#include "cpkv/model/expected.hpp"
#include "cpkv/model/oracle.hpp"
#include "cpkv/model/staging.hpp"

namespace cpkv::cuda {

namespace {

using Entries = std::vector<kernels::GatherEntry>;

void append_gathers(const std::vector<model::SlotDescriptor>& descriptors, Entries& out) {
  for (std::size_t s = 0; s < descriptors.size(); ++s) {
    if (descriptors[s].table_index != model::SlotDescriptor::kSkip) {
      out.push_back({static_cast<std::int64_t>(s), descriptors[s].source_page, descriptors[s].table_index, 0});
    }
  }
}

// The copies, zeros and gathers of the plan as gather entries over the pointer table.
void plan_entries(BatchPlan& b, std::int32_t cp, std::int32_t rank) {
  const model::VariantPlan& p = b.plan;
  const auto slot_of = [&](std::int64_t i) { return b.layout.current[i].slot; };
  for (std::int64_t slot : p.local_prefix_slots) b.local_prefix.push_back({slot, b.layout.slots[slot].page_or_index / cp, rank, 0});
  if (p.zero_own_current) {
    for (std::int64_t i : p.own_current) b.zero_own.push_back({p.fill_to_staging ? i : slot_of(i), 0, -1, 0});
  }
  for (std::int64_t i = 0; i < p.compact_pages; ++i) {
    const bool own = b.layout.current[i].writer == rank;
    b.pack.push_back({i, slot_of(i), own ? kernels::kTableOwnDense : -1, 0});
    b.unpack.push_back({slot_of(i), i, kernels::kTableOwnCompact, 0});
  }
  append_gathers(p.gather1, b.gather1);
  append_gathers(p.gather2, b.gather2);
  if (p.publish) {
    for (std::int64_t i : p.own_current) b.publish.push_back({i, slot_of(i), kernels::kTableOwnDense, 0});
  }
}

// The fused compose list, each entry with its destination: first what reads this layer's fill (the
// pack, the publish: before the signal, and before gather 1 zeroes current slots), then the rest.
// Warp w of the launch copies pre entry w, then post entry pre_count + w (and so on, a grid's warps
// apart). With pre entries, the post entries that wait on a peer's flag (gather 2: the peers'
// published pages) come first, so they fall to the warps busy publishing, whose wait is then short,
// and the prefix pulls, which wait on nothing, start at once on the other warps. (Prefix first left
// the link idle while the publish ran: measured on 2xH200, seeds batch, staging_publish 156 us
// against staging_direct's 118.)
void compose_entries(BatchPlan& b) {
  using Lists = std::array<std::pair<const Entries*, kernels::ComposeDest>, 5>;
  const Lists prefix_first = {{{&b.pack, kernels::kToCompact}, {&b.publish, kernels::kToStaging}, {&b.local_prefix, kernels::kToDense},
                               {&b.gather1, kernels::kToDense}, {&b.gather2, kernels::kToDense}}};
  const Lists awaited_first = {{{&b.pack, kernels::kToCompact}, {&b.publish, kernels::kToStaging}, {&b.gather2, kernels::kToDense},
                                {&b.gather1, kernels::kToDense}, {&b.local_prefix, kernels::kToDense}}};
  const bool pre = !b.pack.empty() || !b.publish.empty();
  for (const auto& [list, dest] : pre ? awaited_first : prefix_first) {
    for (kernels::GatherEntry e : *list) {
      e.dest = dest;
      b.compose.push_back(e);
    }
    if (list == &b.publish) b.compose_pre = static_cast<std::int64_t>(b.compose.size());
  }
}

// The producer's pages: the pages the plan zeroes (zero_own) first, then any other page the fill
// writes; per row, the token of the inverse that lands there.
void produce_rows(BatchPlan& b, std::int32_t page_size) {
  std::unordered_map<std::int64_t, std::size_t> index;
  const auto page_index = [&](std::int64_t page, std::int32_t empty_row) {
    const auto [it, added] = index.emplace(page, b.produce_pages.size());
    if (added) {
      b.produce_pages.push_back(page);
      b.row_token.insert(b.row_token.end(), page_size, empty_row);
    }
    return it->second;
  };
  for (const kernels::GatherEntry& e : b.zero_own) page_index(e.dst_page, kernels::kRowZero);
  for (std::size_t t = 0; t < b.inv_dest.size(); ++t) {
    const std::size_t i = page_index(b.inv_dest[t] / page_size, kernels::kRowUntouched);
    std::int32_t& row = b.row_token[i * page_size + b.inv_dest[t] % page_size];
    CPKV_ASSERT(row < 0);  // one token per row
    row = static_cast<std::int32_t>(t);
  }
}

}  // namespace

std::uint64_t peer_pages_per_kind(const BatchPlan& b, std::int32_t cp, std::int32_t rank) {
  std::uint64_t pages = 0;
  for (const std::vector<kernels::GatherEntry>* list : {&b.gather1, &b.gather2}) {
    for (const kernels::GatherEntry& e : *list) pages += e.table_index >= 0 && e.table_index % cp != rank ? 1 : 0;
  }
  return pages;
}

std::uint64_t peer_rows_all_gathered(const BatchPlan& b, std::int32_t cp) {
  if (b.plan.token_split == model::TokenSplit::none) return 0;
  return static_cast<std::uint64_t>(cp - 1) * static_cast<std::uint64_t>(b.plan.allgather_rank_rows);
}

BatchPlan build_batch_plan(const model::Setting& setting, const model::Batch& batch, model::Variant variant, std::int32_t rank,
                           std::int64_t staging_slots, std::vector<bool>& populated) {
  BatchPlan b;
  b.layout = model::layout_batch(setting, batch);
  // Section 12's token-split all-gathers have no staging: overflow does not apply to them.
  b.overflow = !model::splits_tokens(variant) && model::overflow_verdict(b.layout.current_pages_total, staging_slots).overflow;
  // A rejected batch moves nothing, so it must not claim pool pages as populated either (a later
  // batch reading them would find them never written: found by the GPU property test).
  if (b.overflow) return b;
  b.plan = model::variant_plan(b.layout, variant, rank);
  const std::int32_t cp = setting.cp;
  plan_entries(b, cp, rank);
  const model::PageInverse inverse =
      model::page_inverse(b.layout, batch, rank, b.plan.fill_to_staging ? model::InverseTarget::staging : model::InverseTarget::dense);
  for (std::size_t t = 0; t < inverse.tokens.size(); ++t) {
    b.inv_request.push_back(inverse.tokens[t].request);
    b.inv_token.push_back(inverse.tokens[t].token);
    b.inv_dest.push_back(inverse.dest_row[t]);
  }
  compose_entries(b);
  produce_rows(b, setting.page_size);
  for (const model::Slot& slot : b.layout.slots) {
    if (slot.kind != model::SlotKind::prefix || slot.page_or_index % cp != rank || populated[slot.page_or_index / cp]) continue;
    populated[slot.page_or_index / cp] = true;
    b.populate_logical.push_back(slot.page_or_index);
    b.populate_local.push_back(slot.page_or_index / cp);
  }
  // What the verify kernel expects comes from the plain oracle (model/oracle.hpp), which walks the
  // requests itself, not from the layout the gathers were planned on.
  const model::spec::ByteOracle oracle(setting.page_size, batch);
  for (std::int64_t s = 0; s < oracle.slot_count(); ++s) {
    const model::spec::DenseSlot& slot = oracle.slot(s);
    b.slots.push_back({slot.prefix ? slot.logical_page : -1, slot.first_token, slot.request, slot.rows_valid});
  }
  return b;
}

SendRows token_send_rows(const model::BatchLayout& layout, const model::Batch& batch, const model::VariantPlan& plan, std::int32_t rank) {
  CPKV_ASSERT(plan.token_split != model::TokenSplit::none);
  const std::int64_t page_size = layout.page_size;
  SendRows out;
  out.rows_per_rank = plan.allgather_rank_rows;
  out.request.assign(static_cast<std::size_t>(out.rows_per_rank), -1);
  out.token.assign(static_cast<std::size_t>(out.rows_per_rank), -1);
  CPKV_ASSERT(static_cast<std::int64_t>(plan.reorder_source.size()) == layout.current_pages_total * page_size);
  for (std::int64_t i = 0; i < layout.current_pages_total; ++i) {
    const model::CurrentPage& page = layout.current[i];
    for (std::int64_t row = 0; row < page_size; ++row) {
      const std::int64_t source = plan.reorder_source[i * page_size + row];
      if (source < 0 || source / out.rows_per_rank != rank) continue;
      const auto at = static_cast<std::size_t>(source - rank * out.rows_per_rank);
      CPKV_ASSERT(out.request[at] < 0);  // one token per send row
      out.request[at] = page.request;
      out.token[at] = batch.requests[page.request].prefix_len + page.page_in_request * page_size + row;
    }
  }
  return out;
}

void check_entries(const Entries& entries, const TableBounds& bounds) {
  for (const kernels::GatherEntry& e : entries) {
    CPKV_ASSERT(e.dest >= 0 && e.dest < kernels::kComposeDests);
    if (e.table_index < 0) continue;  // zeros
    const bool own = e.table_index == kernels::kTableOwnDense || e.table_index == kernels::kTableOwnCompact;
    CPKV_ASSERT(own || e.table_index < 2 * bounds.cp);
    CPKV_ASSERT(e.src_page >= 0 && e.dst_page >= 0);
    if (e.table_index < bounds.cp) CPKV_ASSERT(e.src_page < bounds.pool_pages);
    if (e.table_index < bounds.cp && bounds.pool_referenced != nullptr) CPKV_ASSERT((*bounds.pool_referenced)[e.table_index][e.src_page]);
    if (e.table_index >= bounds.cp && !own) CPKV_ASSERT(e.src_page < bounds.shared_pages);
  }
}

DeviceUploads::~DeviceUploads() {
  for (void* p : owned_) CPKV_CUDA_CHECK(cudaFree(p));
}

kernels::ComposeBarrier compose_barrier(const BatchPlan& b, const GpuMutantPolicy& mutant) {
  if (!b.plan.barrier || mutant.skips_barrier()) return kernels::kNoBarrier;
  return b.plan.publish ? kernels::kSignalAfterPre : kernels::kSignalAtStart;
}

DevicePlan upload_plan(const BatchPlan& b, const TableBounds& bounds, DeviceUploads& uploads) {
  for (const Entries* list : {&b.compose, &b.unpack}) check_entries(*list, bounds);
  DevicePlan d{};
  d.compose = uploads.upload(b.compose);
  d.unpack = uploads.upload(b.unpack);
  d.produce_pages = uploads.upload(b.produce_pages);
  d.row_token = uploads.upload(b.row_token);
  d.inv_request = uploads.upload(b.inv_request);
  d.inv_token = uploads.upload(b.inv_token);
  d.slots = uploads.upload(b.slots);
  d.populate_logical = uploads.upload(b.populate_logical);
  d.populate_local = uploads.upload(b.populate_local);
  return d;
}

}  // namespace cpkv::cuda

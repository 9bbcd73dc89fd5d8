// The host side of the exchange plugin ABI (include/cpkv/exchange_abi.h) in one GPU rank: the
// context a plugin sees (the setting as C arrays, the pool and dense buffers, a flag pad of its own,
// the batch and this rank's page inverse, this layer's current rows), its services (symmetric
// allocations over CUDA IPC, a sum all-reduce), and the batch loop around its calls: population,
// the rows, the rotating slow rank, the byte check after every layer, the overflow verdicts
// compared over the group (invariant 3), and the planted bugs that live in the harness.
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "plugin_host.hpp"
#include "plugin_guards.hpp"
#include "timeline.hpp"
#include "cpkv/harness/plugin_json.hpp"
#include "cpkv/model/attention.hpp"
#include "cpkv/model/expected.hpp"
#include "cpkv/model/plan.hpp"

namespace cpkv::cuda {

static_assert(CPKV_CP_MAX == kRanksMax, "the ABI's rank arrays hold one node's ranks");
static_assert(CPKV_KINDS_MAX == kernels::kKindsMax, "the ABI's kind count is the kernels'");
static_assert(CPKV_SYMMETRIC_MAX == kernels::kGuardSymmetricMax, "a guard region past every symmetric allocation");

namespace {

// The rank's side of each batch, the host's own (they were the executor's, which the host called
// back into): the pool content of the pages this rank owns, every layer and kind (no
// synchronization); the verify kernel of one kind of a layer over dense half `half`; the rotating
// slow rank of CudaOptions::slow_rank_cycles before layer l's exchange; a violation; what the
// device found in the batch (the barrier status, wrong bytes), recorded; quiescence at the end.
void verify_kind(Rank& r, const BatchPlan& b, const DevicePlan& d, kernels::VerifyResult* verify, std::int32_t l, std::size_t k, std::int32_t half) {
  const model::Setting& setting = r.ctx.source.setting;
  const std::size_t kinds = setting.kinds.size();
  const TimelineSpan span(r, "verify", l);
  CPKV_CUDA_CHECK(kernels::launch_verify(r.mem.dense_half(half, k), setting.kinds[k].row_bytes, setting.page_size, d.slots,
                                         static_cast<std::int64_t>(b.slots.size()), r.ctx.options.seed, static_cast<std::uint32_t>(l),
                                         static_cast<std::uint32_t>(k), verify + l * kinds + k, r.stream));
}

void slow_rank_delay(Rank& r, std::int32_t l) {
  if (r.ctx.cuda.slow_rank_cycles <= 0 || (r.batch_index + l) % r.cp() != r.ctx.rank) return;
  CPKV_CUDA_CHECK(kernels::launch_spin(r.ctx.cuda.slow_rank_cycles, r.stream));
}

// Pool content for the pages this rank owns (written once: it never changes).
void populate_pools(Rank& r, const BatchPlan& b, const DevicePlan& d) {
  const model::Setting& setting = r.ctx.source.setting;
  for (std::int32_t l = 0; l < r.ctx.options.layers; ++l) {
    for (std::size_t k = 0; k < setting.kinds.size(); ++k) {
      CPKV_CUDA_CHECK(kernels::launch_populate_pool(r.mem.pool + r.mem.layout.pool_offset[l][k], setting.kinds[k].row_bytes, setting.page_size, d.populate_logical,
                                                    d.populate_local, static_cast<std::int64_t>(b.populate_logical.size()), r.ctx.options.seed,
                                                    static_cast<std::uint32_t>(l), static_cast<std::uint32_t>(k), r.stream));
    }
  }
}

harness::Violation violation(std::int32_t invariant, std::int32_t rank, std::int64_t batch, std::int32_t layer, const std::string& detail) {
  harness::Violation v;
  v.invariant = invariant;
  v.rank = rank;
  v.batch = batch;
  v.layer = layer;
  v.set_detail(detail);
  return v;
}

// What the device found in the batch: a barrier timeout (invariant 8), wrong bytes (invariant 6).
void collect_findings(Rank& r, std::int64_t batch_index, kernels::VerifyResult* verify) {
  const model::Setting& setting = r.ctx.source.setting;
  const std::size_t kinds = setting.kinds.size();
  const std::int32_t rank = r.ctx.rank;
  harness::Totals& totals = r.ctx.boot->totals[rank];
  kernels::BarrierStatus status{};
  CPKV_CUDA_CHECK(cudaMemcpy(&status, r.mem.barrier_status, sizeof(status), cudaMemcpyDeviceToHost));
  if (status.timed_out_phase != 0) {
    record(r.ctx.boot, violation(8, rank, batch_index, -1, fmt::format("barrier phase {} timed out on rank {} waiting for rank {}",
                                                                       status.timed_out_phase, status.rank, status.missing_peer)));
  }
  std::vector<kernels::VerifyResult> results(static_cast<std::size_t>(r.ctx.options.layers) * kinds);
  CPKV_CUDA_CHECK(cudaMemcpy(results.data(), verify, results.size() * sizeof(kernels::VerifyResult), cudaMemcpyDeviceToHost));
  for (std::int32_t l = 0; l < r.ctx.options.layers && r.ctx.cuda.verify; ++l) {
    for (std::size_t k = 0; k < kinds; ++k) {
      const kernels::VerifyResult& found = results[l * kinds + k];
      if (found.wrong_bytes == 0) continue;
      const std::uint64_t first = found.first_wrong >> 16;  // (byte index << 16) | (expected << 8) | actual
      const std::uint64_t row_global = first / setting.kinds[k].row_bytes;
      model::Mismatch mismatch;
      mismatch.wrong_bytes = static_cast<std::int64_t>(found.wrong_bytes);
      mismatch.slot = static_cast<std::int64_t>(row_global / setting.page_size);
      mismatch.row = static_cast<std::int32_t>(row_global % setting.page_size);
      mismatch.byte = static_cast<std::uint32_t>(first % setting.kinds[k].row_bytes);
      mismatch.expected = static_cast<std::uint8_t>((found.first_wrong >> 8) & 0xff);
      mismatch.actual = static_cast<std::uint8_t>(found.first_wrong & 0xff);
      const std::string text = mismatch.describe(rank, batch_index, l, setting.kinds[k].name);
      totals.add_mismatches(1, text);
      record(r.ctx.boot, violation(6, rank, batch_index, l, text));
    }
  }
}

// Quiescence: every word of this rank's pad equals the number of barriers (drained).
void check_drained(Rank& r) {
  std::vector<std::uint64_t> pad(r.cp());
  CPKV_CUDA_CHECK(cudaMemcpy(pad.data(), r.mem.pad, r.cp() * sizeof(std::uint64_t), cudaMemcpyDeviceToHost));
  for (std::int32_t p = 0; p < r.cp(); ++p) {
    if (pad[p] == r.barrier_phase) continue;
    record(r.ctx.boot, violation(4, r.ctx.rank, -1, -1, fmt::format("flags not drained: rank {}'s pad word for rank {} is {}, expected {}",
                                                                    r.ctx.rank, p, pad[p], r.barrier_phase)));
    return;
  }
}


struct SymmetricBlock {
  std::uint8_t* local = nullptr;
  std::vector<std::uint8_t*> peers;
  std::uint64_t bytes = 0;
};

// This batch's ABI view and what backs it: host arrays, and device copies (freed with `uploads`).
struct PluginBatch {
  cpkv_batch c{};
  std::vector<std::int64_t> prefix_len, extend_len, page_begin, page_table;
  std::string json;
  std::vector<std::int32_t> plan_table_index, writer, produce_row_token, inv_request, row_request;
  std::vector<std::int64_t> plan_source_page, current_slot, own_current_index, row_token, inv_token, pages;
};

// The planted bugs that live here keep the first batch's plan and page inverse.
struct FirstBatch {
  bool kept = false;
  std::vector<std::int32_t> plan_table_index;
  std::vector<std::int64_t> plan_source_page, own_current_index;
};

struct PluginHost {
  PluginHost(Rank& rank, const harness::ExchangePlugin& loaded) : r(rank), plugin(loaded) {}
  Rank& r;
  const harness::ExchangePlugin& plugin;
  cpkv_exchange_ctx ctx{};
  std::vector<cpkv_kind> kinds;
  std::vector<std::vector<std::uint8_t>> active;
  std::vector<std::string> kind_names;
  std::string setting_json, variant, path_variant, mutant;
  std::vector<void*> pool, dense, dense_peer;
  std::vector<const void*> rows;
  std::vector<std::uint64_t> pool_offset, dense_offset;
  std::vector<std::uint64_t*> pads;
  std::uint64_t** pad_table = nullptr;
  std::vector<SymmetricBlock> symmetric;
  std::vector<void*> rows_buffer;  // [kind]: current_pages_max pages (all null for a produce_rows plugin)
  bool in_setup = false;
  FirstBatch first;
  // The batch in flight, for produce_rows: the producer's device arrays (rows in own-page order).
  const PluginBatch* batch = nullptr;
  const std::int64_t* const* produce_dev = nullptr;
  std::int32_t layer = -1;    // the layer compose_layer is running (-1: outside compose_layer)
  bool counting = false;      // the functional layers: the all-reduces are counted (not the bench's timed ones)
  std::optional<PluginGuards> guards;  // writes outside its buffers (plugin_guards.hpp)
  DeviceMilestones milestones;         // where the stream got to, for a device fault's name
  std::vector<std::string> findings;   // this batch's: guards, pool, counters (the first ends the run)

  std::string where(const char* call, std::int64_t batch, std::int32_t layer) const {
    std::string at = fmt::format("exchange plugin '{}' {} on rank {}", plugin.name, call, r.ctx.rank);
    if (batch >= 0) at += fmt::format(" batch {}", batch);
    if (layer >= 0) at += fmt::format(" layer {}", layer);
    return at;
  }
};

PluginHost* host_of(cpkv_exchange_ctx* c) { return static_cast<PluginHost*>(c->harness); }

cpkv_status fail(cpkv_exchange_ctx* c, const std::string& text) {
  std::snprintf(c->error, sizeof(c->error), "%s", text.c_str());
  return CPKV_ERROR;
}

// A symmetric allocation: cudaMalloc, `fill` in every byte, the IPC handle through the bootstrap
// segment, a host barrier, every peer's opened. Collective: every rank makes the same calls.
SymmetricBlock allocate_symmetric(PluginHost& h, std::uint64_t bytes, int fill, const std::string& name) {
  Rank& r = h.r;
  const std::size_t n = h.symmetric.size();
  CPKV_ASSERT(n < CPKV_SYMMETRIC_MAX);
  SymmetricBlock block;
  block.bytes = bytes;
  // The guard's bytes past the allocation (poisoned by add_region), and at least 256 in all.
  const std::uint64_t guard = r.mem.layout.guard_bytes;
  CPKV_CUDA_CHECK(cudaMalloc(&block.local, std::max<std::uint64_t>(bytes + guard, 256)));
  if (bytes > 0) CPKV_CUDA_CHECK(cudaMemset(block.local, fill, bytes));
  h.guards->add_region(block.local + bytes, name);
  CPKV_CUDA_CHECK(cudaIpcGetMemHandle(&r.ctx.boot->symmetric[r.ctx.rank][n], block.local));
  CPKV_CUDA_CHECK(cudaDeviceSynchronize());
  r.barrier();
  block.peers.assign(r.cp(), nullptr);
  for (std::int32_t p = 0; p < r.cp(); ++p) {
    if (p == r.ctx.rank) {
      block.peers[p] = block.local;
      continue;
    }
    void* ptr = nullptr;
    CPKV_CUDA_CHECK(cudaIpcOpenMemHandle(&ptr, r.ctx.boot->symmetric[p][n], cudaIpcMemLazyEnablePeerAccess));
    block.peers[p] = static_cast<std::uint8_t*>(ptr);
  }
  h.symmetric.push_back(block);
  return block;
}

cpkv_status alloc_symmetric_body(cpkv_exchange_ctx* c, std::uint64_t bytes, cpkv_symmetric* out) {
  PluginHost& h = *host_of(c);
  if (!h.in_setup) return fail(c, "alloc_symmetric is collective and may be called from setup only");
  if (out == nullptr) return fail(c, "alloc_symmetric: out is NULL");
  if (h.symmetric.size() >= CPKV_SYMMETRIC_MAX) return fail(c, fmt::format("alloc_symmetric: more than {} allocations", CPKV_SYMMETRIC_MAX - 1));
  std::size_t free_bytes = 0, total_bytes = 0;
  CPKV_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (bytes > free_bytes) return fail(c, fmt::format("alloc_symmetric: {} bytes asked, {} free on device {}", bytes, free_bytes, c->device));
  const SymmetricBlock block = allocate_symmetric(h, bytes, 0xA5, fmt::format("symmetric allocation {} of {} bytes", h.symmetric.size() - 1, bytes));
  *out = cpkv_symmetric{};
  out->local = block.local;
  for (std::int32_t p = 0; p < h.r.cp(); ++p) out->peers[p] = block.peers[p];
  out->bytes = bytes;
  return CPKV_OK;
}

// The peers' bases of the allocation `buffer .. buffer + bytes` lies in, and its offset there.
std::optional<std::pair<std::vector<std::uint8_t*>, std::uint64_t>> symmetric_range(const PluginHost& h, const std::uint8_t* buffer, std::uint64_t bytes) {
  const RankMemory& mem = h.r.mem;
  if (buffer >= mem.dense && buffer + bytes <= mem.dense + mem.layout.dense_bytes) return std::make_pair(mem.peer_dense, static_cast<std::uint64_t>(buffer - mem.dense));
  for (const SymmetricBlock& b : h.symmetric) {
    if (buffer >= b.local && buffer + bytes <= b.local + b.bytes) return std::make_pair(b.peers, static_cast<std::uint64_t>(buffer - b.local));
  }
  return std::nullopt;
}

cpkv_status all_reduce_sum_body(cpkv_exchange_ctx* c, void* buffer, std::uint64_t bytes, void* stream) {
  PluginHost& h = *host_of(c);
  if (stream != static_cast<void*>(h.r.stream)) return fail(c, "all_reduce_sum: enqueue on the stream compose_layer was given");
  auto* own = static_cast<std::uint8_t*>(buffer);
  const auto range = symmetric_range(h, own, bytes);
  if (!range) return fail(c, fmt::format("all_reduce_sum: {} bytes at {} are not inside the dense buffers or a symmetric allocation", bytes, buffer));
  if (!h.r.use_nccl && bytes > h.r.mem.layout.scratch_bytes) {
    return fail(c, fmt::format("all_reduce_sum: {} bytes exceed the {} an IPC all-reduce holds", bytes, h.r.mem.layout.scratch_bytes));
  }
  h.r.all_reduce(own, range->first, range->second, bytes);
  if (h.counting) {
    harness::Totals& totals = h.r.ctx.boot->totals[h.r.ctx.rank];
    ++totals.collectives;
    totals.bytes_reduced += bytes;
  }
  return CPKV_OK;
}

// The all-gather service (revision 5): both ranges inside memory cpkv knows (the peers read the
// send bytes through their mappings of it), apart, and counted as one collective of the
// functional layers.
cpkv_status all_gather_body(cpkv_exchange_ctx* c, const void* send, void* recv, std::uint64_t bytes, void* stream) {
  PluginHost& h = *host_of(c);
  if (stream != static_cast<void*>(h.r.stream)) return fail(c, "all_gather: enqueue on the stream compose_layer was given");
  const auto* own = static_cast<const std::uint8_t*>(send);
  auto* into = static_cast<std::uint8_t*>(recv);
  const std::uint64_t recv_bytes = bytes * static_cast<std::uint64_t>(h.r.cp());
  const auto range = symmetric_range(h, own, bytes);
  if (!range) return fail(c, fmt::format("all_gather: the {} send bytes at {} are not inside the dense buffers or a symmetric allocation", bytes, send));
  if (!symmetric_range(h, into, recv_bytes)) {
    return fail(c, fmt::format("all_gather: the {} receive bytes (cp {} x {}) at {} are not inside the dense buffers or a symmetric allocation", recv_bytes, h.r.cp(),
                               bytes, recv));
  }
  if (own < into + recv_bytes && into < own + bytes) return fail(c, fmt::format("all_gather: the send bytes at {} overlap the receive bytes at {}", send, recv));
  h.r.all_gather(own, range->first, range->second, into, bytes);
  if (h.counting) ++h.r.ctx.boot->totals[h.r.ctx.rank].collectives;
  return CPKV_OK;
}

// The services run cpkv's code under the plugin's frames (C, maybe without unwind tables): an
// exception there (a CUDA failure, located by the fault hook, bootstrap.hpp) becomes the service's
// error and its text, which the plugin passes on or the host's check after the call names.
template <typename Body>
cpkv_status served(cpkv_exchange_ctx* c, Body&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    return fail(c, e.what());
  }
}
cpkv_status produce_rows_body(cpkv_exchange_ctx* c, void* const* dest, const std::int64_t* dest_page, std::int32_t zero_tails, void* stream);
cpkv_status alloc_symmetric(cpkv_exchange_ctx* c, std::uint64_t bytes, cpkv_symmetric* out) {
  return served(c, [&] { return alloc_symmetric_body(c, bytes, out); });
}
cpkv_status all_reduce_sum(cpkv_exchange_ctx* c, void* buffer, std::uint64_t bytes, void* stream) {
  return served(c, [&] { return all_reduce_sum_body(c, buffer, bytes, stream); });
}
cpkv_status produce_rows(cpkv_exchange_ctx* c, void* const* dest, const std::int64_t* dest_page, std::int32_t zero_tails, void* stream) {
  return served(c, [&] { return produce_rows_body(c, dest, dest_page, zero_tails, stream); });
}
cpkv_status all_gather(cpkv_exchange_ctx* c, const void* send, void* recv, std::uint64_t bytes, void* stream) {
  return served(c, [&] { return all_gather_body(c, send, recv, bytes, stream); });
}

void describe_setting(PluginHost& h) {
  const model::Setting& setting = h.r.ctx.source.setting;
  const std::int32_t layers = h.r.ctx.options.layers;
  const RankMemory& mem = h.r.mem;
  const std::size_t nk = setting.kinds.size();
  h.active.assign(nk, std::vector<std::uint8_t>(layers));
  for (std::size_t k = 0; k < nk; ++k) h.kind_names.emplace_back(setting.kinds[k].name);
  for (std::size_t k = 0; k < nk; ++k) {
    for (std::int32_t l = 0; l < layers; ++l) h.active[k][l] = setting.kind_active(k, l) ? 1 : 0;
    h.kinds.push_back(cpkv_kind{h.kind_names[k].c_str(), setting.kinds[k].row_bytes, 0, h.active[k].data()});
  }
  h.setting_json = harness::plugin_setting_json(setting);
  for (std::int32_t p = 0; p < h.r.cp(); ++p) {
    h.pool.push_back(mem.peer_pool[p]);
    h.dense_peer.push_back(mem.peer_dense[p]);
  }
  for (std::int32_t l = 0; l < layers; ++l) {
    for (std::size_t k = 0; k < nk; ++k) h.pool_offset.push_back(mem.layout.pool_offset[l][k]);
  }
  for (std::int32_t half = 0; half < 2; ++half) {
    for (std::size_t k = 0; k < nk; ++k) {
      h.dense.push_back(mem.dense_half(half, k));
      h.dense_offset.push_back(mem.layout.dense_offset[half][k]);
    }
  }
}

void build_context(PluginHost& h) {
  Rank& r = h.r;
  const model::Setting& setting = r.ctx.source.setting;
  describe_setting(h);
  h.variant = std::string(model::to_string(r.ctx.options.variant));
  h.path_variant = std::string(model::to_string(r.variant));
  h.mutant = h.plugin.holds(std::string(harness::to_string(r.ctx.options.mutant))) ? std::string(harness::to_string(r.ctx.options.mutant)) : "none";
  cpkv_exchange_ctx& c = h.ctx;
  c.abi_version = CPKV_EXCHANGE_ABI_VERSION;
  c.ctx_bytes = sizeof(cpkv_exchange_ctx);
  c.rank = r.ctx.rank;
  c.cp = r.cp();
  c.device = r.ctx.rank % r.ctx.gpus;
  c.layers = r.ctx.options.layers;
  c.seed = r.ctx.options.seed;
  c.variant = h.variant.c_str();
  c.path_variant = h.path_variant.c_str();
  c.ipc_capable = 1;
  for (std::int32_t p = 0; p < r.cp(); ++p) c.ipc_capable = std::min(c.ipc_capable, r.ctx.boot->probe[p].load());
  c.page_size = setting.page_size;
  c.kind_count = static_cast<std::int32_t>(setting.kinds.size());
  c.kinds = h.kinds.data();
  c.setting_json = h.setting_json.c_str();
  c.mutant = h.mutant.c_str();
  c.pool_pages_per_rank = setting.pool_pages_per_rank();
  c.staging_slots = r.staging_slots;
  c.slot_count_max = r.ctx.shape.slot_count_max;
  c.current_pages_max = r.ctx.shape.current_pages_max;
  c.wait_ms_max = r.ctx.cuda.wait_ms_max;
  c.pool = h.pool.data();
  c.pool_offset = h.pool_offset.data();
  c.dense = h.dense.data();
  c.dense_peer = h.dense_peer.data();
  c.dense_offset = h.dense_offset.data();
  c.alloc_symmetric = alloc_symmetric;
  c.all_reduce_sum = all_reduce_sum;
  c.harness = &h;
  c.produce_rows = produce_rows;
  c.all_gather = all_gather;
  c.reader_spin_cycles = r.ctx.cuda.slow_reader_rank == r.ctx.rank ? kernels::kMutantWindowCycles : 0;
}

// A flag pad of the plugin's own (not the one cpkv's IPC all-reduce counts on), and the rows buffers.
void allocate_plugin_memory(PluginHost& h) {
  Rank& r = h.r;
  const SymmetricBlock pad = allocate_symmetric(h, CPKV_CP_MAX * sizeof(std::uint64_t), 0, "flag pad");
  for (std::uint8_t* p : pad.peers) h.pads.push_back(reinterpret_cast<std::uint64_t*>(p));
  CPKV_CUDA_CHECK(cudaMalloc(&h.pad_table, h.pads.size() * sizeof(std::uint64_t*)));
  CPKV_CUDA_CHECK(cudaMemcpy(h.pad_table, h.pads.data(), h.pads.size() * sizeof(std::uint64_t*), cudaMemcpyHostToDevice));
  h.ctx.flag_pad = h.pads[r.ctx.rank];
  h.ctx.flag_pads = h.pads.data();
  h.ctx.flag_pad_table = h.pad_table;
  const std::size_t nk = r.ctx.source.setting.kinds.size();
  h.rows_buffer.assign(nk, nullptr);
  h.rows.assign(nk, nullptr);
  h.ctx.rows = h.rows.data();
  if ((h.plugin.uses & CPKV_USES_ROWS) == 0 && (h.plugin.uses & CPKV_USES_PRODUCE) != 0) return;  // rows only through produce_rows
  for (std::size_t k = 0; k < nk; ++k) {
    const std::uint64_t bytes = r.ctx.shape.current_pages_max * r.page_bytes(k);
    CPKV_CUDA_CHECK(cudaMalloc(&h.rows_buffer[k], bytes + r.mem.layout.guard_bytes));
    h.guards->add_region(static_cast<std::uint8_t*>(h.rows_buffer[k]) + bytes, fmt::format("rows buffer of {}", h.kind_names[k]));
  }
}

// Section 12's send rows (exchange_abi.h, cpkv_batch): this rank's tokens in its query order, padded
// to whole pages past the largest rank's count; own_current_index -1 (no current page).
void describe_send_rows(PluginHost& h, const model::Batch& batch, const model::BatchLayout& layout, PluginBatch& pb) {
  const std::int32_t rank = h.r.ctx.rank, P = layout.page_size;
  const SendRows send = token_send_rows(layout, batch, model::variant_plan(layout, h.r.variant, rank), rank);
  const std::int64_t pages = (send.rows_per_rank + P - 1) / P;
  pb.own_current_index.assign(pages, -1);
  pb.produce_row_token.assign(pages * P, kernels::kRowZero);
  pb.row_request.assign(pages * P, -1);
  pb.row_token.assign(pages * P, -1);
  for (std::size_t q = 0; q < send.request.size(); ++q) {
    if (send.request[q] < 0) continue;  // padding: zero
    pb.produce_row_token[q] = static_cast<std::int32_t>(pb.inv_request.size());
    pb.row_request[q] = send.request[q];
    pb.row_token[q] = send.token[q];
    pb.inv_request.push_back(send.request[q]);
    pb.inv_token.push_back(send.token[q]);
  }
  pb.pages.resize(pages);
  std::iota(pb.pages.begin(), pb.pages.end(), 0);
}

void describe_own_pages(PluginHost& h, const model::Batch& batch, const model::BatchLayout& layout, PluginBatch& pb);

// The ABI's view of the batch: PROTOCOL.md sections 2, 3 and 5, from the layout alone.
void describe_layout(PluginHost& h, const model::Batch& batch, const model::BatchLayout& layout, PluginBatch& pb) {
  const std::int32_t cp = h.r.cp();
  for (const model::Slot& slot : layout.slots) {
    const bool prefix = slot.kind == model::SlotKind::prefix;
    const std::int64_t page = slot.page_or_index;
    pb.plan_table_index.push_back(prefix ? static_cast<std::int32_t>(page % cp) : cp + layout.current[page].writer);
    pb.plan_source_page.push_back(prefix ? page / cp : page);
  }
  for (const model::CurrentPage& page : layout.current) {
    pb.writer.push_back(page.writer);
    pb.current_slot.push_back(page.slot);
  }
  if (model::splits_tokens(h.r.variant)) {
    describe_send_rows(h, batch, layout, pb);
  } else {
    describe_own_pages(h, batch, layout, pb);
  }
}

// The page split's own pages: the producer's rows of the current pages this rank writes.
void describe_own_pages(PluginHost& h, const model::Batch& batch, const model::BatchLayout& layout, PluginBatch& pb) {
  const std::int32_t rank = h.r.ctx.rank, P = layout.page_size;
  std::vector<std::int64_t> own_index_of(layout.current.size(), -1);
  for (std::size_t i = 0; i < layout.current.size(); ++i) {
    if (layout.current[i].writer != rank) continue;
    own_index_of[i] = static_cast<std::int64_t>(pb.own_current_index.size());
    pb.own_current_index.push_back(static_cast<std::int64_t>(i));
  }
  const std::size_t own = pb.own_current_index.size();
  pb.produce_row_token.assign(own * P, kernels::kRowZero);
  pb.row_request.assign(own * P, -1);
  pb.row_token.assign(own * P, -1);
  const model::PageInverse inverse = model::page_inverse(layout, batch, rank, model::InverseTarget::staging);
  for (std::size_t t = 0; t < inverse.tokens.size(); ++t) {
    const std::int64_t row = own_index_of[inverse.dest_row[t] / P] * P + inverse.dest_row[t] % P;
    pb.produce_row_token[row] = static_cast<std::int32_t>(t);
    pb.row_request[row] = inverse.tokens[t].request;
    pb.row_token[row] = inverse.tokens[t].token;
    pb.inv_request.push_back(inverse.tokens[t].request);
    pb.inv_token.push_back(inverse.tokens[t].token);
  }
  pb.pages.resize(own);
  std::iota(pb.pages.begin(), pb.pages.end(), 0);
}

// The harness's planted bugs on what it hands over: the first batch's plan or page inverse, kept
// in range of this batch (the corruption is of content, never of bounds).
void plant_harness_bug(PluginHost& h, const model::BatchLayout& layout, PluginBatch& pb) {
  const harness::Mutant m = h.r.ctx.options.mutant;
  FirstBatch& first = h.first;
  if (!first.kept) {
    first = FirstBatch{true, pb.plan_table_index, pb.plan_source_page, pb.own_current_index};
    return;
  }
  const std::int64_t current = layout.current_pages_total;
  const std::int32_t cp = h.r.cp();
  if (m == harness::Mutant::reused_plan && !first.plan_table_index.empty()) {
    for (std::size_t s = 0; s < pb.plan_table_index.size(); ++s) {
      const std::size_t f = s % first.plan_table_index.size();
      const bool staged = first.plan_table_index[f] >= cp;
      pb.plan_table_index[s] = staged && current == 0 ? 0 : first.plan_table_index[f];
      pb.plan_source_page[s] = staged ? (current == 0 ? 0 : first.plan_source_page[f] % current) : first.plan_source_page[f];
    }
  }
  if (m == harness::Mutant::stale_page_inverse && !first.own_current_index.empty() && current > 0) {
    for (std::size_t j = 0; j < pb.own_current_index.size(); ++j) pb.own_current_index[j] = first.own_current_index[j % first.own_current_index.size()] % current;
  }
}

void fill_batch(PluginHost& h, const model::Batch& batch, std::int64_t index, const model::BatchLayout& layout, DeviceUploads& up, PluginBatch& pb) {
  pb.page_begin.push_back(0);
  for (const model::Request& q : batch.requests) {
    pb.prefix_len.push_back(q.prefix_len);
    pb.extend_len.push_back(q.extend_len);
    pb.page_table.insert(pb.page_table.end(), q.prefix_pages.begin(), q.prefix_pages.end());
    pb.page_begin.push_back(static_cast<std::int64_t>(pb.page_table.size()));
  }
  pb.json = harness::plugin_batch_json(batch, index);
  describe_layout(h, batch, layout, pb);
  plant_harness_bug(h, layout, pb);
  cpkv_batch& c = pb.c;
  c.index = index;
  c.requests = static_cast<std::int32_t>(batch.requests.size());
  c.prefix_len = pb.prefix_len.data();
  c.extend_len = pb.extend_len.data();
  c.page_table_begin = pb.page_begin.data();
  c.page_table = pb.page_table.data();
  c.json = pb.json.c_str();
  c.slot_count = layout.slot_count;
  c.current_pages = layout.current_pages_total;
  c.staging_slots = h.r.staging_slots;
  c.overflow = !model::splits_tokens(h.r.variant) && layout.current_pages_total > h.r.staging_slots ? 1 : 0;  // section 12: no staging
  c.plan_table_index = up.upload(pb.plan_table_index);
  c.plan_source_page = up.upload(pb.plan_source_page);
  c.writer = up.upload(pb.writer);
  c.current_slot = up.upload(pb.current_slot);
  c.own_pages = static_cast<std::int64_t>(pb.own_current_index.size());
  c.own_current_index = up.upload(pb.own_current_index);
  c.row_request = up.upload(pb.row_request);
  c.row_token = up.upload(pb.row_token);
}

// The producer kernel (the model's KV write) over this rank's own pages of layer l: own page j's
// rows to dest[k] + pages[j] pages, for every kind on the layer with a destination; rows past a
// request's end zeroed if `zero_tails` and the harness's planted bug does not keep them.
// dev: the batch's pages (iota), row tokens, inverse requests and tokens (run_plugin_batch).
cudaError_t launch_rows(PluginHost& h, const PluginBatch& pb, void* const* dest, const std::int64_t* pages, const std::int64_t* const* dev, bool zero_tails,
                        std::int32_t l, cudaStream_t stream) {
  Rank& r = h.r;
  const model::Setting& setting = r.ctx.source.setting;
  kernels::ProduceArgs a{};
  for (std::size_t k = 0; k < setting.kinds.size(); ++k) {
    if (setting.kind_active(k, l) && dest[k] != nullptr) a.kind[a.kinds++] = {static_cast<std::uint8_t*>(dest[k]), setting.kinds[k].row_bytes, static_cast<std::uint32_t>(k)};
  }
  a.page_size = setting.page_size;
  a.pages = pages;
  a.row_token = reinterpret_cast<const std::int32_t*>(dev[1]);
  a.page_count = pb.c.own_pages;
  a.request = reinterpret_cast<const std::int32_t*>(dev[2]);
  a.token = dev[3];
  a.seed = r.ctx.options.seed;
  a.layer = static_cast<std::uint32_t>(l);
  a.zero_tails = zero_tails && r.ctx.options.mutant != harness::Mutant::unzeroed_rows ? 1 : 0;
  if (a.page_count == 0 || a.kinds == 0) return cudaSuccess;
  return kernels::launch_produce(a, stream);
}

// This layer's current rows of this rank's pages, into the rows buffers (for a plugin that reads
// ctx->rows): pages 0..own-1 of each kind's buffer, tails zeroed unless the harness's planted bug
// keeps them (they then hold the previous layer's rows, or the poison of the batch start).
void write_rows(PluginHost& h, const PluginBatch& pb, const std::int64_t* const* dev, std::int32_t l) {
  const model::Setting& setting = h.r.ctx.source.setting;
  for (std::size_t k = 0; k < setting.kinds.size(); ++k) h.rows[k] = setting.kind_active(k, l) ? h.rows_buffer[k] : nullptr;
  if (h.rows_buffer.empty() || h.rows_buffer[0] == nullptr) return;  // a produce_rows plugin: no rows buffers
  const TimelineSpan span(h.r, "rows", l);
  CPKV_CUDA_CHECK(launch_rows(h, pb, h.rows_buffer.data(), dev[0], dev, true, l, h.r.stream));
}

// The produce_rows service: the same producer, into the plugin's memory, from inside compose_layer.
cpkv_status produce_rows_body(cpkv_exchange_ctx* c, void* const* dest, const std::int64_t* dest_page, std::int32_t zero_tails, void* stream) {
  PluginHost& h = *host_of(c);
  if ((h.plugin.uses & CPKV_USES_PRODUCE) == 0) return fail(c, "produce_rows: the plugin's uses lacks CPKV_USES_PRODUCE");
  if (h.batch == nullptr || h.layer < 0) return fail(c, "produce_rows may be called from compose_layer only");
  if (stream != static_cast<void*>(h.r.stream)) return fail(c, "produce_rows: enqueue on the stream compose_layer was given");
  if (dest == nullptr || (dest_page == nullptr && h.batch->c.own_pages > 0)) return fail(c, "produce_rows: dest or dest_page is NULL");
  const cudaError_t e = launch_rows(h, *h.batch, dest, dest_page, h.produce_dev, zero_tails != 0, h.layer, h.r.stream);
  if (e != cudaSuccess) return fail(c, fmt::format("produce_rows: the producer launch failed: {}", cudaGetErrorString(e)));
  return CPKV_OK;
}

// The plugin call in flight in this rank process. A plugin that ends the process inside a call
// (exit, quick_exit: status 0 included) must not read as a rank that finished: the exit handler
// names the call and turns the exit into a failure; a bare _exit, which runs no handler, leaves the
// call in Bootstrap::plugin_call and plugin_finished 0, which the launching process reports
// (with_plugin_calls).
struct CallInFlight {
  PluginHost* host = nullptr;
  const char* call = nullptr;
  std::int64_t batch = -1;
  std::int32_t layer = -1;
};
CallInFlight g_call;

void exit_inside_call() {
  if (g_call.host == nullptr) return;
  PluginHost& h = *g_call.host;
  const std::string line = fmt::format("{} ended the process (exit inside the call): a plugin returns a status, it never exits",
                                       h.where(g_call.call, g_call.batch, g_call.layer));
  std::fprintf(stderr, "cpkv: cuda rank %d: %s\n", h.r.ctx.rank, line.c_str());
  std::snprintf(h.r.ctx.progress.record().error.data(), h.r.ctx.progress.record().error.size(), "%s", line.c_str());
  std::fflush(stderr);
  ::_exit(harness::kRankExitError);
}

// Marks one plugin call for its scope (g_call and the rank's Bootstrap::plugin_call: three stores,
// no formatting, as it brackets every timed compose_layer too).
class InCall {
 public:
  InCall(PluginHost& h, const char* call, std::int64_t batch, std::int32_t layer) : slot_(h.r.ctx.boot->plugin_call[h.r.ctx.rank]) {
    g_call = CallInFlight{&h, call, batch, layer};
    std::int32_t index = 0;
    while (index < static_cast<std::int32_t>(std::size(kPluginCalls)) && std::strcmp(kPluginCalls[index], call) != 0) ++index;
    slot_.batch.store(batch, std::memory_order_relaxed);
    slot_.layer.store(layer, std::memory_order_relaxed);
    slot_.call.store(index + 1);
  }
  ~InCall() {
    g_call = CallInFlight{};
    slot_.call.store(0);
  }
  InCall(const InCall&) = delete;
  InCall& operator=(const InCall&) = delete;

 private:
  Bootstrap::PluginCall& slot_;
};

// One of the plugin's context calls (setup, begin_batch, end_batch, teardown) inside InCall; a
// NULL entry (begin_batch may be) is CPKV_OK.
cpkv_status call_plugin(PluginHost& h, cpkv_status (*entry)(cpkv_exchange_ctx*), const char* call, std::int64_t batch) {
  if (entry == nullptr) return CPKV_OK;
  const InCall in(h, call, batch, -1);
  return entry(&h.ctx);
}

void watch_exits() {
  static const bool registered = std::atexit(exit_inside_call) == 0 && std::at_quick_exit(exit_inside_call) == 0;
  CPKV_ASSERT(registered);
}

// A sticky CUDA error seen after a plugin call: the work that faulted, by the stream's milestones
// (an earlier call's, maybe: the device runs behind the host), or this call where they do not say.
[[noreturn]] void throw_device_fault(PluginHost& h, const char* call, std::int64_t batch, std::int32_t layer, cudaError_t error) {
  kernels::cuda_fault_named = true;
  std::string line = device_fault_line(fmt::format("the check after {}", h.where(call, batch, layer)), error);
  if (h.milestones.place().empty()) line = fmt::format("{}: a device fault in the work it enqueued: CUDA: {}", h.where(call, batch, layer), cudaGetErrorString(error));
  if (h.ctx.error[0] != '\0') line += fmt::format(" (the plugin said: {})", h.ctx.error);
  throw std::runtime_error(line);
}

// A call's status: CPKV_OK, or the run ends with the plugin's own line, located (a timeout is
// invariant 8's). A CUDA error the call left behind (a bad launch) ends it too.
void check_call(PluginHost& h, cpkv_status status, const char* call, std::int64_t batch, std::int32_t layer) {
  const cudaError_t launch = cudaGetLastError();
  if (status == CPKV_OK && launch == cudaSuccess) return;
  h.ctx.error[CPKV_ERROR_BYTES - 1] = '\0';
  if (const cudaError_t sticky = sticky_error(); sticky != cudaSuccess) throw_device_fault(h, call, batch, layer, sticky);
  const std::string text = status == CPKV_OK ? fmt::format("left a CUDA error: {}", cudaGetErrorString(launch))
                           : status == CPKV_TIMEOUT ? fmt::format("timed out (invariant 8, liveness): {}", h.ctx.error)
                           : status == CPKV_OVERFLOW ? fmt::format("refused the batch after it started writing or waiting: {}", h.ctx.error)
                                                     : fmt::format("returned an error: {}", h.ctx.error[0] != '\0' ? h.ctx.error : "(no error text)");
  if (status == CPKV_TIMEOUT) record(h.r.ctx.boot, violation(8, h.r.ctx.rank, batch, layer, text));
  throw std::runtime_error(fmt::format("{} {}", h.where(call, batch, layer), text));
}

// Every rank's verdict on the batch (refused as an overflow or not) must be the same (invariant 3).
// Where they differ, rank 0 reports it naming every rank's verdict, and no rank runs the batch's
// layers: an accepting rank would wait for a refusing peer that never comes (a liveness timeout
// far from its cause). Every rank sees every verdict, so all take the same way.
struct Verdicts {
  bool all_accepted = false;  // the bench times only such a batch: its timing meets host barriers on every rank
  bool agreed = false;
};
Verdicts agree_on_verdict(PluginHost& h, bool refused, std::int64_t index) {
  Rank& r = h.r;
  const std::vector<std::int32_t> verdicts = r.share(r.ctx.boot->plugin_refused, refused ? 1 : 0);
  const auto refusing = std::count(verdicts.begin(), verdicts.end(), 1);
  const Verdicts out{refusing == 0, refusing == 0 || refusing == r.cp()};
  if (!out.agreed && r.ctx.rank == 0) {
    std::string each;
    for (std::int32_t p = 0; p < r.cp(); ++p) each += fmt::format("{}rank {} {}", p == 0 ? "" : ", ", p, verdicts[p] != 0 ? "refused" : "accepted");
    record(r.ctx.boot, violation(3, 0, index, 0,
                                 fmt::format("exchange plugin '{}' ranks disagree on the batch's overflow verdict ({}); no rank ran its layers", h.plugin.name, each)));
  }
  return out;
}

// Whose queries a rank holds on the path the group runs: the page split's, or section 12's token split's.
model::QuerySplit query_split(model::Variant variant) {
  switch (model::info(variant).token_split) {
    case model::TokenSplit::zigzag: return model::QuerySplit::zigzag_tokens;
    case model::TokenSplit::continuous: return model::QuerySplit::continuous_tokens;
    case model::TokenSplit::none: break;
  }
  return model::QuerySplit::pages;
}

// The plugin's attention plan of the batch, copied out of its memory without trusting the pointer
// (process_vm_readv on this process: a wild pointer is an error, not a crash of the rank). Empty and
// a reason where there is none to check.
std::vector<model::AttentionSegment> read_attention_plan(const cpkv_exchange_ctx& c, std::int64_t tokens, std::string& why) {
  const std::int64_t n = c.attention_segment_count;
  if (n < 0 || (n > 0 && c.attention_segments == nullptr)) {
    why = fmt::format("the plugin declares CPKV_FLAG_ATTENTION_PLAN but returned no attention plan for the batch (ctx->attention_segment_count {}, "
                      "attention_segments {})", n, static_cast<const void*>(c.attention_segments));
    return {};
  }
  if (n == 0) return {};  // a rank that writes no current row holds no query
  if (n > tokens) {
    why = fmt::format("the plugin's attention plan has {} segments for the batch's {} current tokens (each holds at least one query)", n, tokens);
    return {};
  }
  std::vector<cpkv_attention_segment> raw(static_cast<std::size_t>(n));
  const iovec local{raw.data(), raw.size() * sizeof(cpkv_attention_segment)};
  const iovec remote{const_cast<cpkv_attention_segment*>(c.attention_segments), local.iov_len};
  if (::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0) != static_cast<ssize_t>(local.iov_len)) {
    why = fmt::format("ctx->attention_segments ({} segments at {}) is not memory this process can read: {}", n,
                      static_cast<const void*>(c.attention_segments), std::strerror(errno));
    return {};
  }
  std::vector<model::AttentionSegment> out;
  for (const cpkv_attention_segment& x : raw) out.push_back({x.request, x.q_base, x.q_len, x.kv_len, x.k_base});
  return out;
}

// Invariant 9 for a plugin that returns its plan (CPKV_FLAG_ATTENTION_PLAN), after a batch whose
// layers every rank ran: this rank's plan against the specification (model::check_attention_plan,
// the queries of the split the group runs: query_split), then, on rank 0, every rank's queries
// against one another (model::check_attention_coverage) through the bootstrap segment. Collective:
// every rank calls it.
void check_attention(PluginHost& h, const model::Batch& batch, std::int64_t index) {
  Rank& r = h.r;
  Bootstrap& boot = *r.ctx.boot;
  std::int64_t tokens = 0;
  for (const model::Request& q : batch.requests) tokens += q.extend_len;
  std::string why;
  const std::vector<model::AttentionSegment> plan = read_attention_plan(h.ctx, tokens, why);
  if (why.empty()) {
    if (const auto finding = model::check_attention_plan(r.ctx.source.setting, batch, r.ctx.rank, plan, query_split(r.variant))) why = finding->detail();
  }
  if (why.empty() && static_cast<std::int64_t>(plan.size()) > Bootstrap::kAttentionSegmentsMax) {
    throw std::runtime_error(fmt::format("{}: its attention plan of {} segments exceeds the {} per rank cpkv compares across ranks",
                                         h.where("attention plan", index, -1), plan.size(), Bootstrap::kAttentionSegmentsMax));
  }
  if (!why.empty()) record(r.ctx.boot, violation(9, r.ctx.rank, index, -1, why));
  for (std::size_t i = 0; why.empty() && i < plan.size(); ++i) {
    boot.attention[r.ctx.rank][i] = {static_cast<std::int32_t>(plan[i].request), static_cast<std::int32_t>(plan[i].q_base), static_cast<std::int32_t>(plan[i].q_len)};
  }
  boot.attention_count[r.ctx.rank].store(why.empty() ? static_cast<std::int64_t>(plan.size()) : -1);
  r.barrier();  // every rank's queries are in; the batch's closing barrier keeps them until rank 0 has read them
  if (r.ctx.rank != 0) return;
  std::vector<std::vector<model::AttentionSegment>> per_rank(r.cp());
  for (std::int32_t p = 0; p < r.cp(); ++p) {
    const std::int64_t n = boot.attention_count[p].load();
    if (n < 0) return;  // that rank's own plan is reported; coverage over a wrong plan would say it twice
    for (std::int64_t i = 0; i < n; ++i) per_rank[p].push_back({boot.attention[p][i].request, boot.attention[p][i].q_base, boot.attention[p][i].q_len, 0, 0});
  }
  std::int32_t who = 0;
  if (const auto finding = model::check_attention_coverage(batch, per_rank, &who)) record(r.ctx.boot, violation(9, who, index, -1, finding->detail()));
}

// The layers of one accepted batch: rows, the slow rank, the plugin's layer, the byte check.
void run_layers(PluginHost& h, const BatchPlan& hb, const DevicePlan& hd, const PluginBatch& pb, const std::int64_t* const dev[4],
                kernels::VerifyResult* verify, std::int64_t index) {
  Rank& r = h.r;
  const model::Setting& setting = r.ctx.source.setting;
  harness::Totals& totals = r.ctx.boot->totals[r.ctx.rank];
  timeline_batch_begin(r, index);
  for (std::int32_t l = 0; l < r.ctx.options.layers; ++l) {
    r.ctx.progress.at(index, l);
    write_rows(h, pb, dev, l);
    slow_rank_delay(r, l);
    h.layer = l;
    h.milestones.stamp(r.stream, fmt::format("{}: a device fault in the work it enqueued", h.where("compose_layer", index, l)));
    {
      const TimelineSpan span(r, plugin_span_name(h.plugin.name), l);
      cpkv_status status = CPKV_OK;
      {
        const InCall in(h, "compose_layer", index, l);
        status = h.plugin.table->compose_layer(&h.ctx, l, r.stream);
      }
      check_call(h, status, "compose_layer", index, l);
    }
    h.layer = -1;
    // The guards first: their kernel's milestone says compose_layer's work ended without a fault.
    h.guards->check_layer(l, h.milestones.word(),
                          h.milestones.next(fmt::format("rank {} batch {} layer {}: a device fault in cpkv's own kernels after compose_layer (the guard and "
                                                        "byte checks) or before the next layer's (the rows)", r.ctx.rank, index, l)));
    for (std::size_t k = 0; k < setting.kinds.size(); ++k) {
      if (setting.kind_active(k, l) && r.ctx.cuda.verify) verify_kind(r, hb, hd, verify, l, k, model::parity_half(l));
    }
    ++totals.layers;
    r.ctx.boot->layers_done[r.ctx.rank].fetch_add(1);
  }
  timeline_layers_end(r);
}

// The bench: the table's layer and the parts it offers timed after the bytes were checked (plugin_bench.cpp).
void time_plugin_batch(PluginHost& h, const PluginBatch& pb, const std::int64_t* const dev[4], std::int64_t index) {
  PluginTimedCalls calls;
  calls.write_rows = [&](std::int32_t l) { write_rows(h, pb, dev, l); };
  calls.compose_layer = [&](std::int32_t l) {
    h.layer = l;
    const InCall in(h, "compose_layer", index, l);
    const cpkv_status status = h.plugin.table->compose_layer(&h.ctx, l, h.r.stream);
    h.layer = -1;
    return status;
  };
  calls.enqueue_part = [&](std::int32_t part, std::int32_t l) {
    h.layer = l;  // produce_rows is served inside a part as inside compose_layer
    const InCall in(h, "enqueue_part", index, l);
    const cpkv_status status = h.plugin.parts->enqueue_part(&h.ctx, part, l, h.r.stream);
    h.layer = -1;
    return status;
  };
  calls.check = [&](cpkv_status status, std::int32_t l) { check_call(h, status, "compose_layer", index, l); };
  const bool replayable = (h.plugin.table->flags & CPKV_FLAG_REPLAYABLE) != 0;
  time_plugin_layers(h.r, index, replayable, h.plugin.parts, calls);
}

// The pool content and the dense buffers' garbage (what a fresh allocation would hold), with the
// dense buffers' guards left poisoned, and the pool pages' reference hashes, all before the
// host barrier: after it, any rank's plugin code may run and write.
void populate_guarded(PluginHost& h, const BatchPlan& b, const DevicePlan& d) {
  Rank& r = h.r;
  populate_pools(r, b, d);
  h.guards->garbage_dense();
  h.guards->hash_pool_reference();
  r.sync_stream();
  h.milestones.synced();
  r.barrier();
}

// The plugin's own counts of the functional layers (the bench's timed layers are not counted),
// cpkv's of the barriers its services issued, and the model's peer bytes for the variant the group
// runs beside the plugin's, flagged where the plugin reported a figure and it differs.
void count_batch(PluginHost& h, const model::BatchLayout& layout, const cpkv_counters& before, std::uint64_t phase_before, std::int64_t index) {
  Rank& r = h.r;
  harness::Totals& totals = r.ctx.boot->totals[r.ctx.rank];
  const std::uint64_t reported = h.ctx.counters.bytes_gathered_from_peers - before.bytes_gathered_from_peers;
  totals.bytes_gathered_from_peers += reported;
  totals.barriers += h.ctx.counters.barriers - before.barriers;
  totals.service_barriers += static_cast<std::int64_t>(r.barrier_phase - phase_before);
  const std::uint64_t model = model_peer_gather_bytes(r.ctx.source.setting, layout, r.variant, r.ctx.rank, r.ctx.options.layers);
  totals.model_bytes_gathered_from_peers += model;
  totals.counters_of_plugin = 1;
  if (reported == 0 || reported == model) return;  // 0: the plugin counts nothing (the ABI allows it)
  h.findings.push_back(fmt::format("rank {} batch {}: counters: exchange plugin '{}' reported {} bytes gathered from peers (ctx->counters), the model's {} "
                                   "moves {} in the batch's {} layer(s) (model::layer_bytes, its gathers)",
                                   r.ctx.rank, index, h.plugin.name, reported, model::to_string(r.variant), model, r.ctx.options.layers));
}

// An accepted batch: the layers (with the milestone before layer 0's rows), the counts, the bench.
void run_accepted(PluginHost& h, const BatchPlan& hb, const DevicePlan& hd, const PluginBatch& pb, const std::int64_t* const dev[4], kernels::VerifyResult* verify,
                  std::int64_t index, bool all_accepted) {
  Rank& r = h.r;
  h.batch = &pb;
  h.produce_dev = dev;
  const cpkv_counters before = h.ctx.counters;
  const std::uint64_t phase_before = r.barrier_phase;
  h.milestones.stamp(r.stream, fmt::format("rank {} batch {} layer 0: a device fault in cpkv's own kernels before compose_layer (the rows, the slow rank's spin)",
                                           r.ctx.rank, index));
  h.counting = true;
  const std::int64_t syncs_before = r.host_syncs;
  run_layers(h, hb, hd, pb, dev, verify, index);
  BenchRank& bench = r.ctx.boot->bench_results[r.ctx.rank];
  bench.host_syncs_in_layer_loop = std::max<std::int64_t>(bench.host_syncs_in_layer_loop, (r.host_syncs - syncs_before) / r.ctx.options.layers);
  h.counting = false;
  count_batch(h, hb.layout, before, phase_before, index);
  if (r.ctx.cuda.timing_reps > 0 && all_accepted) {
    h.milestones.stamp(r.stream, fmt::format("{}: a device fault in the work it enqueued (the bench's timed layers)", h.where("compose_layer", index, -1)));
    time_plugin_batch(h, pb, dev, index);
  }
  h.batch = nullptr;
}

// The batch's findings of writes outside the buffers and of the counters: the first ends the run
// (its line is the failure's), the others go to stderr.
void report_findings(PluginHost& h) {
  if (h.findings.empty()) return;
  for (std::size_t i = 1; i < h.findings.size(); ++i) std::fprintf(stderr, "cpkv: cuda rank %d: %s\n", h.r.ctx.rank, h.findings[i].c_str());
  throw std::runtime_error(h.findings.front());
}

void run_plugin_batch(PluginHost& h, const model::Batch& batch, std::int64_t index, std::vector<bool>& populated, kernels::VerifyResult* verify) {
  Rank& r = h.r;
  const model::Setting& setting = r.ctx.source.setting;
  harness::Totals& totals = r.ctx.boot->totals[r.ctx.rank];
  r.batch_index = index;
  ++totals.batches;
  // cpkv's own plan of the batch, for the pool population and the byte check only (staging never
  // limits it: the plugin's staging is its own).
  const BatchPlan hb = build_batch_plan(setting, batch, model::Variant::staging_direct, r.ctx.rank, r.ctx.shape.current_pages_max, populated);
  DeviceUploads uploads(r.stream);
  const DevicePlan hd = upload_plan(hb, TableBounds{r.cp(), setting.pool_pages_per_rank(), r.ctx.shape.current_pages_max, &r.mem.pool_referenced}, uploads);
  PluginBatch pb;
  fill_batch(h, batch, index, hb.layout, uploads, pb);
  const std::int64_t* dev[4] = {uploads.upload(pb.pages), reinterpret_cast<const std::int64_t*>(uploads.upload(pb.produce_row_token)),
                                reinterpret_cast<const std::int64_t*>(uploads.upload(pb.inv_request)), uploads.upload(pb.inv_token)};
  const std::vector<kernels::VerifyResult> verify_init(static_cast<std::size_t>(r.ctx.options.layers) * setting.kinds.size(), kernels::VerifyResult{0, ~0ULL});
  CPKV_CUDA_CHECK(cudaMemcpyAsync(verify, verify_init.data(), verify_init.size() * sizeof(kernels::VerifyResult), cudaMemcpyHostToDevice, r.stream));
  CPKV_CUDA_CHECK(cudaMemsetAsync(r.mem.barrier_status, 0, sizeof(kernels::BarrierStatus), r.stream));
  // The producer writes every row of this rank's pages (tails zeroed), so only the planted bug that
  // keeps the tails needs the poison under them.
  if (r.ctx.options.mutant == harness::Mutant::unzeroed_rows) {
    for (std::size_t k = 0; k < h.rows_buffer.size(); ++k) {
      if (h.rows_buffer[k] != nullptr) CPKV_CUDA_CHECK(cudaMemsetAsync(h.rows_buffer[k], 0xA5, r.ctx.shape.current_pages_max * r.page_bytes(k), r.stream));
    }
  }
  h.guards->begin_batch();
  populate_guarded(h, hb, hd);  // synchronizes, then a host barrier: every pool is written before anyone reads
  h.ctx.batch = &pb.c;
  h.ctx.attention_segments = nullptr;  // the plugin's plan of this batch, if it returns one (check_attention); -1: none returned
  h.ctx.attention_segment_count = -1;
  const cpkv_status begun = call_plugin(h, h.plugin.table->begin_batch, "begin_batch", index);
  if (begun != CPKV_OVERFLOW) check_call(h, begun, "begin_batch", index, -1);
  const Verdicts verdicts = agree_on_verdict(h, begun == CPKV_OVERFLOW, index);
  if (begun == CPKV_OVERFLOW || !verdicts.agreed) {
    if (begun == CPKV_OVERFLOW) ++totals.overflows;
    timeline_overflow(r, index);
    r.ctx.boot->layers_done[r.ctx.rank].fetch_add(r.ctx.options.layers);
  } else {
    run_accepted(h, hb, hd, pb, dev, verify, index, verdicts.all_accepted);
  }
  r.sync_stream();  // a device fault is named here by the milestones (bootstrap.hpp: FaultSite)
  h.milestones.synced();
  timeline_batch_read(r);
  if ((h.plugin.table->flags & CPKV_FLAG_ATTENTION_PLAN) != 0 && begun != CPKV_OVERFLOW && verdicts.agreed) check_attention(h, batch, index);
  check_call(h, call_plugin(h, h.plugin.table->end_batch, "end_batch", index), "end_batch", index, -1);
  h.ctx.batch = nullptr;
  collect_findings(r, index, verify);
  if (std::string found = h.guards->read_layers(index); !found.empty()) h.findings.push_back(std::move(found));
  r.barrier();  // nobody rewrites pools or dense buffers a peer still reads
  if (std::string found = h.guards->check_pool(index); !found.empty()) h.findings.push_back(std::move(found));
  report_findings(h);
}

}  // namespace

namespace {

// For the life of the plugin host, a device fault is named by its milestones (bootstrap.hpp).
struct FaultPlace {
  explicit FaultPlace(PluginHost& h) { fault_site().device_place = [&h] { return h.milestones.place(); }; }
  ~FaultPlace() { fault_site().device_place = nullptr; }
  FaultPlace(const FaultPlace&) = delete;
  FaultPlace& operator=(const FaultPlace&) = delete;
};

}  // namespace

void run_plugin_batches(Rank& r) {
  PluginHost h{r, *r.ctx.cuda.exchange};
  watch_exits();
  const FaultPlace place(h);
  build_context(h);
  h.guards.emplace(r);
  allocate_plugin_memory(h);
  r.ctx.progress.step("plugin setup");
  h.in_setup = true;
  check_call(h, call_plugin(h, h.plugin.table->setup, "setup", -1), "setup", -1, -1);
  h.in_setup = false;
  h.guards->seal();
  std::vector<bool> populated(r.ctx.source.setting.pool_pages_per_rank(), false);
  harness::BatchCursor cursor(r.ctx.source);
  while (std::optional<model::Batch> batch = cursor.next()) {
    r.ctx.progress.at(cursor.index(), -1);
    r.ctx.progress.step("batch");
    run_plugin_batch(h, *batch, cursor.index(), populated, r.mem.verify);
    r.ctx.boot->batches_done[r.ctx.rank].fetch_add(1);
  }
  r.sync_stream();
  check_call(h, call_plugin(h, h.plugin.table->teardown, "teardown", -1), "teardown", -1, -1);
  r.ctx.boot->plugin_finished[r.ctx.rank].store(1);
  check_drained(r);
}

std::string with_plugin_calls(const Bootstrap& boot, std::int32_t cp, const std::string& plugin, const std::string& failure) {
  std::string inside, unfinished;
  for (std::int32_t r = 0; r < cp; ++r) {
    const Bootstrap::PluginCall& c = boot.plugin_call[r];
    const std::int32_t call = c.call.load();
    if (call > 0 && call <= static_cast<std::int32_t>(std::size(kPluginCalls))) {
      std::string at = fmt::format("exchange plugin '{}' {} on rank {}", plugin, kPluginCalls[call - 1], r);
      if (c.batch.load() >= 0) at += fmt::format(" batch {}", c.batch.load());
      if (c.layer.load() >= 0) at += fmt::format(" layer {}", c.layer.load());
      inside += fmt::format("{}rank {} ended inside {} (the call never returned)", inside.empty() ? "" : "; ", r, at);
    } else if (boot.plugin_finished[r].load() == 0) {
      unfinished += fmt::format("{}{}", unfinished.empty() ? "" : ", ", r);
    }
  }
  if (!failure.empty()) return inside.empty() ? failure : fmt::format("{}; {}", failure, inside);
  if (!inside.empty()) return fmt::format("{}: the process exited with status 0 without its plugin host finishing (a plugin called _exit?)", inside);
  if (!unfinished.empty()) return fmt::format("rank(s) {} exited with status 0 before the plugin host finished (a plugin's exit between calls?)", unfinished);
  return failure;
}

}  // namespace cpkv::cuda

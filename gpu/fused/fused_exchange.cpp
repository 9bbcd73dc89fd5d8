// cpkv's own fused compose exchange behind the exchange plugin ABI (fused_exchange.hpp). Per batch
// (begin_batch): the setting and batch rebuilt from the context's host arrays, cpkv's batch plan
// (gpu/device_plan.cpp: build_batch_plan) with
// its pointer tables over the context's pools, dense buffers and the plugin's own symmetric staging
// and compact buffers. Per layer (compose_layer, enqueue only): the dense half zeroed where the
// plan says, cpkv's producer writing the layer's rows straight into staging or the dense buffer
// (ctx->produce_rows, as the model's KV write lands in serving), the fused compose launch with
// its counting barrier over ctx's flag pads, then the all-reduces (ctx->all_reduce_sum) and the
// unpack. Everything a launch needs that changes per layer lives on the device (the barrier's
// phase), so the layers replay as a CUDA graph (CPKV_FLAG_REPLAYABLE). The four GPU planted bugs
// (ctx->mutant) switch through cuda::GpuMutantPolicy, with its race-window spins. Its attention
// plan (CPKV_FLAG_ATTENTION_PLAN) is cpkv's ragged index plan, and holds invariant 9's three bugs.
// Section 12's token-split variants (allgather_zigzag, allgather_continuous) take another layer
// (token_layer): the producer writes this rank's token rows into its send rows, the compose launch
// pulls the prefix pages from the pool, one all-gather per kind (ctx->all_gather: NCCL, or cpkv's
// IPC copy where ranks share a GPU) brings every rank's padded rows, and the re-ordering writes
// every current row of the dense half from them; its attention plan is the token split's.
#include "fused_exchange.hpp"

#include <array>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iterator>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpkv/harness/attention_mutant.hpp"
#include "cpkv/harness/mutants.hpp"
#include "cpkv/harness/plugin_json.hpp"
#include "cpkv/model/attention.hpp"
#include "cpkv/model/attention_bug.hpp"
#include "cpkv/model/staging.hpp"
#include "cpkv/model/variants.hpp"
#include "device_plan.hpp"
#include "launchers.cuh"
#include "mutant_policy.hpp"

namespace cpkv::fused {

namespace {

// The names the table lists: every row of model::kVariantTable (section 12's token-split
// all-gathers included), then the rows of harness::kMutantTable the GPU holds. NULL-terminated,
// built at compile time.
constexpr std::size_t kRunnableVariants = std::size(model::kVariantTable);
constexpr std::array<const char*, kRunnableVariants + 1> variant_names() {
  std::array<const char*, kRunnableVariants + 1> out{};
  std::size_t n = 0;
  for (const model::VariantInfo& row : model::kVariantTable) out[n++] = row.name.data();
  return out;
}
// Its attention plan's planted bugs (invariant 9): held here, in the plan it returns, as a plugin
// holds a bug of cpkv's table (docs/plugins.md); the GPU's four switch cpkv's kernels.
constexpr std::array<harness::Mutant, 3> kPlanMutants = {harness::Mutant::batch_as_one_sequence, harness::Mutant::causal_off_by_one,
                                                         harness::Mutant::key_base_skips_prefix};
constexpr std::size_t kHeld = harness::kGpuMutants.size() + kPlanMutants.size();
constexpr std::array<const char*, kHeld + 1> held_mutant_names() {
  std::array<const char*, kHeld + 1> out{};
  for (std::size_t i = 0; i < harness::kGpuMutants.size(); ++i) out[i] = harness::to_string(harness::kGpuMutants[i]).data();
  for (std::size_t i = 0; i < kPlanMutants.size(); ++i) out[harness::kGpuMutants.size() + i] = harness::to_string(kPlanMutants[i]).data();
  return out;
}
constexpr std::array<const char*, kRunnableVariants + 1> kVariants = variant_names();
constexpr std::array<const char*, kHeld + 1> kMutants = held_mutant_names();

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// One batch in flight: cpkv's plan on host and device, where the producer writes, every layer's launches.
struct FusedBatch {
  cuda::BatchPlan plan;
  std::unique_ptr<cuda::DeviceUploads> uploads;
  cuda::DevicePlan device{};
  const std::int64_t* fill_page = nullptr;                 // device [own pages]: own page j's current index (staging) or slot (dense)
  std::uint64_t peer_pages_per_kind = 0;                   // pages its gathers read from peers, per active kind and layer
  std::vector<std::vector<kernels::PointerTable>> tables;  // [layer][kind]
  std::vector<kernels::ComposeArgs> compose;               // [layer]
  const kernels::GatherEntry* current_only = nullptr;      // device: gather 2's entries of current pages (the bench's isolated part)
  std::int64_t current_count = 0;
  // Section 12: each current page's dense slot and each current row's gathered row (-1: zero).
  const std::int64_t* reorder_slot = nullptr;
  const std::int64_t* reorder_source = nullptr;
};

struct FusedState {
  model::Setting setting;
  model::Variant variant = model::Variant::staging_direct;  // the path the group agreed on
  cuda::GpuMutantPolicy mutant{harness::Mutant::none, 0, 1};
  model::ArenaCarve carve;
  cpkv_symmetric staging{}, compact{};
  std::vector<std::uint64_t> compact_offset;  // [kind]
  // Section 12's variants only: this rank's send rows and every rank's gathered rows, per kind.
  cpkv_symmetric send{}, gathered{};
  std::vector<std::uint64_t> send_offset, gathered_offset;  // [kind]
  cudaStream_t upload_stream = nullptr;       // begin_batch's uploads (compose_layer gets the layer's stream)
  kernels::BarrierState* barrier_state = nullptr;
  kernels::BarrierStatus* barrier_status = nullptr;
  std::vector<bool> populated;                // build_batch_plan's bookkeeping (cpkv's harness populates the pools)
  harness::Mutant held = harness::Mutant::none;  // ctx->mutant (the GPU's four also switch `mutant`)
  std::optional<FusedBatch> batch;
  std::vector<cpkv_attention_segment> attention;  // the batch's plan, handed over in ctx->attention_segments
};

FusedState& state_of(cpkv_exchange_ctx* c) { return *static_cast<FusedState*>(c->plugin_state); }
std::uint64_t page_bytes(const cpkv_exchange_ctx* c, std::size_t k) { return std::uint64_t{c->kinds[k].row_bytes} * c->page_size; }

// Runs one ABI call: an exception (a CUDA error, a setting cpkv's model refuses) becomes CPKV_ERROR
// with its text in ctx->error.
template <typename Body>
cpkv_status guarded(cpkv_exchange_ctx* c, Body&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    std::snprintf(c->error, CPKV_ERROR_BYTES, "%s", e.what());
    return CPKV_ERROR;
  }
}

harness::Mutant mutant_of(const char* name) {
  for (const harness::MutantInfo& row : harness::kMutantTable) {
    if (row.name == name) return row.mutant;
  }
  throw std::runtime_error(std::string("ctx->mutant '") + name + "' is no planted bug cpkv knows");
}

// The setting from the trace header's JSON cpkv hands over, read back as the harness wrote it.
model::Setting setting_of(const cpkv_exchange_ctx* c) {
  return harness::plugin_setting_from_json(c->setting_json, "ctx->setting_json");
}

model::Batch batch_of(const cpkv_batch& b) {
  model::Batch batch;
  for (std::int32_t q = 0; q < b.requests; ++q) {
    batch.requests.push_back({b.prefix_len[q], b.extend_len[q], std::vector<std::int64_t>(b.page_table + b.page_table_begin[q], b.page_table + b.page_table_begin[q + 1])});
  }
  return batch;
}

// Per-kind offsets of `pages` pages of each kind, 256-aligned, into `offset`; their total bytes.
std::uint64_t kind_offsets(const cpkv_exchange_ctx* c, std::int64_t pages, std::vector<std::uint64_t>& offset) {
  std::uint64_t bytes = 0;
  for (std::int32_t k = 0; k < c->kind_count; ++k) {
    offset.push_back(bytes);
    bytes += (static_cast<std::uint64_t>(pages) * page_bytes(c, k) + 255) / 256 * 256;
  }
  return bytes;
}

// Section 12's buffers (no staging, no compact buffer): the send rows, at most every current row
// of the largest batch (a rank's tokens and their padding up to the largest rank's count never
// exceed the batch's current pages), and cp ranks' of them gathered.
cpkv_status allocate_token_rows(cpkv_exchange_ctx* c, FusedState& s) {
  if (c->alloc_symmetric(c, kind_offsets(c, c->current_pages_max, s.send_offset), &s.send) != CPKV_OK) return CPKV_ERROR;
  return c->alloc_symmetric(c, kind_offsets(c, c->current_pages_max * c->cp, s.gathered_offset), &s.gathered);
}

cpkv_status fused_setup(cpkv_exchange_ctx* c) {
  return guarded(c, [&] {
    if (!CPKV_CTX_HAS(c, produce_rows) || c->produce_rows == nullptr) {
      throw std::runtime_error("this cpkv hands over no produce_rows (a context before revision 2 of ABI version 1)");
    }
    auto s = std::make_unique<FusedState>();
    s->setting = setting_of(c);
    const std::optional<model::Variant> v = model::parse_variant(c->path_variant);
    if (!v) throw std::runtime_error(std::string("ctx->path_variant '") + c->path_variant + "' is no variant of cpkv's");
    s->variant = *v;
    s->held = mutant_of(c->mutant);
    s->mutant = cuda::GpuMutantPolicy(s->held, c->rank, c->cp);
    s->carve = model::carve_arena(s->setting, c->staging_slots, 0);
    if (model::splits_tokens(s->variant)) {
      if (!CPKV_CTX_HAS(c, all_gather) || c->all_gather == nullptr) {
        throw std::runtime_error("this cpkv hands over no all_gather (a context before revision 5 of ABI version 1): section 12's variants need it");
      }
      if (allocate_token_rows(c, *s) != CPKV_OK) return CPKV_ERROR;
    } else {
      if (c->alloc_symmetric(c, s->carve.staging_bytes, &s->staging) != CPKV_OK) return CPKV_ERROR;
      if (c->alloc_symmetric(c, kind_offsets(c, c->current_pages_max, s->compact_offset), &s->compact) != CPKV_OK) return CPKV_ERROR;
    }
    cuda_ok(cudaStreamCreateWithFlags(&s->upload_stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    cuda_ok(cudaMalloc(&s->barrier_state, sizeof(kernels::BarrierState)), "cudaMalloc(barrier state)");
    cuda_ok(cudaMemset(s->barrier_state, 0, sizeof(kernels::BarrierState)), "cudaMemset(barrier state)");
    cuda_ok(cudaMalloc(&s->barrier_status, sizeof(kernels::BarrierStatus)), "cudaMalloc(barrier status)");
    cuda_ok(cudaMemset(s->barrier_status, 0, sizeof(kernels::BarrierStatus)), "cudaMemset(barrier status)");
    s->populated.assign(c->pool_pages_per_rank, false);
    c->plugin_state = s.release();
    return CPKV_OK;
  });
}

// Where the fill of kind k on layer l writes: the staging half (the mutant single_half: always
// half 0) or the layer's dense half.
std::uint8_t* fill_destination(const cpkv_exchange_ctx* c, const FusedState& s, std::int32_t l, std::size_t k) {
  if (s.batch->plan.plan.fill_to_staging) {
    return static_cast<std::uint8_t*>(s.staging.local) + s.carve.slot_offset(s.mutant.half_of(l), k, 0);
  }
  return static_cast<std::uint8_t*>(c->dense[model::parity_half(l) * c->kind_count + k]);
}

// Where the producer writes own page j (ctx->batch->own_current_index order, the order cpkv's
// producer takes): its current index in staging, or its slot in the dense buffer.
std::vector<std::int64_t> fill_pages(const cpkv_exchange_ctx* c, const FusedState& s) {
  const model::BatchLayout& layout = s.batch->plan.layout;
  const bool to_staging = s.batch->plan.plan.fill_to_staging;
  std::vector<std::int64_t> out;
  for (std::size_t i = 0; i < layout.current.size(); ++i) {
    if (layout.current[i].writer == c->rank) out.push_back(to_staging ? static_cast<std::int64_t>(i) : layout.current[i].slot);
  }
  return out;
}

// `offset` bytes into a symmetric allocation, or null where the variant has none (section 12's
// variants allocate no staging and no compact buffer).
std::uint8_t* at(void* base, std::uint64_t offset) { return base == nullptr ? nullptr : static_cast<std::uint8_t*>(base) + offset; }
std::uint8_t* at(void* base, const std::vector<std::uint64_t>& offset, std::size_t k) { return base == nullptr ? nullptr : static_cast<std::uint8_t*>(base) + offset[k]; }

// Section 12: the producer's pages are this rank's send pages (ctx->batch->own_pages, the host's
// description of its token rows), in order.
std::vector<std::int64_t> send_pages(const cpkv_exchange_ctx* c) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(c->batch->own_pages));
  for (std::size_t j = 0; j < out.size(); ++j) out[j] = static_cast<std::int64_t>(j);
  return out;
}

// Section 12: the re-ordering's device arrays, from the plan (every rank builds the same one).
void upload_reorder(const cpkv_exchange_ctx* c, FusedBatch& b) {
  const model::BatchLayout& layout = b.plan.layout;
  std::vector<std::int64_t> slot;
  for (const model::CurrentPage& page : layout.current) slot.push_back(page.slot);
  b.reorder_slot = b.uploads->upload(slot);
  b.reorder_source = b.uploads->upload(b.plan.plan.reorder_source);
  const std::int64_t send_rows = (b.plan.plan.allgather_rank_rows + c->page_size - 1) / c->page_size * c->page_size;
  if (c->batch->own_pages * c->page_size != send_rows) {
    throw std::runtime_error("batch " + std::to_string(c->batch->index) + ": cpkv describes " + std::to_string(c->batch->own_pages) + " send pages, the plan's " +
                             std::to_string(b.plan.plan.allgather_rank_rows) + " rows per rank need " + std::to_string(send_rows / c->page_size));
  }
}

kernels::PointerTable pointer_table(const cpkv_exchange_ctx* c, const FusedState& s, std::int32_t l, std::size_t k) {
  const std::int32_t dense_half = model::parity_half(l);
  const std::int32_t staging_half = s.mutant.half_of(l);
  const bool symm = model::info(s.variant).peer_pages == model::PeerPages::dense;
  const std::uint64_t dense_offset = c->dense_offset[dense_half * c->kind_count + k];
  kernels::PointerTable t{};
  for (std::int32_t p = 0; p < c->cp; ++p) {
    t.base[p] = static_cast<const std::uint8_t*>(c->pool[p]) + c->pool_offset[l * c->kind_count + k];
    t.base[c->cp + p] = symm ? static_cast<const std::uint8_t*>(c->dense_peer[p]) + dense_offset : at(s.staging.peers[p], s.carve.slot_offset(staging_half, k, 0));
  }
  t.base[kernels::kTableOwnDense] = static_cast<const std::uint8_t*>(c->dense[dense_half * c->kind_count + k]);
  t.base[kernels::kTableOwnCompact] = at(s.compact.local, s.compact_offset, k);
  return t;
}

// Layer l's fused compose launch over the context's buffers.
kernels::ComposeArgs compose_args(const cpkv_exchange_ctx* c, const FusedState& s, std::int32_t l) {
  const FusedBatch& b = *s.batch;
  kernels::ComposeArgs a{};
  for (std::int32_t k = 0; k < c->kind_count; ++k) {
    if (c->kinds[k].active[l] == 0) continue;
    kernels::ComposeKind& ck = a.kind[a.kinds++];
    const std::int32_t staging_half = s.mutant.half_of(l);
    ck.dst[kernels::kToDense] = static_cast<std::uint8_t*>(c->dense[model::parity_half(l) * c->kind_count + k]);
    ck.dst[kernels::kToStaging] = at(s.staging.local, s.carve.slot_offset(staging_half, k, 0));
    ck.dst[kernels::kToCompact] = at(s.compact.local, s.compact_offset, k);
    kernels::set_page_geometry(ck, page_bytes(c, k));
    ck.table = b.tables[l][k];
  }
  a.entries = b.device.compose;
  a.pre_count = b.plan.compose_pre;
  a.count = static_cast<std::int64_t>(b.plan.compose.size());
  a.peer_pads = c->flag_pad_table;
  a.rank = c->rank;
  a.cp = c->cp;
  a.state = s.barrier_state;
  a.status = s.barrier_status;
  a.barrier = cuda::compose_barrier(b.plan, s.mutant);
  a.phase_lag = s.mutant.barrier_phase_lag();
  a.reader_spin_cycles = s.mutant.slow_reader() ? kernels::kMutantWindowCycles : CPKV_CTX_HAS(c, reader_spin_cycles) ? c->reader_spin_cycles : 0;
  a.order_pre = b.plan.pack.empty() ? 0 : 1;
  return a;
}

// This rank's attention plan of the batch (PROTOCOL.md section 11): cpkv's ragged index plan of
// the layout (the page split's, or section 12's token split's for those variants) in the neutral
// form, with the planted bug of invariant 9 it holds switched on (model::apply_attention_bug, the
// simulator's too).
std::vector<cpkv_attention_segment> attention_plan(const cuda::BatchPlan& b, const model::Batch& batch, harness::Mutant held) {
  const model::RaggedIndexPlan plan = model::variant_index_plan(b.layout, batch, b.plan);
  std::vector<cpkv_attention_segment> out;
  for (const model::AttentionSegment& g : model::apply_attention_bug(model::attention_segments(plan), batch, harness::attention_bug(held))) {
    out.push_back(cpkv_attention_segment{g.request, g.q_base, g.q_len, g.kv_len, g.k_base});
  }
  return out;
}

cpkv_status fused_begin_batch(cpkv_exchange_ctx* c) {
  return guarded(c, [&] {
    FusedState& s = state_of(c);
    const model::Batch batch = batch_of(*c->batch);
    s.batch.emplace();
    FusedBatch& b = *s.batch;
    b.plan = cuda::build_batch_plan(s.setting, batch, s.variant, c->rank, c->staging_slots, s.populated);
    if (b.plan.overflow) {
      std::snprintf(c->error, CPKV_ERROR_BYTES, "batch %lld: %lld current pages exceed the %lld staging slots", static_cast<long long>(c->batch->index),
                    static_cast<long long>(b.plan.layout.current_pages_total), static_cast<long long>(c->staging_slots));
      s.batch.reset();
      return CPKV_OVERFLOW;
    }
    s.attention = attention_plan(b.plan, batch, s.held);
    if (CPKV_CTX_HAS(c, attention_segment_count)) {
      c->attention_segments = s.attention.data();
      c->attention_segment_count = static_cast<std::int64_t>(s.attention.size());
    }
    const bool symm = model::info(s.variant).peer_pages == model::PeerPages::dense;
    b.uploads = std::make_unique<cuda::DeviceUploads>(s.upload_stream);
    // No pool_referenced: the ABI does not say which pool pages are backed; the host checks its own
    // plan of the batch against them (plugin_host.cpp: run_plugin_batch).
    b.device = cuda::upload_plan(b.plan, cuda::TableBounds{c->cp, c->pool_pages_per_rank, symm ? c->slot_count_max : c->staging_slots}, *b.uploads);
    b.fill_page = b.uploads->upload(model::splits_tokens(s.variant) ? send_pages(c) : fill_pages(c, s));
    b.peer_pages_per_kind = cuda::peer_pages_per_kind(b.plan, c->cp, c->rank);
    std::vector<kernels::GatherEntry> current_only;  // the isolated exchange's: pages read from a rank's staging or dense half
    for (const kernels::GatherEntry& e : b.plan.gather2) {
      if (e.table_index >= c->cp && e.table_index < 2 * c->cp) current_only.push_back(e);
    }
    b.current_only = b.uploads->upload(current_only);
    b.current_count = static_cast<std::int64_t>(current_only.size());
    if (model::splits_tokens(s.variant)) upload_reorder(c, b);
    b.tables.assign(c->layers, std::vector<kernels::PointerTable>(c->kind_count));
    for (std::int32_t l = 0; l < c->layers; ++l) {
      for (std::int32_t k = 0; k < c->kind_count; ++k) b.tables[l][k] = pointer_table(c, s, l, k);
      b.compose.push_back(compose_args(c, s, l));
    }
    cuda_ok(cudaMemsetAsync(s.barrier_status, 0, sizeof(kernels::BarrierStatus), s.upload_stream), "cudaMemsetAsync(barrier status)");
    cuda_ok(cudaStreamSynchronize(s.upload_stream), "the batch's uploads");  // once per batch, before its layers
    return CPKV_OK;
  });
}

// The all-reduce variants' zeroing of the layer's dense half: every kind active on the layer, over
// the batch's slots only, in one launch (kernels::launch_zero_ranges; the bytes between two kinds'
// buffers are the host's guard, which no plugin writes, so one memset cannot cover the half, and a
// memset per kind cost one more graph node per layer than the in-process layer's single memset).
// Nothing reads a slot past the batch's (attention's plan ends there, and so does the host's byte
// check), so zeroing slot_count_max slots as before cost bytes for nothing. A buffer not 16-byte
// aligned (a foreign host's) gets a memset per kind instead.
void zero_dense_half(cpkv_exchange_ctx* c, const FusedBatch& b, std::int32_t l, cudaStream_t stream) {
  const std::int32_t half = model::parity_half(l);
  kernels::ZeroRanges ranges{};
  for (std::int32_t k = 0; k < c->kind_count; ++k) {
    if (c->kinds[k].active[l] == 0) continue;
    ranges.base[ranges.count] = c->dense[half * c->kind_count + k];
    ranges.bytes[ranges.count++] = static_cast<std::uint64_t>(b.plan.layout.slot_count) * page_bytes(c, k);
  }
  if (kernels::zero_ranges_fit(ranges)) {
    cuda_ok(kernels::launch_zero_ranges(ranges, stream), "launch_zero_ranges(dense half)");
    return;
  }
  for (std::int32_t i = 0; i < ranges.count; ++i) cuda_ok(cudaMemsetAsync(ranges.base[i], 0, ranges.bytes[i], stream), "cudaMemsetAsync(dense half)");
}

// Before the compose launch: the dense half zeroed (all-reduce variants), then cpkv's producer
// writing the layer's rows where the plan fills (the mutants no_barrier and barrier_passes_early
// delay the last rank's; skip_zero leaves the tails as the destination held them).
cpkv_status zero_and_fill(cpkv_exchange_ctx* c, const FusedState& s, std::int32_t l, cudaStream_t stream) {
  const FusedBatch& b = *s.batch;
  if (b.plan.plan.zero_dense && !s.mutant.skips_zero()) zero_dense_half(c, b, l, stream);
  if (s.mutant.slow_producer()) cuda_ok(kernels::launch_spin(kernels::kMutantWindowCycles, stream), "launch_spin");
  std::array<void*, CPKV_KINDS_MAX> dest{};
  for (std::int32_t k = 0; k < c->kind_count; ++k) dest[k] = c->kinds[k].active[l] != 0 ? fill_destination(c, s, l, k) : nullptr;
  return c->produce_rows(c, dest.data(), b.fill_page, b.plan.plan.zero_own_current && !s.mutant.skips_zero() ? 1 : 0, stream);
}

// After the compose launch, per active kind: the all-reduces over dense ranges or the compact
// buffer (the harness's service), then the unpack.
cpkv_status collectives(cpkv_exchange_ctx* c, const FusedState& s, std::int32_t l, void* stream) {
  const FusedBatch& b = *s.batch;
  const std::int32_t half = model::parity_half(l);
  for (std::int32_t k = 0; k < c->kind_count; ++k) {
    if (c->kinds[k].active[l] == 0) continue;
    const std::uint64_t pb = page_bytes(c, k);
    auto* dense = static_cast<std::uint8_t*>(c->dense[half * c->kind_count + k]);
    for (const model::SlotRange& range : b.plan.plan.allreduce_ranges) {
      if (c->all_reduce_sum(c, dense + range.slot_begin * pb, (range.slot_end - range.slot_begin) * pb, stream) != CPKV_OK) return CPKV_ERROR;
    }
    if (!b.plan.plan.compact_allreduce) continue;
    auto* compact = static_cast<std::uint8_t*>(s.compact.local) + s.compact_offset[k];
    if (c->all_reduce_sum(c, compact, b.plan.plan.compact_pages * pb, stream) != CPKV_OK) return CPKV_ERROR;
    cuda_ok(kernels::launch_gather(dense, pb, b.tables[l][k], b.device.unpack, static_cast<std::int64_t>(b.plan.unpack.size()), static_cast<cudaStream_t>(stream)),
            "launch_gather(unpack)");
  }
  return CPKV_OK;
}

// Section 12's producer: this rank's token rows of layer l into its send rows, the padding zeroed
// (skip_zero: left as it was; the re-ordering never reads it).
cpkv_status token_fill(cpkv_exchange_ctx* c, const FusedState& s, std::int32_t l, void* stream) {
  std::array<void*, CPKV_KINDS_MAX> dest{};
  for (std::int32_t k = 0; k < c->kind_count; ++k) dest[k] = c->kinds[k].active[l] != 0 ? at(s.send.local, s.send_offset, k) : nullptr;
  return c->produce_rows(c, dest.data(), s.batch->fill_page, s.mutant.skips_zero() ? 0 : 1, stream);
}

// One all-gather per kind active on layer l of every rank's padded send rows (ctx->all_gather);
// where `a` is given, each kind's gathered rows and dense half go into the re-ordering's arguments.
cpkv_status token_all_gathers(cpkv_exchange_ctx* c, const FusedState& s, std::int32_t l, void* stream, kernels::ReorderArgs* a) {
  for (std::int32_t k = 0; k < c->kind_count; ++k) {
    if (c->kinds[k].active[l] == 0) continue;
    const std::uint64_t rank_bytes = static_cast<std::uint64_t>(s.batch->plan.plan.allgather_rank_rows) * c->kinds[k].row_bytes;
    std::uint8_t* gathered = at(s.gathered.local, s.gathered_offset, k);
    if (c->all_gather(c, at(s.send.local, s.send_offset, k), gathered, rank_bytes, stream) != CPKV_OK) return CPKV_ERROR;
    if (a != nullptr) a->kind[a->kinds++] = {static_cast<std::uint8_t*>(c->dense[model::parity_half(l) * c->kind_count + k]), gathered, c->kinds[k].row_bytes};
  }
  return CPKV_OK;
}

// Section 12's exchange of layer l after the fill: one all-gather per active kind of every rank's
// padded send rows (ctx->all_gather), then the re-ordering of every current row of the dense half
// (skip_zero leaves the rows past a partial page's end as the dense buffer held them).
cpkv_status token_gather_and_reorder(cpkv_exchange_ctx* c, const FusedState& s, std::int32_t l, void* stream) {
  const FusedBatch& b = *s.batch;
  kernels::ReorderArgs a{};
  if (token_all_gathers(c, s, l, stream, &a) != CPKV_OK) return CPKV_ERROR;
  a.page_size = c->page_size;
  a.slot = b.reorder_slot;
  a.source = b.reorder_source;
  a.rows = static_cast<std::int64_t>(b.plan.plan.reorder_source.size());
  a.zero_missing = s.mutant.skips_zero() ? 0 : 1;
  cuda_ok(kernels::launch_reorder(a, static_cast<cudaStream_t>(stream)), "launch_reorder");
  return CPKV_OK;
}

// Section 12's layer: the fill, the prefix pages from the pool (the compose launch of gather 1,
// no barrier), the all-gathers and the re-ordering. Counted: the prefix pages read from peers'
// pools and the peers' rows each all-gather brings (the model's peer bytes of the variant).
cpkv_status token_layer(cpkv_exchange_ctx* c, const FusedState& s, std::int32_t l, void* stream) {
  const FusedBatch& b = *s.batch;
  if (token_fill(c, s, l, stream) != CPKV_OK) return CPKV_ERROR;
  const std::uint64_t peer_rows = cuda::peer_rows_all_gathered(b.plan, c->cp);
  for (std::int32_t k = 0; k < c->kind_count; ++k) {
    if (c->kinds[k].active[l] != 0) c->counters.bytes_gathered_from_peers += b.peer_pages_per_kind * page_bytes(c, k) + peer_rows * c->kinds[k].row_bytes;
  }
  if (b.compose[l].count > 0) cuda_ok(kernels::launch_compose(b.compose[l], static_cast<cudaStream_t>(stream)), "launch_compose");
  return token_gather_and_reorder(c, s, l, stream);
}

cpkv_status fused_compose_layer(cpkv_exchange_ctx* c, std::int32_t layer, void* stream) {
  return guarded(c, [&] {
    FusedState& s = state_of(c);
    if (!s.batch) throw std::runtime_error("compose_layer without an accepted batch (begin_batch refused it or was not called)");
    if (model::splits_tokens(s.variant)) return token_layer(c, s, layer, stream);
    auto* st = static_cast<cudaStream_t>(stream);
    if (zero_and_fill(c, s, layer, st) != CPKV_OK) return CPKV_ERROR;
    const kernels::ComposeArgs& args = s.batch->compose[layer];
    if (args.barrier != kernels::kNoBarrier) ++c->counters.barriers;
    for (std::int32_t k = 0; k < c->kind_count; ++k) {
      if (c->kinds[k].active[layer] != 0) c->counters.bytes_gathered_from_peers += s.batch->peer_pages_per_kind * page_bytes(c, k);
    }
    cuda_ok(kernels::launch_compose(args, st), "launch_compose");
    return collectives(c, s, layer, stream);
  });
}

// The bench's parts (cpkv_exchange_parts): pieces of compose_layer, enqueued alone, uncounted.

// The compose launch of layer l changed for a part: its pre-signal copies alone, or without its
// barrier; nothing where the launch has no such copies or no barrier.
void compose_variant(const FusedBatch& b, std::int32_t l, cpkv_part part, cudaStream_t stream) {
  kernels::ComposeArgs a = b.compose[l];
  if (part == CPKV_PART_PRE_SIGNAL) {
    if (a.pre_count == 0) return;
    a.count = a.pre_count;
    a.order_pre = 0;
  } else if (a.barrier == kernels::kNoBarrier) {
    return;
  }
  a.barrier = kernels::kNoBarrier;
  cuda_ok(kernels::launch_compose(a, stream), "launch_compose");
}

// The isolated current-page exchange (the variant table's `isolated` column, from the plan): the
// fused launch with only the current pages where the plan has a barrier (with it, or without it:
// the barrier's share is the difference), the compact all-reduce of the same pages where it has one.
cpkv_status isolated(cpkv_exchange_ctx* c, const FusedState& s, std::int32_t l, bool with_barrier, void* stream) {
  const FusedBatch& b = *s.batch;
  if (b.plan.plan.barrier) {
    kernels::ComposeArgs a = b.compose[l];
    a.entries = b.current_only;
    a.pre_count = 0;
    a.count = b.current_count;
    a.barrier = with_barrier ? kernels::kSignalAtStart : kernels::kNoBarrier;
    a.order_pre = 0;
    cuda_ok(kernels::launch_compose(a, static_cast<cudaStream_t>(stream)), "launch_compose(isolated)");
  }
  for (std::int32_t k = 0; k < c->kind_count && b.plan.plan.compact_allreduce; ++k) {
    if (c->kinds[k].active[l] == 0) continue;
    auto* compact = static_cast<std::uint8_t*>(s.compact.local) + s.compact_offset[k];
    if (c->all_reduce_sum(c, compact, b.plan.plan.compact_pages * page_bytes(c, k), stream) != CPKV_OK) return CPKV_ERROR;
  }
  return CPKV_OK;
}

// Section 12's parts: the fill; the layer without it (prefix pages, all-gathers, re-ordering); the
// all-gathers alone as the isolated exchange (the current rows moved between ranks, with the IPC
// stand-in's barriers where ranks share a GPU). It has no pre-signal copies and no barrier of its
// own, so those parts and the isolated one without a barrier enqueue nothing.
cpkv_status token_part(cpkv_exchange_ctx* c, const FusedState& s, std::int32_t part, std::int32_t layer, void* stream) {
  const FusedBatch& b = *s.batch;
  switch (static_cast<cpkv_part>(part)) {
    case CPKV_PART_FILL:
      return token_fill(c, s, layer, stream);
    case CPKV_PART_COMPOSE:
      if (b.compose[layer].count > 0) cuda_ok(kernels::launch_compose(b.compose[layer], static_cast<cudaStream_t>(stream)), "launch_compose");
      return token_gather_and_reorder(c, s, layer, stream);
    case CPKV_PART_ISOLATED:
      return token_all_gathers(c, s, layer, stream, nullptr);
    case CPKV_PART_PRE_SIGNAL:
    case CPKV_PART_NO_BARRIER:
    case CPKV_PART_ISOLATED_NO_BARRIER:
      return CPKV_OK;
    default:
      throw std::runtime_error("enqueue_part: part " + std::to_string(part) + " is none the fused exchange offers");
  }
}

cpkv_status fused_enqueue_part(cpkv_exchange_ctx* c, std::int32_t part, std::int32_t layer, void* stream) {
  return guarded(c, [&] {
    FusedState& s = state_of(c);
    if (!s.batch) throw std::runtime_error("enqueue_part without an accepted batch");
    if (model::splits_tokens(s.variant)) return token_part(c, s, part, layer, stream);
    auto* st = static_cast<cudaStream_t>(stream);
    const FusedBatch& b = *s.batch;
    switch (static_cast<cpkv_part>(part)) {
      case CPKV_PART_FILL: {
        std::array<void*, CPKV_KINDS_MAX> dest{};
        for (std::int32_t k = 0; k < c->kind_count; ++k) dest[k] = c->kinds[k].active[layer] != 0 ? fill_destination(c, s, layer, k) : nullptr;
        return c->produce_rows(c, dest.data(), b.fill_page, b.plan.plan.zero_own_current ? 1 : 0, stream);
      }
      case CPKV_PART_COMPOSE:
        if (b.plan.plan.zero_dense) zero_dense_half(c, b, layer, st);
        cuda_ok(kernels::launch_compose(b.compose[layer], st), "launch_compose");
        return collectives(c, s, layer, stream);
      case CPKV_PART_PRE_SIGNAL:
      case CPKV_PART_NO_BARRIER:
        compose_variant(b, layer, static_cast<cpkv_part>(part), st);
        return CPKV_OK;
      case CPKV_PART_ISOLATED:
      case CPKV_PART_ISOLATED_NO_BARRIER:
        return isolated(c, s, layer, part == CPKV_PART_ISOLATED, stream);
      default:
        throw std::runtime_error("enqueue_part: part " + std::to_string(part) + " is none the fused exchange offers");
    }
  });
}

// What the device found in the batch: a barrier poll that gave up (invariant 8).
cpkv_status fused_end_batch(cpkv_exchange_ctx* c) {
  return guarded(c, [&] {
    FusedState& s = state_of(c);
    s.batch.reset();  // the uploads are freed: cpkv synchronized the stream before end_batch
    kernels::BarrierStatus status{};
    cuda_ok(cudaMemcpy(&status, s.barrier_status, sizeof(status), cudaMemcpyDeviceToHost), "cudaMemcpy(barrier status)");
    if (status.timed_out_phase == 0) return CPKV_OK;
    std::snprintf(c->error, CPKV_ERROR_BYTES, "barrier phase %llu timed out on rank %d waiting for rank %d", static_cast<unsigned long long>(status.timed_out_phase),
                  status.rank, status.missing_peer);
    return CPKV_TIMEOUT;
  });
}

// Quiescence (invariant 4): every word of this rank's flag pad equals the barriers issued (the
// device's own count, which replayed graphs advance too); then the plugin's own memory goes (the
// symmetric allocations are cpkv's to free).
cpkv_status fused_teardown(cpkv_exchange_ctx* c) {
  return guarded(c, [&] {
    std::unique_ptr<FusedState> s(&state_of(c));
    c->plugin_state = nullptr;
    std::array<std::uint64_t, CPKV_CP_MAX> pad{};
    cuda_ok(cudaMemcpy(pad.data(), c->flag_pad, c->cp * sizeof(std::uint64_t), cudaMemcpyDeviceToHost), "cudaMemcpy(flag pad)");
    kernels::BarrierState state{};
    cuda_ok(cudaMemcpy(&state, s->barrier_state, sizeof(state), cudaMemcpyDeviceToHost), "cudaMemcpy(barrier state)");
    const std::uint64_t barriers = state.phase;
    cuda_ok(cudaFree(s->barrier_state), "cudaFree");
    cuda_ok(cudaFree(s->barrier_status), "cudaFree");
    cuda_ok(cudaStreamDestroy(s->upload_stream), "cudaStreamDestroy");
    for (std::int32_t p = 0; p < c->cp; ++p) {
      if (pad[p] == barriers) continue;
      std::snprintf(c->error, CPKV_ERROR_BYTES, "flags not drained (invariant 4): rank %d's pad word for rank %d is %llu, expected %llu", c->rank, p,
                    static_cast<unsigned long long>(pad[p]), static_cast<unsigned long long>(barriers));
      return CPKV_ERROR;
    }
    return CPKV_OK;
  });
}

// Every part of the bench: cpkv's own exchange is the one whose layer the bench takes apart.
constexpr cpkv_exchange_parts kParts = {CPKV_EXCHANGE_PARTS_VERSION, sizeof(cpkv_exchange_parts), (1u << CPKV_PART_COUNT) - 1, 0, fused_enqueue_part};

constexpr cpkv_exchange_v1_t kTable = {CPKV_EXCHANGE_ABI_VERSION, sizeof(cpkv_exchange_v1_t), "fused", kVariants.data(), kMutants.data(),
                                       CPKV_USES_PRODUCE, CPKV_FLAG_REPLAYABLE | CPKV_FLAG_ATTENTION_PLAN, fused_setup, fused_begin_batch, fused_compose_layer, fused_end_batch, fused_teardown,
                                       &kParts};

}  // namespace

const cpkv_exchange_v1_t* builtin_exchange_table() { return &kTable; }

}  // namespace cpkv::fused

#ifdef CPKV_FUSED_SHARED
// The shared object's one export (its version script hides every other symbol).
extern "C" {
extern __attribute__((visibility("default"))) const cpkv_exchange_v1_t cpkv_exchange_v1;
const cpkv_exchange_v1_t cpkv_exchange_v1 = cpkv::fused::kTable;
}
#endif

#include "cpkv/model/costs.hpp"

#include <algorithm>
#include "cpkv/model/assert.hpp"

namespace cpkv::model {

namespace {

// How many of `items` (pages or tokens) zigzag gives rank k: the items cut into 2*cp blocks, the
// first items % (2*cp) of them one longer, rank k holding blocks k and 2cp-1-k (PROTOCOL.md
// sections 2 and 12; model::layout_batch and model::token_owner assign them so).
std::int64_t zigzag_share(std::int64_t items, std::int32_t cp, std::int32_t k) {
  const std::int64_t blocks = 2 * std::int64_t{cp};
  const std::int64_t small = items / blocks;
  const std::int64_t big_blocks = items % blocks;
  return 2 * small + (k < big_blocks ? 1 : 0) + (blocks - 1 - k < big_blocks ? 1 : 0);
}

// Adds one request's current pages per writer under the setting's page split: zigzag block by block
// (as model::layout_batch assigns them, no division per page), the others page by page.
void count_page_writers(const model::Setting& setting, std::int64_t extend_len, std::int64_t pages, std::int64_t first_index,
                        std::vector<std::int64_t>& by_writer) {
  const std::int32_t cp = setting.cp;
  if (model::is_token_split(setting.split)) {
    for (std::int64_t j = 0; j < pages; ++j) ++by_writer[model::page_writer_of_token_split(setting.split, j, extend_len, setting.page_size, cp)];
    return;
  }
  if (setting.split != model::SplitPolicy::zigzag) {
    for (std::int64_t j = 0; j < pages; ++j) ++by_writer[model::writer_of(setting.split, j, pages, first_index + j, cp)];
    return;
  }
  for (std::int32_t k = 0; k < cp; ++k) by_writer[k] += zigzag_share(pages, cp, k);
}

// Adds one request's tokens per rank under both token splits (section 12), by the same block rule
// on tokens (zigzag) and token % cp (continuous).
void count_token_owners(std::int64_t tokens, std::int32_t cp, BatchCounts& counts) {
  std::vector<std::int64_t>& zigzag = counts.tokens_by_rank[static_cast<std::size_t>(model::TokenSplit::zigzag)];
  std::vector<std::int64_t>& continuous = counts.tokens_by_rank[static_cast<std::size_t>(model::TokenSplit::continuous)];
  for (std::int32_t k = 0; k < cp; ++k) {
    zigzag[k] += zigzag_share(tokens, cp, k);
    continuous[k] += tokens / cp + (k < tokens % cp ? 1 : 0);
  }
}

}  // namespace

void count_batch(const model::Setting& setting, const model::Batch& batch, BatchCounts& counts) {
  const std::int32_t cp = setting.cp;
  const std::int32_t page_size = setting.page_size;
  counts.requests = static_cast<std::int64_t>(batch.requests.size());
  counts.prefix_tokens = 0;
  counts.extend_tokens = 0;
  counts.slot_count = 0;
  counts.current_pages_total = 0;
  counts.prefix_pages_by_owner.assign(cp, 0);
  counts.span_pages.clear();
  counts.current_pages_by_writer.assign(cp, 0);
  for (std::vector<std::int64_t>& by_rank : counts.tokens_by_rank) by_rank.assign(cp, 0);
  const bool cp_power_of_two = (cp & (cp - 1)) == 0;
  for (const model::Request& request : batch.requests) {
    counts.prefix_tokens += request.prefix_len;
    counts.extend_tokens += request.extend_len;
    if (cp_power_of_two) {
      for (std::int64_t page : request.prefix_pages) ++counts.prefix_pages_by_owner[page & (cp - 1)];  // page ids are >= 0 (validated)
    } else {
      for (std::int64_t page : request.prefix_pages) ++counts.prefix_pages_by_owner[page % cp];
    }
    const std::int64_t pages = model::current_page_count(request.extend_len, page_size);
    count_page_writers(setting, request.extend_len, pages, counts.current_pages_total, counts.current_pages_by_writer);
    count_token_owners(request.extend_len, cp, counts);
    counts.current_pages_total += pages;
    counts.span_pages.push_back(static_cast<std::int64_t>(request.prefix_pages.size()));
    counts.span_pages.push_back(pages);
    counts.slot_count += static_cast<std::int64_t>(request.prefix_pages.size()) + pages;
  }
  counts.max_rank_tokens[static_cast<std::size_t>(model::TokenSplit::none)] = 0;
  for (std::size_t split = 1; split < model::kTokenSplitCount; ++split) {
    counts.max_rank_tokens[split] = *std::max_element(counts.tokens_by_rank[split].begin(), counts.tokens_by_rank[split].end());
  }
}

namespace {
std::int64_t evaluate(const model::CountTerms& t, const BatchCounts& c, std::int32_t rank) {
  return t.one + t.requests * c.requests + t.slots * c.slot_count + t.current * c.current_pages_total +
         t.own_prefix * c.prefix_pages_by_owner[rank] + t.own_current * c.current_pages_by_writer[rank];
}
}  // namespace

void closed_form_counts(const model::ClosedForm& form, const BatchCounts& c, std::int32_t rank, model::TokenSplit split, LayerCounts& n) {
  n.gathers = form.gathers;
  n.barriers = form.barriers;
  n.allreduce_calls = evaluate(form.allreduce_calls, c, rank);
  n.allreduce_pages = evaluate(form.allreduce_pages, c, rank);
  n.pre_signal_pages = evaluate(form.pre_signal_pages, c, rank);
  n.unpack_pages = evaluate(form.unpack_pages, c, rank);
  n.materialize_pages = evaluate(form.materialize_pages, c, rank);
  const auto cp = static_cast<std::int32_t>(c.current_pages_by_writer.size());
  n.allgather_calls = form.allgathers;
  n.allgather_rows = form.allgathers > 0 ? cp * c.max_rank_tokens[static_cast<std::size_t>(split)] : 0;
  // Branch-free over the peers (the loop vectorizes), then this rank's own current pages.
  n.pulled_pages_from.resize(cp);
  const std::int64_t prefix = form.pulls_prefix ? 1 : 0;
  const std::int64_t peer_current = form.pulls_peer_current ? 1 : 0;
  for (std::int32_t p = 0; p < cp; ++p) n.pulled_pages_from[p] = prefix * c.prefix_pages_by_owner[p] + peer_current * c.current_pages_by_writer[p];
  n.pulled_pages_from[rank] += ((form.pulls_own_current ? 1 : 0) - peer_current) * c.current_pages_by_writer[rank];
}

LayerCounts closed_form_counts(const model::ClosedForm& form, const BatchCounts& c, std::int32_t rank, model::TokenSplit split) {
  LayerCounts n;
  closed_form_counts(form, c, rank, split, n);
  return n;
}

namespace {

// layer_bytes_of_counts with the layer's row bytes and active kinds given (the cost model's loop
// works them out once per layer class).
void bytes_of_counts(const LayerCounts& n, std::int32_t rank, std::int32_t cp, std::uint64_t row_bytes, std::int32_t kinds_active,
                     std::int32_t page_size, model::LayerBytes& bytes) {
  const std::uint64_t page_bytes = row_bytes * static_cast<std::uint32_t>(page_size);
  bytes.own_rank = rank;
  bytes.pulled_from.resize(cp);
  for (std::int32_t p = 0; p < cp; ++p) bytes.pulled_from[p] = static_cast<std::uint64_t>(n.pulled_pages_from[p]) * page_bytes;
  bytes.local_copy_bytes = static_cast<std::uint64_t>(n.local_copy_pages()) * page_bytes;
  bytes.gathers = static_cast<std::int32_t>(n.gathers) * kinds_active;
  bytes.barriers = static_cast<std::int32_t>(n.barriers);
  bytes.allreduces = static_cast<std::int32_t>(n.allreduce_calls) * kinds_active;
  bytes.allreduce_bytes = static_cast<std::uint64_t>(n.allreduce_pages) * page_bytes;
  bytes.allgathers = static_cast<std::int32_t>(n.allgather_calls) * kinds_active;
  bytes.allgather_bytes = static_cast<std::uint64_t>(n.allgather_calls * n.allgather_rows) * row_bytes;
  // The ring collectives' receive volume, from the ring predecessor (as model::layer_bytes counts it).
  if (cp > 1) {
    bytes.pulled_from[(rank + cp - 1) % cp] += 2 * (cp - 1) * bytes.allreduce_bytes / cp + (cp - 1) * bytes.allgather_bytes / cp;
  }
}

}  // namespace

void layer_bytes_of_counts(const model::Setting& setting, const LayerCounts& n, std::int32_t rank, std::int32_t layer, model::LayerBytes& bytes) {
  bytes_of_counts(n, rank, setting.cp, setting.row_bytes_on_layer(layer), setting.kinds_on_layer(layer), setting.page_size, bytes);
}

model::LayerBytes layer_bytes_from_counts(const model::Setting& setting, const BatchCounts& c, model::Variant variant,
                                          std::int32_t rank, std::int32_t layer) {
  const LayerCounts n = closed_form_counts(model::info(variant).counts, c, rank, model::info(variant).token_split);
  model::LayerBytes bytes;
  layer_bytes_of_counts(setting, n, rank, layer, bytes);
  return bytes;
}

CostParameters derive_ceilings(const MeasuredCeilings& m) {
  CostParameters c;
  c.peer_gbps = m.ce_peer_gbps;
  c.local_gbps = m.local_copy_gbps;
  c.barrier_us = m.barrier_us_launch_free;
  if (m.allreduce_busbw_gbps > 0) c.allreduce_busbw_gbps = m.allreduce_busbw_gbps;
  if (m.allreduce_latency_us > 0) c.allreduce_latency_us = m.allreduce_latency_us;
  c.allreduce_curve = m.allreduce_curve;
  c.launch_us = std::max(0.0, m.barrier_us_graph - m.barrier_us_launch_free);
  // The sweep point where bytes weigh least against the fixed part: fewest pages, largest page.
  const MeasuredCeilings::Gather* fixed_point = nullptr;
  for (const MeasuredCeilings::Gather& g : m.gather) {
    if (g.gbps <= 0) continue;
    if (fixed_point == nullptr || g.pages < fixed_point->pages || (g.pages == fixed_point->pages && g.page_bytes > fixed_point->page_bytes)) fixed_point = &g;
  }
  if (fixed_point != nullptr) {
    const double bytes = static_cast<double>(fixed_point->pages) * static_cast<double>(fixed_point->page_bytes);
    const double graph_saving_us = std::max(0.0, m.barrier_us - m.barrier_us_graph);  // the sweep launches on a stream
    c.gather_fixed_us = std::max(0.0, bytes / (fixed_point->gbps * 1e3) - bytes / (m.ce_peer_gbps * 1e3) - graph_saving_us);
  }
  c.source = "measured in this run";
  return c;
}

namespace {

// A layer's bytes by the step of the exchange's layer that moves them (one rank, all active kinds;
// gpu/fused/fused_exchange.cpp: fused_compose_layer).
struct LayerSteps {
  std::uint64_t zero = 0;        // the batch's slots of the dense half, every active kind, in one launch
  std::uint64_t pre = 0;         // the compose launch's entries before its signal: publish or pack
  std::uint64_t post_peer = 0;   // the compose launch's gathers from peers
  std::uint64_t post_local = 0;  // its own-memory reads and local copies
  std::uint64_t unpack = 0;      // v2: compact -> dense; token splits: gathered -> dense; one gather launch per kind
};

LayerSteps layer_steps(const model::Setting& setting, const BatchCounts& c, model::Variant variant, const model::LayerBytes& bytes,
                       std::uint64_t page_bytes) {
  const std::int32_t cp = setting.cp;
  const model::ClosedForm& form = model::info(variant).counts;
  const std::uint64_t ring_bytes = cp > 1 ? 2 * (cp - 1) * bytes.allreduce_bytes / cp + (cp - 1) * bytes.allgather_bytes / cp : 0;
  LayerSteps s;
  // The zero covers the batch's slots of every kind active on the layer (page_bytes sums those
  // kinds' pages) and nothing else: nothing reads a slot past the batch's or a kind the layer lacks
  // (gpu/fused/fused_exchange.cpp: zero_dense_half; the simulator's RankMachine::run_zero_dense).
  if (model::zeroes_dense(variant)) s.zero = static_cast<std::uint64_t>(c.slot_count) * page_bytes;
  s.pre = static_cast<std::uint64_t>(evaluate(form.pre_signal_pages, c, bytes.own_rank)) * page_bytes;
  s.unpack = static_cast<std::uint64_t>(evaluate(form.unpack_pages, c, bytes.own_rank)) * page_bytes;
  s.post_peer = bytes.pulled_from_peers() - ring_bytes;
  s.post_local = bytes.pulled_from[bytes.own_rank] + bytes.local_copy_bytes - s.pre - s.unpack;
  return s;
}

}  // namespace

double allreduce_call_us(const CostParameters& ceilings, double bytes, std::int32_t cp) {
  const double factor = cp > 1 ? 2.0 * (cp - 1) / cp : 0.0;
  const double us_per_byte_busbw = 1e-3 / ceilings.allreduce_busbw_gbps;
  const auto& curve = ceilings.allreduce_curve;
  if (curve.empty()) return ceilings.allreduce_latency_us + bytes * factor * us_per_byte_busbw;
  if (bytes <= curve.front().first) return curve.front().second;
  for (std::size_t i = 1; i < curve.size(); ++i) {
    const auto& [b0, t0] = curve[i - 1];
    const auto& [b1, t1] = curve[i];
    if (bytes <= b1) return t0 + (t1 - t0) * (bytes - b0) / (b1 - b0);
  }
  return curve.back().second + (bytes - curve.back().first) * factor * us_per_byte_busbw;
}

double allreduces_us(const model::Setting& setting, const BatchCounts& c, model::Variant variant, std::int32_t layer, const CostParameters& ceilings) {
  const std::int32_t cp = setting.cp;
  if (cp <= 1) return 0.0;
  const model::VariantInfo& row = model::info(variant);
  const std::int64_t calls = evaluate(row.counts.allreduce_calls, c, /*rank=*/0);  // the same calls on every rank
  if (calls == 0) return 0.0;
  const std::int64_t pages_per_call = evaluate(row.counts.allreduce_pages, c, 0) / calls;
  // A call of no bytes (an empty span) enqueues nothing: NCCL returns at once for a count of 0.
  const auto call_us = [&](std::int64_t pages, double page_bytes) { return pages > 0 ? allreduce_call_us(ceilings, static_cast<double>(pages) * page_bytes, cp) : 0.0; };
  double us = 0.0;
  for (std::size_t k = 0; k < setting.kinds.size(); ++k) {
    if (!setting.kind_active(k, layer)) continue;
    const double page_bytes = static_cast<double>(setting.kinds[k].row_bytes) * setting.page_size;
    if (row.allreduce == model::AllReduceFamily::per_span) {
      for (const std::int64_t pages : c.span_pages) us += call_us(pages, page_bytes);  // one call per span, each its own size
    } else {
      us += static_cast<double>(calls) * call_us(pages_per_call, page_bytes);  // equal calls
    }
  }
  return us;
}

double allgathers_us(const model::Setting& setting, const BatchCounts& c, model::Variant variant, std::int32_t layer, const CostParameters& ceilings) {
  const model::VariantInfo& row = model::info(variant);
  if (row.counts.allgathers == 0 || setting.cp <= 1) return 0.0;
  const auto rows = static_cast<double>(setting.cp * c.max_rank_tokens[static_cast<std::size_t>(row.token_split)]);
  double us = 0.0;
  for (std::size_t k = 0; k < setting.kinds.size(); ++k) {
    if (!setting.kind_active(k, layer)) continue;
    us += row.counts.allgathers * allreduce_call_us(ceilings, rows * setting.kinds[k].row_bytes / 2.0, setting.cp);
  }
  return us;
}

void TimeComponents::add(const TimeComponents& o, double times) {
  zero_us += o.zero_us * times;
  fill_us += o.fill_us * times;
  launch_us += o.launch_us * times;
  barrier_us += o.barrier_us * times;
  peer_us += o.peer_us * times;
  local_us += o.local_us * times;
  allreduce_us += o.allreduce_us * times;
  allgather_us += o.allgather_us * times;
}

TimeComponents layer_copy_components(const model::Setting& setting, const BatchCounts& c, model::Variant variant, const model::LayerBytes& bytes,
                                     const CostParameters& ceilings, std::uint64_t page_bytes) {
  const LayerSteps s = layer_steps(setting, c, variant, bytes, page_bytes);
  const double us_per_byte_peer = 1e-3 / ceilings.peer_gbps;
  const double us_per_byte_local = 1e-3 / ceilings.local_gbps;
  TimeComponents t;
  // One launch zeroes every range (kernels::launch_zero_ranges), and none where there is nothing to zero.
  if (s.zero > 0) t.zero_us = ceilings.launch_us + static_cast<double>(s.zero) * us_per_byte_local;
  // The fused compose launch: the pre entries finish on every warp before the signal, so they are serial.
  t.launch_us = ceilings.gather_fixed_us;
  if (s.pre > 0) t.fill_us = ceilings.gather_fixed_us + static_cast<double>(s.pre) * us_per_byte_local;
  t.barrier_us = bytes.barriers * ceilings.barrier_us;
  const double peer = static_cast<double>(s.post_peer) * us_per_byte_peer;
  const double local = static_cast<double>(s.post_local) * us_per_byte_local;
  // The post entries' peer pulls (NVLink) and own-memory copies (HBM) run at once on the launch's
  // warps: the longer of the two, the critical one of two overlapped streams.
  (peer >= local ? t.peer_us : t.local_us) = std::max(peer, local);
  // One unpack (re-ordering) per compact all-reduce or all-gather.
  if (s.unpack > 0) t.local_us += (bytes.allreduces + bytes.allgathers) * ceilings.gather_fixed_us + static_cast<double>(s.unpack) * us_per_byte_local;
  return t;
}

// One source for the layer's copy time: its parts, summed (TimeComponents::total_us).
double layer_copy_us(const model::Setting& setting, const BatchCounts& c, model::Variant variant, const model::LayerBytes& bytes,
                     const CostParameters& ceilings, std::uint64_t page_bytes) {
  return layer_copy_components(setting, c, variant, bytes, ceilings, page_bytes).total_us();
}

double layer_time_us(const model::Setting& setting, const BatchCounts& c, model::Variant variant, const model::LayerBytes& bytes,
                     const CostParameters& ceilings, std::uint64_t page_bytes, std::int32_t layer) {
  return layer_copy_us(setting, c, variant, bytes, ceilings, page_bytes) + allreduces_us(setting, c, variant, layer, ceilings) +
         allgathers_us(setting, c, variant, layer, ceilings);
}

CostModel::CostModel(const model::Setting& setting, const CostParameters& ceilings)
    : setting_(setting), ceilings_(ceilings), capacity_(model::staging_capacity(setting)) {
  for (std::int32_t layer = 0; layer < setting.layer_count(); ++layer) {
    if (setting.layer_is_full(layer)) {
      if (full_layers_++ == 0) first_full_ = layer;
    } else {
      if (shared_layers_++ == 0) first_shared_ = layer;
    }
  }
  for (std::size_t c = 0; c < 2; ++c) {
    const std::int32_t layer = c == 0 ? first_full_ : first_shared_;
    if (layer < 0) continue;
    class_row_bytes_[c] = setting.row_bytes_on_layer(layer);
    class_kinds_[c] = setting.kinds_on_layer(layer);
  }
}

void CostModel::evaluate(const model::Batch& batch, BatchCosts& out) const {
  count_batch(setting_, batch, out.counts);
  out.verdict = model::overflow_verdict(out.counts.current_pages_total, capacity_.staging_slots);
  const std::int32_t cp = setting_.cp;
  for (std::size_t v = 0; v < kVariantCount; ++v) {
    out.pulled_from_peers_all_layers[v].assign(cp, 0);
    out.modelled_us[v] = 0.0;
    out.components[v] = TimeComponents{};
  }
  // A rejected batch moves nothing: no rank writes staging or waits at a barrier.
  if (out.verdict.overflow) return;
  // Bytes depend on the layer only through the kinds active on it: one full and one shared layer
  // stand for all. A rank's counts do not depend on the layer: worked out once for both classes,
  // into storage reused from rank to rank (no allocation in the loop).
  const std::pair<std::int32_t, std::int32_t> classes[] = {{first_full_, full_layers_}, {first_shared_, shared_layers_}};
  LayerCounts n;
  model::LayerBytes bytes;
  for (std::size_t v = 0; v < kVariantCount; ++v) {
    const model::VariantInfo& row = model::kVariantTable[v];
    std::array<double, 2> slowest_us{};
    std::array<TimeComponents, 2> slowest{};
    for (std::int32_t rank = 0; rank < cp; ++rank) {
      closed_form_counts(row.counts, out.counts, rank, row.token_split, n);
      for (std::size_t c = 0; c < 2; ++c) {
        const auto [layer, layer_count] = classes[c];
        if (layer_count == 0) continue;
        const std::uint64_t page_bytes = class_row_bytes_[c] * static_cast<std::uint32_t>(setting_.page_size);
        bytes_of_counts(n, rank, cp, class_row_bytes_[c], class_kinds_[c], setting_.page_size, bytes);
        out.pulled_from_peers_all_layers[v][rank] += bytes.pulled_from_peers() * static_cast<std::uint64_t>(layer_count);
        const TimeComponents parts = layer_copy_components(setting_, out.counts, row.variant, bytes, ceilings_, page_bytes);
        const double us = parts.total_us();
        if (rank == 0 || us > slowest_us[c]) slowest[c] = parts;
        slowest_us[c] = std::max(slowest_us[c], us);
      }
    }
    // Barriers and collectives hold every layer to its slowest rank; the all-reduces and all-gathers
    // are the same calls on every rank, so they are worked out once, not once per rank.
    for (std::size_t c = 0; c < 2; ++c) {
      const auto [layer, layer_count] = classes[c];
      if (layer_count == 0) continue;
      slowest[c].allreduce_us = allreduces_us(setting_, out.counts, row.variant, layer, ceilings_);
      slowest[c].allgather_us = allgathers_us(setting_, out.counts, row.variant, layer, ceilings_);
      out.modelled_us[v] += (slowest_us[c] + slowest[c].allreduce_us + slowest[c].allgather_us) * layer_count;
      out.components[v].add(slowest[c], layer_count);
    }
  }
}

}  // namespace cpkv::model

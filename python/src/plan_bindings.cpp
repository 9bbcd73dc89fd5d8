// Bindings of the batch-logical layout, staging capacity and verdict, and every per-batch plan
// (model/include/cpkv/model: batch.hpp, staging.hpp, plan.hpp). Index arrays come back as NumPy
// arrays so that an engine's own plan tensors compare with them in one call.
#include <optional>

#include <fmt/format.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "cpkv/harness/plan_report.hpp"
#include "cpkv/model/attention.hpp"
#include "cpkv/model/staging.hpp"
#include "cpkv/model/token_plan.hpp"

namespace cpkv::python {
namespace {

std::string slot_kind_name(model::SlotKind kind) { return kind == model::SlotKind::prefix ? "prefix" : "current"; }

// (n, 2) int64: [table_index, source_page] per dense slot.
py::array_t<std::int64_t> descriptors_to_numpy(const std::vector<model::SlotDescriptor>& descriptors) {
  std::vector<std::int64_t> flat;
  flat.reserve(descriptors.size() * 2);
  for (const model::SlotDescriptor& d : descriptors) {
    flat.push_back(d.table_index);
    flat.push_back(d.source_page);
  }
  return to_numpy(std::move(flat), {static_cast<py::ssize_t>(descriptors.size()), 2});
}

template <typename T, typename Field>
py::array_t<T> column(const std::vector<model::CurrentPage>& pages, Field field) {
  std::vector<T> values;
  values.reserve(pages.size());
  for (const model::CurrentPage& page : pages) values.push_back(static_cast<T>(page.*field));
  return to_numpy(std::move(values));
}

model::BatchLayout checked_layout(const model::Setting& setting, const model::Batch& batch) {
  require_valid(setting, batch);
  return model::layout_batch(setting, batch);
}

// The batch a layout was built from: its requests' prefix page tables and current page counts
// (issue 22, item 10: a batch of the same request count but other pages or lengths was accepted and
// planned against the wrong slots).
void require_same_batch(const model::BatchLayout& layout, const model::Batch& batch) {
  const std::size_t requests = layout.request_first_slot.size();
  if (batch.requests.size() != requests) {
    throw InputError("batch", fmt::format("{} requests, but the layout was built from {}", batch.requests.size(), requests));
  }
  for (std::size_t r = 0; r < requests; ++r) {
    const model::Request& request = batch.requests[r];
    const auto field = [r](std::string_view name) { return fmt::format("requests[{}].{}", r, name); };
    const std::int64_t prefix_slots = layout.request_first_current_slot[r] - layout.request_first_slot[r];
    if (prefix_slots != static_cast<std::int64_t>(request.prefix_pages.size())) {
      throw InputError(field("prefix_pages"), fmt::format("{} pages, but the layout holds {} for this request", request.prefix_pages.size(), prefix_slots),
                       "batch");
    }
    for (std::int64_t k = 0; k < prefix_slots; ++k) {
      const model::Slot& slot = layout.slots[static_cast<std::size_t>(layout.request_first_slot[r] + k)];
      if (slot.page_or_index != request.prefix_pages[static_cast<std::size_t>(k)]) {
        throw InputError(fmt::format("requests[{}].prefix_pages[{}]", r, k),
                         fmt::format("page {}, but the layout's slot holds page {}", request.prefix_pages[static_cast<std::size_t>(k)], slot.page_or_index), "batch");
      }
    }
    const std::int64_t first = layout.request_first_current_index[r];
    const std::int64_t end = r + 1 < requests ? layout.request_first_current_index[r + 1] : layout.current_pages_total;
    std::int64_t rows = 0;
    for (std::int64_t i = first; i < end; ++i) rows += layout.current[static_cast<std::size_t>(i)].rows_valid;
    if (rows != request.extend_len) {
      throw InputError(field("extend_len"), fmt::format("{}, but the layout's current pages hold {} tokens for this request", request.extend_len, rows),
                       "batch");
    }
  }
}

void bind_layout_types(py::module_& m) {
  py::class_<model::Slot>(m, "Slot", "What one dense slot holds: a prefix page (page_or_index is the logical page id) or a current page (its current index).")
      .def_property_readonly("kind", [](const model::Slot& s) { return slot_kind_name(s.kind); }, "'prefix' or 'current'.")
      .def_readonly("request", &model::Slot::request, "The request the slot belongs to.")
      .def_readonly("page_or_index", &model::Slot::page_or_index, "Prefix: the logical page id; current: the current index.")
      .def("__repr__", [](const model::Slot& s) { return fmt::format("Slot('{}', request={}, page_or_index={})", slot_kind_name(s.kind), s.request, s.page_or_index); });
  py::class_<model::CurrentPage>(m, "CurrentPage", "One current page of the batch, by its current index: its request, writer rank, slot and valid rows.")
      .def_readonly("request", &model::CurrentPage::request, "The request the page belongs to.")
      .def_readonly("writer", &model::CurrentPage::writer, "The rank that computes the page's rows on every layer.")
      .def_readonly("page_in_request", &model::CurrentPage::page_in_request, "Its position among the request's current pages, 0..C_r-1.")
      .def_readonly("slot", &model::CurrentPage::slot, "Its slot in the dense buffer.")
      .def_readonly("rows_valid", &model::CurrentPage::rows_valid, "Valid rows, 1..P; rows past it are zero (a partial last page).")
      .def("__repr__", [](const model::CurrentPage& p) {
        return fmt::format("CurrentPage(request={}, writer={}, page_in_request={}, slot={}, rows_valid={})", p.request, p.writer, p.page_in_request, p.slot, p.rows_valid);
      });
  py::class_<model::RowSource>(m, "RowSource", "The sequence token a dense row holds: prefix rows name their pool page, current rows their request and token.")
      .def_property_readonly("kind", [](const model::RowSource& s) { return slot_kind_name(s.kind); }, "'prefix' or 'current'.")
      .def_readonly("request", &model::RowSource::request, "The request of the row.")
      .def_readonly("token", &model::RowSource::token, "Position in the request's sequence (prefix then extend).")
      .def_readonly("logical_page", &model::RowSource::logical_page, "Prefix rows: the pool page; current rows: -1.")
      .def_readonly("row_in_page", &model::RowSource::row_in_page, "The row within its page.");
}

void bind_batch_layout(py::module_& m) {
  py::class_<model::BatchLayout>(m, "BatchLayout",
                                 "The batch-logical layout (PROTOCOL.md sections 2-3): slots in merged-span order, current pages by "
                                 "current index with their writers. The same on every rank.")
      .def_readonly("cp", &model::BatchLayout::cp, "Ranks in the CP group.")
      .def_readonly("page_size", &model::BatchLayout::page_size, "P, tokens per page.")
      .def_readonly("slot_count", &model::BatchLayout::slot_count, "Dense slots: every request's prefix pages then current pages.")
      .def_readonly("current_pages_total", &model::BatchLayout::current_pages_total, "Current pages of the batch (what staging must hold).")
      .def_readonly("request_first_slot", &model::BatchLayout::request_first_slot, "Per request: the slot where its prefix span begins.")
      .def_readonly("request_first_current_slot", &model::BatchLayout::request_first_current_slot, "Per request: the slot where its current span begins.")
      .def_readonly("request_first_current_index", &model::BatchLayout::request_first_current_index, "Per request: its first current index.")
      .def_readonly("slots", &model::BatchLayout::slots, "Every dense slot (list of Slot).")
      .def_readonly("current", &model::BatchLayout::current, "Every current page by current index (list of CurrentPage).")
      .def_property_readonly("writers", [](const model::BatchLayout& l) { return column<std::int32_t>(l.current, &model::CurrentPage::writer); },
                             "int32 array: the writer rank of every current page, by current index.")
      .def_property_readonly("current_slots", [](const model::BatchLayout& l) { return column<std::int64_t>(l.current, &model::CurrentPage::slot); },
                             "int64 array: the dense slot of every current page, by current index.")
      .def("__repr__", [](const model::BatchLayout& l) {
        return fmt::format("BatchLayout(cp={}, page_size={}, slot_count={}, current_pages_total={})", l.cp, l.page_size, l.slot_count, l.current_pages_total);
      });
  m.def("layout_batch", &checked_layout, py::arg("setting"), py::arg("batch"),
        "The batch's layout under the setting (validates the batch first: cpkv.InputError on bad input).");
  m.def("row_source", [](const model::BatchLayout& l, std::int64_t slot, std::int32_t row) {
    if (slot < 0 || slot >= l.slot_count) throw InputError("slot", fmt::format("{} is not a slot of the layout's {}", slot, l.slot_count));
    if (row < 0 || row >= l.page_size) throw InputError("row", fmt::format("{} is not a row of a page of {}", row, l.page_size));
    return model::row_source(l, slot, row);
  }, py::arg("layout"), py::arg("slot"), py::arg("row"), "The token dense row `row` of `slot` holds, or None for a zero row (past the end of a partial page).");
}

void bind_staging(py::module_& m) {
  py::class_<model::StagingCapacity>(m, "StagingCapacity", "Registration-time staging capacity (PROTOCOL.md section 4).")
      .def_readonly("staging_slots", &model::StagingCapacity::staging_slots, "Page slots per parity half per buffer kind.")
      .def_property_readonly("source", [](const model::StagingCapacity& c) { return std::string(model::to_string(c.source)); },
                             "What sized it: caps, pool_fallback or mib_override.")
      .def_readonly("bytes_total", &model::StagingCapacity::bytes_total, "2 * staging_slots * P * sum(row_bytes).");
  m.def("staging_capacity", [](const model::Setting& s) { return model::staging_capacity(s); }, py::arg("setting"),
        "The staging capacity the setting registers: MiB override, else the caps, else the pool fallback.");
  py::class_<model::Verdict>(m, "Verdict", "The overflow verdict of a batch: rank-uniform, from batch-logical values only.")
      .def_readonly("overflow", &model::Verdict::overflow, "True if current_pages_total > staging_slots: the batch is rejected before any rank moves a byte.")
      .def_readonly("current_pages_total", &model::Verdict::current_pages_total, "The batch's current pages.")
      .def_readonly("staging_slots", &model::Verdict::staging_slots, "The registered staging slots.")
      .def("describe", &model::Verdict::describe, "'ok' or 'overflow: N current pages > M staging slots'.")
      .def("__str__", &model::Verdict::describe);
  m.def("overflow_verdict", [](std::int64_t current_pages_total, std::int64_t staging_slots) {
    if (current_pages_total < 0) throw InputError("current_pages_total", fmt::format("{} is negative", current_pages_total));
    if (staging_slots < 0) throw InputError("staging_slots", fmt::format("{} is negative", staging_slots));
    return model::overflow_verdict(current_pages_total, staging_slots);
  }, py::arg("current_pages_total"), py::arg("staging_slots"), "The overflow verdict: overflow when current_pages_total > staging_slots.");
}

void bind_variant_plan(py::module_& m) {
  py::class_<model::VariantPlan>(m, "VariantPlan",
                                 "What one rank does per layer and buffer kind under one variant, as data (steps in order: zero_dense, "
                                 "local prefix, zero_own_current, fill, compact pack, gather1, publish, barrier, gather2, all-reduces, unpack). "
                                 "gather1/gather2: (slots, 2) int64 arrays of [table_index, source_page]; empty when there is no gather.")
      .def_property_readonly("variant", [](const model::VariantPlan& p) { return std::string(model::to_string(p.variant)); }, "The variant's name.")
      .def_readonly("rank", &model::VariantPlan::rank, "The rank this plan is for.")
      .def_readonly("zero_dense", &model::VariantPlan::zero_dense, "Zero every dense slot first (all-reduce variants).")
      .def_readonly("local_prefix_slots", &model::VariantPlan::local_prefix_slots, "Prefix slots this rank copies from its own pool.")
      .def_readonly("zero_own_current", &model::VariantPlan::zero_own_current, "Zero the pages the fill writes (partial pages keep zero tails).")
      .def_readonly("fill_to_staging", &model::VariantPlan::fill_to_staging, "Fill through the staging-remapped page inverse.")
      .def_readonly("own_current", &model::VariantPlan::own_current, "Current indices this rank writes.")
      .def_property_readonly("gather1", [](const model::VariantPlan& p) { return descriptors_to_numpy(p.gather1); }, "The gather before the barrier: (slots, 2) int64 [table_index, source_page], or (0, 2).")
      .def_readonly("barrier", &model::VariantPlan::barrier, "A counting barrier after gather1 / publish.")
      .def_property_readonly("gather2", [](const model::VariantPlan& p) { return descriptors_to_numpy(p.gather2); }, "The gather after the barrier (it reads peers' staging or dense buffers): (slots, 2) int64, or (0, 2).")
      .def_property_readonly("allreduce_ranges", [](const model::VariantPlan& p) {
        std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
        for (const model::SlotRange& r : p.allreduce_ranges) ranges.emplace_back(r.slot_begin, r.slot_end);
        return ranges;
      }, "Sum all-reduces over dense slot ranges [begin, end).")
      .def_readonly("compact_allreduce", &model::VariantPlan::compact_allreduce, "v2: pack own current pages, one all-reduce over all current pages.")
      .def_readonly("compact_pages", &model::VariantPlan::compact_pages, "v2: pages of the compact buffer (current_pages_total).")
      .def_readonly("publish", &model::VariantPlan::publish, "staging_publish: copy own current pages dense -> staging.")
      .def_property_readonly("token_split", [](const model::VariantPlan& p) {
        return std::string(p.token_split == model::TokenSplit::zigzag ? "zigzag" : p.token_split == model::TokenSplit::continuous ? "continuous" : "none");
      }, "Section 12's token split of the variant: 'zigzag', 'continuous', or 'none' (a page-split variant).")
      .def_readonly("allgather_rank_rows", &model::VariantPlan::allgather_rank_rows,
                    "Token-split variants: the rows every rank sends to the all-gather (the largest rank's token count; the others pad).")
      .def_property_readonly("reorder_source", [](const model::VariantPlan& p) { return to_numpy(std::vector<std::int64_t>(p.reorder_source)); },
                             "Token-split variants: int64 per current row of the batch (current index * P + row), the gathered row "
                             "(owner * allgather_rank_rows + its position among the owner's tokens) it is copied from; -1: a zero row past "
                             "the end of a partial page.")
      .def("allreduce_count", &model::VariantPlan::allreduce_count, "All-reduces per layer and buffer kind.");
  m.def("variant_plan", [](const model::BatchLayout& l, const std::string& variant, std::int32_t rank) {
    return model::variant_plan(l, require_variant(variant), require_rank(rank, l.cp));
  }, py::arg("layout"), py::arg("variant"), py::arg("rank"), "The plan of one rank under one variant (a name of cpkv.VARIANTS).");
  m.def("staging_direct_plan", [](const model::BatchLayout& l) { return descriptors_to_numpy(model::staging_direct_plan(l)); }, py::arg("layout"),
        "The staging_direct compose plan: (slots, 2) int64 [table_index, source_page]; prefix page g: (g % cp, g // cp); "
        "current index i of writer w: (cp + w, i). The same on every rank and layer.");
  m.attr("ZERO_FILL") = model::SlotDescriptor::kZeroFill;
  m.attr("SKIP") = model::SlotDescriptor::kSkip;
}

void bind_inverse_and_ragged(py::module_& m) {
  py::class_<model::PageInverse>(m, "PageInverse", "The fill's destinations for every current token this rank computes, in merged-span order.")
      .def_property_readonly("request", [](const model::PageInverse& p) {
        std::vector<std::int32_t> v;
        for (const model::LocalToken& t : p.tokens) v.push_back(t.request);
        return to_numpy(std::move(v));
      }, "int32 array: each token's request.")
      .def_property_readonly("token", [](const model::PageInverse& p) {
        std::vector<std::int64_t> v;
        for (const model::LocalToken& t : p.tokens) v.push_back(t.token);
        return to_numpy(std::move(v));
      }, "int64 array: each token's position in its request's sequence.")
      .def_property_readonly("dest_row", [](const model::PageInverse& p) { return to_numpy(std::vector<std::int64_t>(p.dest_row)); },
                             "int64 array: the row the fill writes each token to.");
  m.def("page_inverse", [](const model::BatchLayout& l, const model::Batch& b, std::int32_t rank, const std::string& target) {
    require_same_batch(l, b);
    if (target != "dense" && target != "staging") throw InputError("target", fmt::format("'{}' is not dense or staging", target));
    return model::page_inverse(l, b, require_rank(rank, l.cp), target == "dense" ? model::InverseTarget::dense : model::InverseTarget::staging);
  }, py::arg("layout"), py::arg("batch"), py::arg("rank"), py::arg("target") = "dense",
        "The page inverse of a rank: dense rows (slot * P + offset) or staging-remapped rows (i * P + offset).");
  // The neutral segment of section 11 is cpkv.RaggedSegment (attention_bindings.cpp); this one carries
  // the ragged index plan's own extra rows (q_start, current_base).
  py::class_<model::RaggedSegment>(m, "RaggedIndexSegment", "One segment of the indexer's ragged index plan (cpkv.RaggedSegment is its neutral form).")
      .def_readonly("request", &model::RaggedSegment::request, "The request of the segment.")
      .def_readonly("q_start", &model::RaggedSegment::q_start, "First row of the segment in this rank's packed query tokens.")
      .def_readonly("q_len", &model::RaggedSegment::q_len, "Query tokens in the segment.")
      .def_readonly("q_base", &model::RaggedSegment::q_base, "Offset of its first token within the request's extend.")
      .def_readonly("kv_len", &model::RaggedSegment::kv_len, "Keys visible to its last query: prefix_len + q_base + q_len.")
      .def_readonly("k_base", &model::RaggedSegment::k_base, "Dense row where the request's span (prefix first) begins.")
      .def_readonly("current_base", &model::RaggedSegment::current_base, "Dense row where the request's current span begins.");
  py::class_<model::RaggedIndexPlan>(m, "RaggedIndexPlan", "The per-batch ragged index plan of the indexer on one rank.")
      .def_readonly("rank", &model::RaggedIndexPlan::rank, "The rank this plan is for.")
      .def_readonly("q_tokens_total", &model::RaggedIndexPlan::q_tokens_total, "Query tokens this rank computes.")
      .def_readonly("segments", &model::RaggedIndexPlan::segments, "One segment per maximal run of consecutive current pages of one request this rank writes.")
      .def("attention_segments", [](const model::RaggedIndexPlan& p) { return model::attention_segments(p); },
           "The plan in the neutral form of PROTOCOL.md section 11: a list of cpkv.RaggedSegment.");
  m.def("ragged_index_plan", [](const model::BatchLayout& l, const model::Batch& b, std::int32_t rank) {
    require_same_batch(l, b);
    return model::ragged_index_plan(l, b, require_rank(rank, l.cp));
  }, py::arg("layout"), py::arg("batch"), py::arg("rank"), "The indexer's ragged index plan of one rank.");
  m.def("token_split_index_plan", [](const model::BatchLayout& l, const model::Batch& b, const model::VariantPlan& p) {
    require_same_batch(l, b);
    if (p.token_split == model::TokenSplit::none) throw InputError("plan", fmt::format("variant {} has no token split (section 12)", model::to_string(p.variant)));
    if (static_cast<std::int64_t>(p.reorder_source.size()) != l.current_pages_total * l.page_size) {
      throw InputError("plan", fmt::format("{} current rows, but the layout has {}", p.reorder_source.size(), l.current_pages_total * l.page_size));
    }
    return model::token_split_index_plan(l, b, p);
  }, py::arg("layout"), py::arg("batch"), py::arg("plan"),
        "The ragged index plan of a rank of a token-split variant (section 12), read off its variant_plan: its queries are the tokens it sends.");
  // The one choice between the page split's and the token split's plan (model::variant_index_plan,
  // the fused GPU plugin's too), so Python's conformance context does not make it again.
  m.def("variant_index_plan", [](const model::BatchLayout& l, const model::Batch& b, const model::VariantPlan& p) {
    require_same_batch(l, b);
    require_rank(p.rank, l.cp);
    if (p.token_split != model::TokenSplit::none && static_cast<std::int64_t>(p.reorder_source.size()) != l.current_pages_total * l.page_size) {
      throw InputError("plan", fmt::format("{} current rows, but the layout has {}", p.reorder_source.size(), l.current_pages_total * l.page_size));
    }
    return model::variant_index_plan(l, b, p);
  }, py::arg("layout"), py::arg("batch"), py::arg("plan"),
        "The attention plan of the plan's rank under its variant (section 11): the page split's ragged index plan, or a token split's (section 12).");
  m.def("token_owner", [](const std::string& split, std::int64_t token, std::int64_t extend_len, std::int32_t cp) {
    if (split != "zigzag" && split != "continuous") throw InputError("split", fmt::format("'{}' is not zigzag or continuous", split));
    if (cp < 1) throw InputError("cp", fmt::format("{} is not a rank count", cp));
    if (token < 0 || token >= extend_len) throw InputError("token", fmt::format("{} is not an offset of an extend of {}", token, extend_len));
    return model::token_owner(split == "zigzag" ? model::TokenSplit::zigzag : model::TokenSplit::continuous, token, extend_len, cp);
  }, py::arg("split"), py::arg("token"), py::arg("extend_len"), py::arg("cp"),
        "The rank that computes extend offset `token` of a request under section 12's token split (model::token_owner).");
}

void bind_layer_bytes(py::module_& m) {
  py::class_<model::LayerBytes>(m, "LayerBytes", "Bytes one rank moves for one layer (all kinds active on it) under one variant.")
      .def_readonly("pulled_from", &model::LayerBytes::pulled_from, "Per peer rank: bytes this rank reads from its memory (all-reduces: ring volume from the predecessor).")
      .def_readonly("allreduce_bytes", &model::LayerBytes::allreduce_bytes, "Summed all-reduce buffer sizes N.")
      .def_readonly("local_copy_bytes", &model::LayerBytes::local_copy_bytes, "Publish copies, local materialize, compact pack/unpack.")
      .def_readonly("allreduces", &model::LayerBytes::allreduces, "All-reduces on the layer.")
      .def_readonly("barriers", &model::LayerBytes::barriers, "Barriers on the layer.")
      .def_readonly("gathers", &model::LayerBytes::gathers, "Gathers on the layer.")
      .def_readonly("own_rank", &model::LayerBytes::own_rank, "The rank whose bytes these are.")
      .def("pulled_from_peers", &model::LayerBytes::pulled_from_peers, "Bytes pulled from every rank but its own.");
  m.def("batch_bytes_pulled", [](const model::Setting& s, const model::BatchLayout& layout, const std::string& variant) {
    return model::batch_bytes_pulled(s, layout, require_variant(variant));
  }, py::arg("setting"), py::arg("layout"), py::arg("variant"),
        "Per rank, the whole batch's bytes pulled from each rank (itself included), over every layer and active kind.");
  m.def("layer_bytes", [](const model::Setting& s, const model::VariantPlan& plan, std::int32_t layer) {
    require_rank(plan.rank, s.cp);
    return model::layer_bytes(s, plan, require_layer(s, layer));
  }, py::arg("setting"), py::arg("plan"), py::arg("layer"), "The bytes the plan's rank moves on one layer.");
}

// Section 12's plan of a batch under a token-split variant, as `cpkv plan` prints it.
void bind_token_split_plan(py::module_& m) {
  py::class_<model::TokenRun>(m, "TokenRun", "A run of one request's tokens among a rank's, in its send order: first, first + step, ... (count of them).")
      .def_readonly("request", &model::TokenRun::request, "The request.")
      .def_readonly("first", &model::TokenRun::first, "Its first token's offset within the request's extend.")
      .def_readonly("count", &model::TokenRun::count, "Tokens in the run.")
      .def_readonly("step", &model::TokenRun::step, "Offset from one token of the run to the next.");
  py::class_<model::TokenSplitRank>(m, "TokenSplitRank", "One rank under a token split: its tokens, the all-gather's bytes, its prefix pulls, its attention plan.")
      .def_readonly("rank", &model::TokenSplitRank::rank, "The rank.")
      .def_readonly("tokens", &model::TokenSplitRank::tokens, "Its tokens in send order, as a list of cpkv.TokenRun.")
      .def_readonly("token_count", &model::TokenSplitRank::token_count, "Its send rows that hold a token.")
      .def_readonly("padding_rows", &model::TokenSplitRank::padding_rows, "max_rank_tokens - token_count: its send rows that pad.")
      .def_readonly("allgather_bytes", &model::TokenSplitRank::allgather_bytes, "The gathered buffer over the batch (cp * max_rank_tokens rows per all-gather).")
      .def_readonly("allgather_peer_bytes", &model::TokenSplitRank::allgather_peer_bytes, "Of it, the peers' blocks ((cp - 1) of cp).")
      .def_readonly("prefix_pages_from", &model::TokenSplitRank::prefix_pages_from, "Per owner: the batch's prefix pages its gather reads from that pool.")
      .def_readonly("prefix_bytes_from", &model::TokenSplitRank::prefix_bytes_from, "Per owner: their bytes over the batch.")
      .def_readonly("attention", &model::TokenSplitRank::attention, "Its attention plan (section 11), the token split's: a list of cpkv.RaggedSegment.");
  py::class_<model::TokenSplitPlan>(m, "TokenSplitPlan", "A batch's plan under a token-split all-gather variant (PROTOCOL.md section 12).")
      .def_property_readonly("split", [](const model::TokenSplitPlan& t) { return std::string(model::to_string(t.split)); }, "zigzag_tokens or continuous_tokens.")
      .def_readonly("tokens_total", &model::TokenSplitPlan::tokens_total, "The batch's current tokens.")
      .def_readonly("max_rank_tokens", &model::TokenSplitPlan::max_rank_tokens, "The largest rank's count: what every rank sends.")
      .def_readonly("allgather_rows", &model::TokenSplitPlan::allgather_rows, "Rows of one all-gather: cp * max_rank_tokens.")
      .def_readonly("padding_rows", &model::TokenSplitPlan::padding_rows, "allgather_rows - tokens_total.")
      .def_readonly("allgathers", &model::TokenSplitPlan::allgathers, "All-gather calls over the batch: one per layer and active kind.")
      .def_readonly("ranks", &model::TokenSplitPlan::ranks, "Every rank, a list of cpkv.TokenSplitRank.")
      .def_readonly("no_staging_detail", &model::TokenSplitPlan::no_staging_detail,
                    "What the batch has instead of an overflow verdict (no staging: invariant 3 does not apply).");
  m.def("token_split_plan", [](const model::Setting& s, const model::BatchLayout& l, const model::Batch& b, const std::string& variant) {
    require_same_batch(l, b);
    const model::Variant v = require_variant(variant);
    if (!model::splits_tokens(v)) throw InputError("variant", fmt::format("{} has no token split (section 12)", variant));
    if (l.cp != s.cp || l.page_size != s.page_size) throw InputError("layout", "was built for another setting's cp or page size");
    return model::token_split_plan(s, l, b, v);
  }, py::arg("setting"), py::arg("layout"), py::arg("batch"), py::arg("variant"),
        "The batch's plan under a token-split all-gather variant: what `cpkv plan --variant allgather_*` prints.");
}

// cpkv.plan's object of one batch: the harness's builder of `cpkv plan --json`'s line, so the two
// front ends hold one shape (python/cpkv/_plan.py keeps only the options and the trace reading).
void bind_plan_json(py::module_& m) {
  m.def("plan_json", [](const model::Setting& s, const model::Batch& b, std::int64_t index, std::optional<std::int32_t> rank,
                        const std::string& variant) {
    require_valid(s, b);
    const model::Variant v = require_variant(variant);
    if (rank) require_rank(*rank, s.cp);
    return to_python(harness::plan_json(harness::plan_batch(s, b, index, v, rank)));
  }, py::arg("setting"), py::arg("batch"), py::arg("index") = 0, py::arg("rank") = py::none(), py::arg("variant") = "staging_direct",
        "One batch's plan as a dict: the object `cpkv plan --json` writes for it (harness::plan_json).");
}

}  // namespace

void bind_layout(py::module_& m) {
  bind_layout_types(m);
  bind_batch_layout(m);
  bind_staging(m);
}

void bind_plans(py::module_& m) {
  bind_variant_plan(m);
  bind_inverse_and_ragged(m);
  bind_layer_bytes(m);
  bind_token_split_plan(m);
  bind_plan_json(m);
}

}  // namespace cpkv::python

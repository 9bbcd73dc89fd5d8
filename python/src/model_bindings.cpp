// Bindings of the protocol model's data and plans (model/include/cpkv/model: setting.hpp, batch.hpp,
// staging.hpp, plan.hpp). Values are checked here only so that bad input raises a one-line
// cpkv.InputError instead of tripping an assert in the model; every number comes from the model.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "cpkv/model/staging.hpp"

namespace cpkv::python {
namespace {

std::string optional_text(const std::optional<std::int64_t>& value) { return value ? std::to_string(*value) : "None"; }

std::vector<std::string> kind_names(const model::Setting& s) {
  std::vector<std::string> names;
  for (const model::BufferKind& kind : s.kinds) names.emplace_back(kind.name);
  return names;
}

// The trace reader's words for an unknown buffer kind or split policy, so that a Setting built in
// Python fails as a trace header naming the same value would.
model::Setting make_setting(std::int32_t cp, std::int32_t page_size, const std::vector<std::string>& kinds,
                            const std::string& layer_pattern, std::int64_t pool_pages, const std::string& split,
                            std::optional<std::int64_t> max_total_extend_tokens, std::optional<std::int64_t> max_batch_requests,
                            std::optional<std::int64_t> staging_mib) {
  model::Setting s;
  s.cp = cp;
  s.page_size = page_size;
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    const auto kind = model::find_buffer_kind(kinds[i]);
    if (!kind) {
      std::vector<std::string_view> known;
      for (const model::BufferKind& k : model::kBufferKinds) known.push_back(k.name);
      throw InputError(fmt::format("buffer_kinds[{}]", i), fmt::format("unknown buffer kind \"{}\" (known: {})", kinds[i], fmt::join(known, ", ")));
    }
    s.kinds.push_back(*kind);
  }
  s.layer_pattern = layer_pattern;
  s.pool_pages = pool_pages;
  const auto policy = model::parse_split_policy(split);
  if (!policy) throw InputError("split", fmt::format("unknown split policy \"{}\" (known: zigzag, contiguous, round_robin, zigzag_tokens, continuous_tokens)", split));
  s.split = *policy;
  s.caps.max_total_extend_tokens = max_total_extend_tokens;
  s.caps.max_batch_requests = max_batch_requests;
  s.caps.staging_mib_override = staging_mib;
  require_valid(s);
  return s;
}

std::string setting_repr(const model::Setting& s) {
  return fmt::format(
      "Setting(cp={}, page_size={}, kinds={}, layer_pattern='{}', pool_pages={}, split='{}', max_total_extend_tokens={}, "
      "max_batch_requests={}, staging_mib={})",
      s.cp, s.page_size, py::repr(py::cast(kind_names(s))).cast<std::string>(), s.layer_pattern, s.pool_pages,
      model::to_string(s.split), optional_text(s.caps.max_total_extend_tokens), optional_text(s.caps.max_batch_requests),
      optional_text(s.caps.staging_mib_override));
}

bool same_setting(const model::Setting& a, const model::Setting& b) {
  return a.cp == b.cp && a.page_size == b.page_size && kind_names(a) == kind_names(b) && a.layer_pattern == b.layer_pattern &&
         a.pool_pages == b.pool_pages && a.split == b.split && a.caps.max_total_extend_tokens == b.caps.max_total_extend_tokens &&
         a.caps.max_batch_requests == b.caps.max_batch_requests && a.caps.staging_mib_override == b.caps.staging_mib_override;
}

void bind_setting(py::module_& m) {
  py::class_<model::BufferKind>(m, "BufferKind", "A KV buffer kind of the closed registry: its name, bytes per token row, and whether it exists only on full ('F') layers.")
      .def_property_readonly("name", [](const model::BufferKind& k) { return std::string(k.name); }, "The kind's name: kv_fp8, kv_bf16 or indexer_k.")
      .def_readonly("row_bytes", &model::BufferKind::row_bytes, "Bytes per token row.")
      .def_readonly("full_layers_only", &model::BufferKind::full_layers_only, "True if the kind exists only on full ('F') layers (the indexer).")
      .def("__repr__", [](const model::BufferKind& k) { return fmt::format("BufferKind('{}', row_bytes={})", k.name, k.row_bytes); });

  py::class_<model::Setting>(m, "Setting",
                             "The setting of a context-parallel group (PROTOCOL.md section 1): what does not change from batch to "
                             "batch. Validated on construction by the model (cpkv.InputError names the field and the reason).")
      .def(py::init(&make_setting), py::arg("cp"), py::arg("page_size"), py::arg("kinds"), py::arg("layer_pattern"), py::arg("pool_pages"),
           py::arg("split") = "zigzag", py::arg("max_total_extend_tokens") = py::none(), py::arg("max_batch_requests") = py::none(),
           py::arg("staging_mib") = py::none(),
           "Build and validate a setting. kinds: buffer kind names (kv_fp8, kv_bf16, indexer_k); layer_pattern: one 'F' "
           "(full, runs the indexer) or 'S' (shared) per layer; split: zigzag, contiguous, round_robin, zigzag_tokens or continuous_tokens; the caps size staging.")
      .def_readonly("cp", &model::Setting::cp, "Ranks in the CP group.")
      .def_readonly("page_size", &model::Setting::page_size, "P, tokens per page.")
      .def_readonly("kinds", &model::Setting::kinds, "The buffer kinds, in trace order.")
      .def_property_readonly("kind_names", &kind_names, "The buffer kinds' names, in trace order.")
      .def_readonly("layer_pattern", &model::Setting::layer_pattern, "One 'F' or 'S' per layer.")
      .def_property_readonly("layer_count", &model::Setting::layer_count, "L, the number of layers.")
      .def_readonly("pool_pages", &model::Setting::pool_pages, "Logical pages of the owner-sharded pool.")
      .def_property_readonly("split", [](const model::Setting& s) { return std::string(model::to_string(s.split)); }, "The split policy's name.")
      .def_property_readonly("max_total_extend_tokens", [](const model::Setting& s) { return s.caps.max_total_extend_tokens; }, "Admission cap (tokens) or None.")
      .def_property_readonly("max_batch_requests", [](const model::Setting& s) { return s.caps.max_batch_requests; }, "Admission cap (requests) or None.")
      .def_property_readonly("staging_mib", [](const model::Setting& s) { return s.caps.staging_mib_override; }, "Staging size override (MiB) or None.")
      .def("layer_is_full", [](const model::Setting& s, std::int32_t layer) { return s.layer_is_full(require_layer(s, layer)); }, py::arg("layer"),
           "True if the layer runs the indexer ('F').")
      .def("kind_active", [](const model::Setting& s, const py::object& kind, std::int32_t layer) {
             return s.kind_active(require_kind(s, kind), require_layer(s, layer));
           }, py::arg("kind"), py::arg("layer"), "True if the buffer kind (index or name) exists on the layer.")
      .def("row_bytes_all_kinds", &model::Setting::row_bytes_all_kinds, "Sum of row bytes over all kinds (the staging geometry).")
      .def("row_bytes_on_layer", [](const model::Setting& s, std::int32_t layer) { return s.row_bytes_on_layer(require_layer(s, layer)); },
           py::arg("layer"), "Sum of row bytes over the kinds active on the layer.")
      .def("pool_pages_per_rank", &model::Setting::pool_pages_per_rank, "Pages each rank's pool slab holds.")
      .def("__repr__", &setting_repr)
      .def("__eq__", &same_setting, py::is_operator())
      // Pickled as its constructor's arguments, so that spawned ranks (torch.multiprocessing) receive it
      // and the unpickled setting is validated again by the same constructor.
      .def(py::pickle([](const model::Setting& s) {
        return py::make_tuple(s.cp, s.page_size, kind_names(s), s.layer_pattern, s.pool_pages, std::string(model::to_string(s.split)),
                              s.caps.max_total_extend_tokens, s.caps.max_batch_requests, s.caps.staging_mib_override);
      }, [](const py::tuple& t) {
        if (t.size() != 9) throw InputError("pickle", fmt::format("a Setting pickles as 9 values, got {}", t.size()));
        return make_setting(t[0].cast<std::int32_t>(), t[1].cast<std::int32_t>(), t[2].cast<std::vector<std::string>>(), t[3].cast<std::string>(),
                            t[4].cast<std::int64_t>(), t[5].cast<std::string>(), t[6].cast<std::optional<std::int64_t>>(),
                            t[7].cast<std::optional<std::int64_t>>(), t[8].cast<std::optional<std::int64_t>>());
      }));
}

bool same_request(const model::Request& a, const model::Request& b) {
  return a.prefix_len == b.prefix_len && a.extend_len == b.extend_len && a.prefix_pages == b.prefix_pages;
}

void bind_batch(py::module_& m) {
  py::class_<model::Request>(m, "Request", "One request of a batch: a cached prefix (whole pages, by logical page id) and tokens computed now.")
      .def(py::init([](std::int64_t prefix_len, std::int64_t extend_len, std::vector<std::int64_t> prefix_pages) {
             return model::Request{prefix_len, extend_len, std::move(prefix_pages)};
           }),
           py::arg("prefix_len"), py::arg("extend_len"), py::arg("prefix_pages") = std::vector<std::int64_t>{},
           "prefix_len: cached tokens (a multiple of P); extend_len: tokens computed in this batch (>= 1); prefix_pages: "
           "prefix_len / P logical page ids (any sequence of ints, a NumPy array too). Checked against a setting by validate().")
      .def_readwrite("prefix_len", &model::Request::prefix_len, "Cached prefix tokens, a multiple of P.")
      .def_readwrite("extend_len", &model::Request::extend_len, "Tokens computed in this batch, >= 1.")
      .def_readwrite("prefix_pages", &model::Request::prefix_pages, "Logical page ids of the prefix, prefix_len / P of them.")
      .def("__eq__", &same_request, py::is_operator())
      .def("__repr__", [](const model::Request& r) {
        return fmt::format("Request(prefix_len={}, extend_len={}, prefix_pages=[{}])", r.prefix_len, r.extend_len, fmt::join(r.prefix_pages, ", "));
      })
      .def(py::pickle([](const model::Request& r) { return py::make_tuple(r.prefix_len, r.extend_len, r.prefix_pages); },
                      [](const py::tuple& t) {
                        if (t.size() != 3) throw InputError("pickle", fmt::format("a Request pickles as 3 values, got {}", t.size()));
                        return model::Request{t[0].cast<std::int64_t>(), t[1].cast<std::int64_t>(), t[2].cast<std::vector<std::int64_t>>()};
                      }));

  py::class_<model::Batch>(m, "Batch", "One scheduled prefill batch: its requests in batch order.")
      .def(py::init([](std::vector<model::Request> requests) { return model::Batch{std::move(requests)}; }), py::arg("requests"),
           "A batch of the given requests.")
      .def_static("from_lists", &batch_from_lists, py::arg("prefix_lens"), py::arg("extend_lens"), py::arg("prefix_pages"),
                  "A batch from per-request columns, as a scheduler holds them: prefix lengths, extend lengths, and each "
                  "request's prefix page ids.")
      .def_readwrite("requests", &model::Batch::requests, "The requests, in batch order.")
      .def("__len__", [](const model::Batch& b) { return b.requests.size(); })
      .def("__eq__", [](const model::Batch& a, const model::Batch& b) {
        return a.requests.size() == b.requests.size() && std::equal(a.requests.begin(), a.requests.end(), b.requests.begin(), &same_request);
      }, py::is_operator())
      // The repr is the constructor call that rebuilds the batch (a Hypothesis falsifying example
      // printed with it can be pasted back), not a summary.
      .def("__repr__", [](const model::Batch& b) {
        std::vector<std::string> requests;
        for (const model::Request& r : b.requests) {
          requests.push_back(fmt::format("Request(prefix_len={}, extend_len={}, prefix_pages=[{}])", r.prefix_len, r.extend_len, fmt::join(r.prefix_pages, ", ")));
        }
        return fmt::format("Batch([{}])", fmt::join(requests, ", "));
      })
      .def(py::pickle([](const model::Batch& b) { return py::make_tuple(b.requests); },
                      [](const py::tuple& t) {
                        if (t.size() != 1) throw InputError("pickle", fmt::format("a Batch pickles as 1 value, got {}", t.size()));
                        return model::Batch{t[0].cast<std::vector<model::Request>>()};
                      }));
  py::implicitly_convertible<py::list, model::Batch>();

  m.def("validate", [](const model::Setting& s, const model::Batch& b) { require_valid(s, b); }, py::arg("setting"), py::arg("batch"),
        "Raise cpkv.InputError (field and reason, as the trace reader names them) if the batch is not valid for the setting.");
}

}  // namespace

model::Batch batch_from_lists(const std::vector<std::int64_t>& prefix_lens, const std::vector<std::int64_t>& extend_lens,
                              const std::vector<std::vector<std::int64_t>>& prefix_pages) {
  if (extend_lens.size() != prefix_lens.size()) {
    throw InputError("extend_lens", fmt::format("{} values for {} prefix_lens", extend_lens.size(), prefix_lens.size()));
  }
  if (prefix_pages.size() != prefix_lens.size()) {
    throw InputError("prefix_pages", fmt::format("{} page lists for {} prefix_lens", prefix_pages.size(), prefix_lens.size()));
  }
  model::Batch batch;
  for (std::size_t r = 0; r < prefix_lens.size(); ++r) batch.requests.push_back({prefix_lens[r], extend_lens[r], prefix_pages[r]});
  return batch;
}

void bind_layout(py::module_& m);
void bind_plans(py::module_& m);

void bind_model(py::module_& m) {
  bind_setting(m);
  bind_batch(m);
  bind_layout(m);
  bind_plans(m);
  py::list variants;
  for (model::Variant v : model::kAllVariants) variants.append(std::string(model::to_string(v)));
  m.attr("VARIANTS") = py::tuple(variants);
  // Section 12's token-split all-gather variants (model::splits_tokens): their plan is token_split_plan's.
  py::list token_split_variants;
  for (model::Variant v : model::kAllVariants) {
    if (model::splits_tokens(v)) token_split_variants.append(std::string(model::to_string(v)));
  }
  m.attr("TOKEN_SPLIT_VARIANTS") = py::tuple(token_split_variants);
  m.attr("SPLIT_POLICIES") = py::make_tuple(std::string(model::to_string(model::SplitPolicy::zigzag)),
                                            std::string(model::to_string(model::SplitPolicy::contiguous)),
                                            std::string(model::to_string(model::SplitPolicy::round_robin)),
                                            std::string(model::to_string(model::SplitPolicy::zigzag_tokens)),
                                            std::string(model::to_string(model::SplitPolicy::continuous_tokens)));
  py::dict kinds;
  for (const model::BufferKind& k : model::kBufferKinds) kinds[py::str(std::string(k.name))] = k;
  m.attr("BUFFER_KINDS") = kinds;
}

}  // namespace cpkv::python

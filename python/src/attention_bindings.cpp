// Bindings of what attention reads (model/include/cpkv/model/attention.hpp, PROTOCOL.md section 11):
// the neutral segment (cpkv.RaggedSegment), the query splits, the plain oracle of a rank's plan and
// the located checker of invariant 9. A plan comes in as a list of RaggedSegment or as an (n, 5)
// int64 array of [request, q_base, q_len, kv_len, k_base] rows (an engine's tensor, via NumPy).
#include <fmt/format.h>
#include <pybind11/operators.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "cpkv/model/attention.hpp"

namespace cpkv::python {
namespace {

constexpr py::ssize_t kSegmentColumns = 5;

model::QuerySplit require_split(const py::object& split) {
  if (py::isinstance<model::QuerySplit>(split)) return split.cast<model::QuerySplit>();
  if (!py::isinstance<py::str>(split)) {
    throw py::type_error(fmt::format("split: expected a str or a cpkv.QuerySplit, not {}", Py_TYPE(split.ptr())->tp_name));
  }
  const auto name = split.cast<std::string>();
  const auto parsed = model::parse_query_split(name);
  if (!parsed) throw InputError("split", fmt::format("unknown query split '{}' (known: pages, zigzag_tokens, continuous_tokens)", name));
  return *parsed;
}

// Rows of an (n, 5) integer array as segments; InputError naming `field` for any other shape.
std::vector<model::AttentionSegment> segments_from_array(const py::array& array, const std::string& field) {
  if (array.ndim() != 2 || array.shape(1) != kSegmentColumns) {
    std::vector<py::ssize_t> shape(array.shape(), array.shape() + array.ndim());
    throw InputError(field, fmt::format("an array of shape ({}), expected (n, 5): request, q_base, q_len, kv_len, k_base",
                                        fmt::join(shape, ", ")));
  }
  if (array.dtype().kind() != 'i' && array.dtype().kind() != 'u') {
    throw InputError(field, fmt::format("dtype {}, expected an integer array (int64)", py::str(array.dtype()).cast<std::string>()));
  }
  const auto rows = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>::ensure(array);
  auto view = rows.unchecked<2>();
  std::vector<model::AttentionSegment> out(static_cast<std::size_t>(view.shape(0)));
  for (py::ssize_t i = 0; i < view.shape(0); ++i) out[i] = {view(i, 0), view(i, 1), view(i, 2), view(i, 3), view(i, 4)};
  return out;
}

// A plan as the checker takes it: a list (or tuple) of RaggedSegment, or an (n, 5) integer array.
std::vector<model::AttentionSegment> require_segments(const py::object& value, const std::string& field) {
  if (py::isinstance<py::array>(value)) return segments_from_array(value.cast<py::array>(), field);
  if (!py::isinstance<py::list>(value) && !py::isinstance<py::tuple>(value)) {
    throw py::type_error(fmt::format("{}: expected a list of cpkv.RaggedSegment or an (n, 5) int64 array, not {}", field,
                                     Py_TYPE(value.ptr())->tp_name));
  }
  std::vector<model::AttentionSegment> out;
  std::size_t index = 0;
  for (const py::handle item : value) {
    if (py::isinstance<model::AttentionSegment>(item)) {
      out.push_back(item.cast<model::AttentionSegment>());
    } else if (py::isinstance<py::sequence>(item) && !py::isinstance<py::str>(item) && py::len(item) == kSegmentColumns) {
      const auto n = item.cast<std::vector<std::int64_t>>();  // five integers: request, q_base, q_len, kv_len, k_base
      out.push_back({n[0], n[1], n[2], n[3], n[4]});
    } else {
      throw InputError(field, fmt::format("item {} is a {}, not a cpkv.RaggedSegment nor 5 integers", index, Py_TYPE(item.ptr())->tp_name));
    }
    ++index;
  }
  return out;
}

py::array_t<std::int64_t> segments_to_numpy(const std::vector<model::AttentionSegment>& segments) {
  std::vector<std::int64_t> flat;
  flat.reserve(segments.size() * kSegmentColumns);
  for (const model::AttentionSegment& s : segments) flat.insert(flat.end(), {s.request, s.q_base, s.q_len, s.kv_len, s.k_base});
  return to_numpy(std::move(flat), {static_cast<py::ssize_t>(segments.size()), kSegmentColumns});
}

std::string segment_repr(const model::AttentionSegment& s) {
  return fmt::format("RaggedSegment(request={}, q_base={}, q_len={}, kv_len={}, k_base={})", s.request, s.q_base, s.q_len, s.kv_len, s.k_base);
}

void bind_segment(py::module_& m) {
  py::class_<model::AttentionSegment>(m, "RaggedSegment",
                                      "One segment of a rank's attention plan (PROTOCOL.md section 11): the queries are the current tokens "
                                      "q_base .. q_base + q_len - 1 of `request` (offsets within its extend), in the rank's query order; the "
                                      "last sees kv_len keys (prefix_len + q_base + q_len); key j of the request is dense row k_base + j.")
      .def(py::init([](std::int64_t request, std::int64_t q_base, std::int64_t q_len, std::int64_t kv_len, std::int64_t k_base) {
             return model::AttentionSegment{request, q_base, q_len, kv_len, k_base};
           }),
           py::arg("request"), py::arg("q_base"), py::arg("q_len"), py::arg("kv_len"), py::arg("k_base"),
           "A segment from its five numbers (checked by check_attention_plan, not here: a wrong plan must be expressible).")
      .def_readwrite("request", &model::AttentionSegment::request, "The request (index in the batch).")
      .def_readwrite("q_base", &model::AttentionSegment::q_base, "Offset of the first query token within the request's extend.")
      .def_readwrite("q_len", &model::AttentionSegment::q_len, "Query tokens in the segment.")
      .def_readwrite("kv_len", &model::AttentionSegment::kv_len, "Keys visible to its last query: prefix_len + q_base + q_len.")
      .def_readwrite("k_base", &model::AttentionSegment::k_base, "Dense row of the request's key 0 (its first prefix row, else its first current row).")
      .def("as_tuple", [](const model::AttentionSegment& s) { return py::make_tuple(s.request, s.q_base, s.q_len, s.kv_len, s.k_base); },
           "(request, q_base, q_len, kv_len, k_base), one row of the (n, 5) form.")
      .def(py::self == py::self)  // NOLINT(misc-redundant-expression): pybind11's operator binding
      .def("__repr__", &segment_repr)
      .def(py::pickle([](const model::AttentionSegment& s) { return py::make_tuple(s.request, s.q_base, s.q_len, s.kv_len, s.k_base); },
                      [](const py::tuple& t) {
                        if (t.size() != 5) throw InputError("pickle", fmt::format("a RaggedSegment pickles as 5 values, got {}", t.size()));
                        return model::AttentionSegment{t[0].cast<std::int64_t>(), t[1].cast<std::int64_t>(), t[2].cast<std::int64_t>(),
                                                       t[3].cast<std::int64_t>(), t[4].cast<std::int64_t>()};
                      }));
  py::enum_<model::QuerySplit>(m, "QuerySplit",
                               "How a rank's queries are chosen: cpkv's page-aligned split (section 2, the setting's policy) or a token "
                               "split of section 12 (zigzag over 2*cp token blocks per request; continuous: token t to rank t % cp).")
      .value("pages", model::QuerySplit::pages)
      .value("zigzag_tokens", model::QuerySplit::zigzag_tokens)
      .value("continuous_tokens", model::QuerySplit::continuous_tokens);
  // pybind11 gives the enum's `value` property no docstring; every public name of the package has one.
  m.attr("QuerySplit").attr("value").attr("__doc__") = "The split's number (0 pages, 1 zigzag_tokens, 2 continuous_tokens).";
  m.attr("QUERY_SPLITS") = py::make_tuple("pages", "zigzag_tokens", "continuous_tokens");
}

void bind_finding(py::module_& m) {
  py::class_<model::AttentionFinding>(m, "AttentionFinding",
                                      "The first wrong thing in an attention plan (invariant 9): the segment, the request and tokens it "
                                      "names, the field, what section 11 expects and what the plan holds, and the likely cause.")
      .def_readonly("segment", &model::AttentionFinding::segment, "Index of the wrong segment in the plan (-1: the plan as a whole).")
      .def_readonly("request", &model::AttentionFinding::request, "The request named (-1: none).")
      .def_readonly("token_first", &model::AttentionFinding::token_first, "First extend offset named (inclusive; -1: none).")
      .def_readonly("token_last", &model::AttentionFinding::token_last, "Last extend offset named (inclusive; -1: none).")
      .def_readonly("field", &model::AttentionFinding::field, "request, q_base, q_len, queries, kv_len, k_base or coverage.")
      .def_readonly("expected", &model::AttentionFinding::expected, "What the specification expects of the field.")
      .def_readonly("got", &model::AttentionFinding::got, "What the plan holds.")
      .def_readonly("what", &model::AttentionFinding::what, "The finding, in words.")
      .def_readonly("why", &model::AttentionFinding::why, "The likely cause, or empty.")
      .def("describe", &model::AttentionFinding::describe, py::arg("rank"), py::arg("batch"),
           "'invariant 9 (attention plan exactness): rank R batch B: segment S (request r tokens a..b): ...'")
      .def("detail", &model::AttentionFinding::detail, "The line without its 'invariant 9 (...): rank R batch B: ' head.")
      .def("__repr__", [](const model::AttentionFinding& f) -> std::string { return fmt::format("<AttentionFinding: {}>", f.detail()); });
}

void bind_oracle(py::module_& m) {
  m.def("rank_queries", [](const model::Setting& s, const model::Batch& b, std::int32_t rank, const py::object& split) {
    require_valid(s, b);
    const auto queries = model::rank_queries(s, b, require_rank(rank, s.cp), require_split(split));
    std::vector<std::int64_t> flat;
    flat.reserve(queries.size() * 2);
    for (const model::QueryToken& q : queries) flat.insert(flat.end(), {q.request, q.token});
    return to_numpy(std::move(flat), {static_cast<py::ssize_t>(queries.size()), 2});
  }, py::arg("setting"), py::arg("batch"), py::arg("rank"), py::arg("split") = "pages",
        "The tokens a rank computes, in its query order: (n, 2) int64 [request, token] (token: offset within the request's extend).");
  m.def("request_key_base", [](const model::Setting& s, const model::Batch& b) {
    require_valid(s, b);
    return to_numpy(model::request_key_base(s.page_size, b));
  }, py::arg("setting"), py::arg("batch"), "int64 per request: the dense row of its key 0 (section 3's merged-span order).");
  m.def("expected_attention_plan", [](const model::Setting& s, const model::Batch& b, std::int32_t rank, const py::object& split) {
    require_valid(s, b);
    return model::expected_attention_plan(s, b, require_rank(rank, s.cp), require_split(split));
  }, py::arg("setting"), py::arg("batch"), py::arg("rank"), py::arg("split") = "pages",
        "The plan a rank must hold (the plain oracle of section 11): one RaggedSegment per maximal run of consecutive tokens of one request.");
  m.def("attention_plan_array", &segments_to_numpy, py::arg("segments"), "A list of RaggedSegment as the (n, 5) int64 form.");
  m.def("attention_plan_segments", [](const py::object& plan) { return require_segments(plan, "segments"); }, py::arg("plan"),
        "An (n, 5) integer array (or a list of RaggedSegment) as a list of RaggedSegment; InputError for another shape.");
}

void bind_checks(py::module_& m) {
  m.def("check_attention_plan", [](const model::Setting& s, const model::Batch& b, std::int32_t rank, const py::object& segments,
                                   const py::object& split) -> std::optional<model::AttentionFinding> {
    require_valid(s, b);
    const auto plan = require_segments(segments, "segments");
    return model::check_attention_plan(s, b, require_rank(rank, s.cp), plan, require_split(split));
  }, py::arg("setting"), py::arg("batch"), py::arg("rank"), py::arg("segments"), py::arg("split") = "pages",
        "Invariant 9 on one rank: None, or the first wrong segment as an AttentionFinding (the queries must be the split's tokens of the "
        "rank in its query order; every kv_len and k_base section 11's).");
  m.def("check_attention_coverage", [](const model::Batch& b, const py::object& per_rank) -> py::object {
    std::vector<std::vector<model::AttentionSegment>> plans;
    std::size_t rank = 0;
    for (const py::handle plan : per_rank) plans.push_back(require_segments(py::reinterpret_borrow<py::object>(plan), fmt::format("per_rank[{}]", rank++)));
    std::int32_t first = 0;
    const auto found = model::check_attention_coverage(b, plans, &first);
    if (!found) return py::none();
    return py::make_tuple(*found, first);
  }, py::arg("batch"), py::arg("per_rank"),
        "Invariant 9 over the group: None, or (AttentionFinding, rank) for the first current token that is a query on no rank or on two "
        "('token 7 of request 1 is a query on ranks 0 and 1'; rank: the first named).");
}

}  // namespace

void bind_attention(py::module_& m) {
  bind_segment(m);
  bind_finding(m);
  bind_oracle(m);
  bind_checks(m);
}

}  // namespace cpkv::python

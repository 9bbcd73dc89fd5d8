// `cpkv bench --markdown`: the rows and ceilings of a bench run as markdown tables. The timing
// columns and the ceilings line come from gpu/bench_timings.hpp's tables; only the figures derived
// from several timings or from the model are named here. No CUDA: a CPU test renders a hand-made
// result (tests/bench_markdown_test.cpp).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "cpkv/model/costs.hpp"

namespace cpkv::cuda {

// `rows`: the "rows" array of `cpkv bench --json`; `layer_count`: the model's layers (ms per batch).
std::string bench_markdown(const nlohmann::json& rows, const model::MeasuredCeilings& ceilings, std::int32_t layer_count);

}  // namespace cpkv::cuda

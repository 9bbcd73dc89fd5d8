// The JSON an exchange plugin sees (include/cpkv/exchange_abi.h: ctx->setting_json, batch->json):
// the trace format's own header and batch lines (traces/README.md), written and read here so the
// GPU backend hands them over without reading traces/ itself. A plugin built by cpkv (the fused
// one) reads the setting back through the same trace reader every trace goes through.
#pragma once

#include <cstdint>
#include <string>

#include "cpkv/model/batch.hpp"
#include "cpkv/model/setting.hpp"

namespace cpkv::harness {

// The trace header line of `setting` (no source), as ctx->setting_json carries it.
std::string plugin_setting_json(const model::Setting& setting);
// The trace line of batch `batch_index`, as cpkv_batch::json carries it.
std::string plugin_batch_json(const model::Batch& batch, std::int64_t batch_index);
// The setting back from plugin_setting_json's text, checked as a trace header is; throws
// traces::TraceError naming `where` when the text is no valid header.
model::Setting plugin_setting_from_json(const std::string& json, const std::string& where);

}  // namespace cpkv::harness

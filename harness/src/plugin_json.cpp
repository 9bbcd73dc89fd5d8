#include "cpkv/harness/plugin_json.hpp"

#include <memory>
#include <sstream>
#include <utility>

#include "cpkv/traces/trace.hpp"

namespace cpkv::harness {

std::string plugin_setting_json(const model::Setting& setting) {
  return traces::header_to_json(traces::TraceHeader{setting, nlohmann::json::object()}).dump();
}

std::string plugin_batch_json(const model::Batch& batch, std::int64_t batch_index) {
  return traces::batch_to_json(batch, batch_index).dump();
}

model::Setting plugin_setting_from_json(const std::string& json, const std::string& where) {
  auto in = std::make_unique<std::istringstream>(json + "\n");
  traces::TraceReader reader(std::move(in), where);
  return reader.header().setting;
}

}  // namespace cpkv::harness

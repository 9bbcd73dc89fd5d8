// The JSON an exchange plugin is handed (include/cpkv/exchange_abi.h: ctx->setting_json is the
// trace header of the run's setting, batch->json the batch's trace line; traces/README.md) is
// written and read back by the harness, so the GPU backend passes it on without reading traces/.
// A plugin that parses it (cpkv's own fused one) must get the run's setting back field for field,
// and a text that is no header must be refused naming where it came from.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cpkv/harness/plugin_json.hpp"
#include "cpkv/traces/trace.hpp"
#include "model_tiny_batch.hpp"

namespace cpkv {
namespace {

TEST(PluginJson, TheSettingAPluginReadsBackIsTheRunsSetting) {
  model::Setting setting = model::testing::tiny_setting();
  setting.caps.max_total_extend_tokens = 16;
  setting.caps.max_batch_requests = 2;
  const model::Setting back = harness::plugin_setting_from_json(harness::plugin_setting_json(setting), "ctx->setting_json");
  EXPECT_EQ(back.cp, 2);
  EXPECT_EQ(back.page_size, 4);
  ASSERT_EQ(back.kinds.size(), 2u);
  EXPECT_EQ(back.kinds[0].name, "kv_fp8");
  EXPECT_EQ(back.kinds[0].row_bytes, 656u);
  EXPECT_EQ(back.kinds[1].name, "indexer_k");
  EXPECT_EQ(back.kinds[1].row_bytes, 132u);
  EXPECT_EQ(back.layer_pattern, "FS");
  EXPECT_EQ(back.pool_pages, 16);
  EXPECT_EQ(back.split, model::SplitPolicy::zigzag);
  EXPECT_EQ(back.caps.max_total_extend_tokens, 16);
  EXPECT_EQ(back.caps.max_batch_requests, 2);
}

TEST(PluginJson, TheTextsAreTheTraceFormatsHeaderAndBatchLine) {
  const nlohmann::json header = nlohmann::json::parse(harness::plugin_setting_json(model::testing::tiny_setting()));
  EXPECT_EQ(header.at("format"), "cpkv-batch-trace");
  EXPECT_EQ(header.at("version"), 1);
  const nlohmann::json line = nlohmann::json::parse(harness::plugin_batch_json(model::testing::tiny_batch(), 3));
  EXPECT_EQ(line.at("batch"), 3);
  ASSERT_EQ(line.at("requests").size(), 2u);
  EXPECT_EQ(line.at("requests")[0].at("prefix_len"), 8);
  EXPECT_EQ(line.at("requests")[0].at("extend_len"), 6);
  EXPECT_EQ(line.at("requests")[0].at("prefix_pages"), nlohmann::json::array({5, 2}));
  EXPECT_EQ(line.at("requests")[1].at("extend_len"), 9);
}

TEST(PluginJson, ATextThatIsNoHeaderIsRefusedNamingWhereItCameFrom) {
  try {
    harness::plugin_setting_from_json(R"({"format":"cpkv-batch-trace","version":1})", "ctx->setting_json");
    FAIL() << "a header without cp, page size or kinds was read as a setting";
  } catch (const traces::TraceError& e) {
    EXPECT_EQ(e.file(), "ctx->setting_json");
  }
}

}  // namespace
}  // namespace cpkv

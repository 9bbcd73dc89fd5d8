// A backend's registry entry declares how many ranks it runs (BackendEntry::ranks_max): a source of
// larger cp is refused before any rank starts, in one line naming the backend and its cap (the cuda
// backend's per-rank bootstrap arrays hold one node's GPUs; the launcher's records, the model's cp).
#include <gtest/gtest.h>

#include "cpkv/harness/launch.hpp"
#include "cpkv/harness/request.hpp"
#include "cpkv/model/limits.hpp"

namespace cpkv::harness {
namespace {

BatchSource two_rank_source() {
  model::Setting setting;
  setting.cp = 2;
  setting.page_size = 4;
  setting.kinds = {*model::find_buffer_kind("kv_fp8")};
  setting.layer_pattern = "SS";
  setting.pool_pages = 16;
  model::Batch batch;
  batch.requests.push_back(model::Request{.prefix_len = 4, .extend_len = 6, .prefix_pages = {3}});
  return BatchSource::from_batches(setting, {batch});
}

Registry registry_with(std::int32_t ranks_max) {
  Registry registry;
  BackendEntry entry;
  entry.name = "capped";
  entry.summary = "a backend of a few ranks";
  entry.ranks_max = ranks_max;
  // Never called: the cap is checked before any backend is made.
  entry.replay = [](const CheckedRequest&, const BatchSource&, const ScannedSource&, const ProgressFunction&) -> std::unique_ptr<Backend> { return nullptr; };
  registry.add(std::move(entry));
  return registry;
}

TEST(HarnessRegistry, ASourceOfMoreRanksThanTheBackendsCapIsRefusedNamingTheCap) {
  ReplayRequest request;
  request.trace_label = "two.jsonl";
  request.backend = "capped";
  const Registry capped = registry_with(1);
  const CheckedRequest checked = check_request(request, capped);
  try {
    check_source(checked, two_rank_source());
    FAIL() << "a cp 2 source passed a backend capped at 1 rank";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.cli_message(), "--backend: capped: cp 2 of two.jsonl exceeds this backend's cap of 1 ranks");
  }
  const Registry roomy = registry_with(2);
  EXPECT_NO_THROW(check_source(check_request(request, roomy), two_rank_source()));
}

TEST(HarnessRegistry, TheLaunchersRankLimitIsTheModelsAndAnEntrysDefaultCap) {
  static_assert(kRanksMax == model::limits::cp_max);
  EXPECT_EQ(BackendEntry{}.ranks_max, model::limits::cp_max);
}

}  // namespace
}  // namespace cpkv::harness

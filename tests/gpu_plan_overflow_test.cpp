// The GPU backend's overflow verdict (gpu/device_plan.cpp), checked on the host without a GPU.
// PROTOCOL.md section 4: overflow is current_pages_total > staging_slots, decided from batch-logical
// values only, so every rank reaches the same verdict. A verdict from this rank's own pages (the
// rank-local overflow bug) lets some ranks write staging and wait at a barrier that a rejecting peer
// never reaches; the CPU suite builds this plan code wherever the CUDA backend builds.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "device_plan.hpp"

namespace cpkv {
namespace {

// cp 2, P 4, one layer of kv_fp8, a pool of 8 pages.
model::Setting two_ranks() {
  model::Setting s;
  s.cp = 2;
  s.page_size = 4;
  s.kinds = {*model::find_buffer_kind("kv_fp8")};
  s.layer_pattern = "F";
  s.pool_pages = 8;
  return s;
}

// One request of 5 current pages (20 tokens): zigzag blocks of 2, 1, 1, 1 pages give rank 0 three
// pages and rank 1 two. Against 4 staging slots the batch overflows (5 > 4) though each rank's own
// pages fit (3 and 2), and rank 1's own pages times cp (4) do too: every rank must say overflow,
// for every variant, and claim no pool page. Against 5 slots every rank must say ok (5 > 5 is false).
TEST(GpuPlanOverflow, EveryRankJudgesTheBatchNotItsOwnPages) {
  const model::Setting setting = two_ranks();
  model::Batch batch;
  batch.requests.push_back(model::Request{.prefix_len = 4, .extend_len = 20, .prefix_pages = {3}});
  for (model::Variant variant : model::kAllVariants) {
    for (std::int32_t rank = 0; rank < setting.cp; ++rank) {
      const std::string where = std::string(model::to_string(variant)) + " rank " + std::to_string(rank);
      std::vector<bool> populated(static_cast<std::size_t>(setting.pool_pages_per_rank()), false);
      const cuda::BatchPlan rejected = cuda::build_batch_plan(setting, batch, variant, rank, /*staging_slots=*/4, populated);
      if (model::splits_tokens(variant)) {  // section 12: no staging, so no overflow, whatever the slots
        EXPECT_FALSE(rejected.overflow) << where;
        continue;
      }
      EXPECT_TRUE(rejected.overflow) << where;
      EXPECT_EQ(populated, std::vector<bool>(populated.size(), false)) << where << ": a rejected batch claims pool pages";
      const cuda::BatchPlan admitted = cuda::build_batch_plan(setting, batch, variant, rank, /*staging_slots=*/5, populated);
      EXPECT_FALSE(admitted.overflow) << where;
    }
  }
}

}  // namespace
}  // namespace cpkv

// The figure a plugin's reported peer bytes are checked against (gpu/plugin_guards.hpp:
// model_peer_gather_bytes: model::layer_bytes of the variant's plan, without the ring all-reduce's
// receive volume), checked without a GPU: it equals what the model's own batch matrix
// (model::batch_bytes_pulled) says less that volume, and what cpkv's own exchange counts (the
// gather entries of gpu/device_plan.cpp it launches, which the fused plugin reports through
// ctx->counters), for every variant, rank and batch of the bundled traces; so a correct plugin is
// never flagged, and the check stands on the model, not on the code it checks.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cpkv/harness/source.hpp"
#include "cpkv/model/staging.hpp"
#include "device_plan.hpp"
#include "plugin_guards.hpp"

namespace cpkv {
namespace {

// What the fused plugin counts: each gather entry that reads a peer's memory, one page of every
// kind active on the layer, and for section 12's variants the peers' rows each all-gather brings.
std::uint64_t counted_by_cpkv(const model::Setting& setting, const cuda::BatchPlan& b, std::int32_t rank, std::int32_t layers) {
  const std::uint64_t pages = cuda::peer_pages_per_kind(b, setting.cp, rank);
  const std::uint64_t rows = pages * setting.page_size + cuda::peer_rows_all_gathered(b, setting.cp);
  std::uint64_t sum = 0;
  for (std::int32_t l = 0; l < layers; ++l) {
    for (std::size_t k = 0; k < setting.kinds.size(); ++k) sum += setting.kind_active(k, l) ? rows * setting.kinds[k].row_bytes : 0;
  }
  return sum;
}

// The model's matrix of the batch over every layer of the setting (model::batch_bytes_pulled: what
// `cpkv plan` reports), this rank's row less its own memory and less the ring all-reduce's receive
// volume, which the matrix adds to the ring predecessor's entry.
std::uint64_t from_the_matrix(const model::Setting& setting, const model::BatchLayout& layout, model::Variant variant, std::int32_t rank) {
  const std::vector<std::vector<std::uint64_t>> matrix = model::batch_bytes_pulled(setting, layout, variant);
  const model::VariantPlan plan = model::variant_plan(layout, variant, rank);
  std::uint64_t sum = 0;
  for (std::int32_t p = 0; p < setting.cp; ++p) sum += p == rank ? 0 : matrix[rank][p];
  for (std::int32_t l = 0; l < setting.layer_count() && setting.cp > 1; ++l) {
    sum -= 2 * static_cast<std::uint64_t>(setting.cp - 1) * model::layer_bytes(setting, plan, l).allreduce_bytes / setting.cp;
  }
  return sum;
}

TEST(GpuCounters, TheModelsPeerGatherBytesAreWhatCpkvsOwnExchangeCountsForEveryVariantRankAndBatch) {
  std::int64_t checked = 0, nonzero = 0;
  for (const char* name : {"tiny.jsonl", "seeds_batch.jsonl", "mooncake_slice.jsonl"}) {
    const harness::BatchSource source = harness::BatchSource::from_trace(std::string(CPKV_SOURCE_DIR) + "/traces/samples/" + name);
    const model::Setting& setting = source.setting;
    const std::int64_t staging_slots = model::staging_capacity(setting).staging_slots;
    for (model::Variant variant : model::kAllVariants) {
      for (std::int32_t rank = 0; rank < setting.cp; ++rank) {
        std::vector<bool> populated(setting.pool_pages_per_rank(), false);
        harness::BatchCursor cursor(source);
        while (std::optional<model::Batch> batch = cursor.next()) {
          const cuda::BatchPlan b = cuda::build_batch_plan(setting, *batch, variant, rank, staging_slots, populated);
          if (b.overflow) continue;
          const std::string where = fmt::format("{} {} rank {} batch {}", name, model::to_string(variant), rank, cursor.index());
          const std::int32_t layers = setting.layer_count();
          const std::uint64_t model = cuda::model_peer_gather_bytes(setting, b.layout, variant, rank, layers);
          EXPECT_EQ(model, from_the_matrix(setting, b.layout, variant, rank)) << where;
          EXPECT_EQ(model, counted_by_cpkv(setting, b, rank, layers)) << where << ": cpkv's own exchange counts another figure";
          ++checked;
          nonzero += model > 0 ? 1 : 0;
          if (HasFailure()) return;
        }
      }
    }
  }
  EXPECT_GT(checked, 100);
  EXPECT_GT(nonzero, checked / 2) << "most batches gather from peers";
}

}  // namespace
}  // namespace cpkv

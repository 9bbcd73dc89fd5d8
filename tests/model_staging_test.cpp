// Staging capacity, the overflow verdict and the arena carve (PROTOCOL.md section 4). The staging
// region is registered once and never grows, so its size must follow from the caps alone; the
// overflow verdict must use batch-logical values only so every rank reaches it; and the carve must
// put every object at the same offset on every rank so peer_base + offset needs no handshake.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cpkv/model/staging.hpp"
#include "model_tiny_batch.hpp"

namespace cpkv::model {
namespace {

using testing::tiny_setting;

TEST(ModelStaging, CapacityFromCapsIsCeilExtendTokensOverPageSizePlusRequests) {
  // ceil(15 / 4) = 4 full-page slots, + 2 (each request adds at most one partial page) = 6.
  // Bytes: 2 halves * 6 slots * 4 rows * (656 + 132) = 37824.
  Setting s = tiny_setting();
  s.caps.max_total_extend_tokens = 15;
  s.caps.max_batch_requests = 2;
  const StagingCapacity cap = staging_capacity(s);
  EXPECT_EQ(cap.source, StagingSource::caps);
  EXPECT_EQ(cap.staging_slots, 6);
  EXPECT_EQ(cap.bytes_total, 37824u);
}

TEST(ModelStaging, CapacityFromCapsWithExactMultipleDoesNotRoundUp) {
  // 16 / 4 = 4 exactly, + 3 = 7.
  Setting s = tiny_setting();
  s.caps.max_total_extend_tokens = 16;
  s.caps.max_batch_requests = 3;
  EXPECT_EQ(staging_capacity(s).staging_slots, 7);
}

TEST(ModelStaging, CapacityFallsBackToPoolSizeWithoutCaps) {
  // Every current page is also a pool page, so the pool (16 pages) bounds the current pages.
  Setting s = tiny_setting();
  const StagingCapacity cap = staging_capacity(s);
  EXPECT_EQ(cap.source, StagingSource::pool_fallback);
  EXPECT_EQ(cap.staging_slots, 16);
  EXPECT_EQ(cap.bytes_total, 2u * 16 * 4 * 788);  // 100864
}

TEST(ModelStaging, CapacityNeedsBothCapsElseFallsBackToPool) {
  // The header says both caps are needed: with only one, the caps formula has no value.
  Setting s = tiny_setting();
  s.caps.max_total_extend_tokens = 15;
  EXPECT_EQ(staging_capacity(s).source, StagingSource::pool_fallback);
  EXPECT_EQ(staging_capacity(s).staging_slots, 16);
  s.caps.max_total_extend_tokens.reset();
  s.caps.max_batch_requests = 2;
  EXPECT_EQ(staging_capacity(s).source, StagingSource::pool_fallback);
}

TEST(ModelStaging, MibOverrideWinsOverCapsAndPool) {
  // floor(1 MiB / (2 * 4 * 788)) = floor(1048576 / 6304) = 166; bytes 2*166*4*788 = 1046464.
  Setting s = tiny_setting();
  s.caps.max_total_extend_tokens = 15;
  s.caps.max_batch_requests = 2;
  s.caps.staging_mib_override = 1;
  const StagingCapacity cap = staging_capacity(s);
  EXPECT_EQ(cap.source, StagingSource::mib_override);
  EXPECT_EQ(cap.staging_slots, 166);
  EXPECT_EQ(cap.bytes_total, 1046464u);
  EXPECT_LE(cap.bytes_total, 1u << 20);

  Setting no_caps = tiny_setting();
  no_caps.caps.staging_mib_override = 3;  // floor(3145728 / 6304) = 499
  EXPECT_EQ(staging_capacity(no_caps).source, StagingSource::mib_override);
  EXPECT_EQ(staging_capacity(no_caps).staging_slots, 499);
}

TEST(ModelStaging, CapacityCountsOnlyTheKindsInTheSetting) {
  // kv_bf16 alone at P = 64 with caps 44600 tokens and 12 requests:
  // ceil(44600/64) = 697 (696.875 rounded up) + 12 = 709; bytes 2*709*64*1152 = 104546304.
  Setting s = tiny_setting();
  s.page_size = 64;
  s.kinds = {*find_buffer_kind("kv_bf16")};
  s.caps.max_total_extend_tokens = 44600;
  s.caps.max_batch_requests = 12;
  const StagingCapacity cap = staging_capacity(s);
  EXPECT_EQ(cap.staging_slots, 709);
  EXPECT_EQ(cap.bytes_total, 104546304u);
}

TEST(ModelStaging, OverflowIsStrictlyMorePagesThanSlots) {
  // Section 4: overflow is current_pages_total > staging_slots; a batch that fills staging exactly
  // fits.
  EXPECT_FALSE(overflow_verdict(5, 5).overflow);
  EXPECT_FALSE(overflow_verdict(0, 5).overflow);
  EXPECT_FALSE(overflow_verdict(4, 5).overflow);
  EXPECT_TRUE(overflow_verdict(6, 5).overflow);
  const Verdict v = overflow_verdict(812, 700);
  EXPECT_TRUE(v.overflow);
  EXPECT_EQ(v.current_pages_total, 812);
  EXPECT_EQ(v.staging_slots, 700);
}

TEST(ModelStaging, OverflowDescriptionNamesBothNumbers) {
  // A clear error must let an operator see how far over the batch is.
  const std::string text = overflow_verdict(812, 700).describe();
  EXPECT_EQ(text.rfind("overflow", 0), 0u) << text;
  EXPECT_NE(text.find("812"), std::string::npos) << text;
  EXPECT_NE(text.find("700"), std::string::npos) << text;
  EXPECT_EQ(overflow_verdict(700, 700).describe(), "ok");
}

TEST(ModelStaging, TinyBatchFitsCapsSizedStagingAndOverflowsASmallerOne) {
  // The tiny batch has 5 current pages; caps (15 tokens, 2 requests) give 6 slots.
  Setting s = tiny_setting();
  s.caps.max_total_extend_tokens = 15;
  s.caps.max_batch_requests = 2;
  const BatchLayout layout = layout_batch(s, testing::tiny_batch());
  EXPECT_FALSE(overflow_verdict(layout.current_pages_total, staging_capacity(s).staging_slots).overflow);
  EXPECT_TRUE(overflow_verdict(layout.current_pages_total, 4).overflow);
}

TEST(ModelStaging, ArenaCarvePlacesKindsInsideEachHalfAlignedTo256) {
  // staging_slots 6, P 4: kv_fp8 block 6*4*656 = 15744 B at offset 0; indexer_k (6*4*132 = 3168 B)
  // at the next 256 multiple, 15872 (= 62 * 256). The half ends at 15872 + 3168 = 19040, padded to
  // 19200 (= 75 * 256) so half 1's kinds stay aligned too. Two halves: 38400. Flags follow.
  const ArenaCarve carve = carve_arena(tiny_setting(), 6, 3);
  EXPECT_EQ(carve.staging_slots, 6);
  EXPECT_EQ(carve.page_size, 4);
  EXPECT_EQ(carve.row_bytes, (std::vector<std::uint32_t>{656, 132}));
  ASSERT_EQ(carve.kind_offset_bytes.size(), 2u);
  EXPECT_EQ(carve.kind_offset_bytes[0], 0u);
  EXPECT_EQ(carve.kind_offset_bytes[1], 15872u);
  EXPECT_EQ(carve.half_bytes, 19200u);
  EXPECT_EQ(carve.staging_bytes, 38400u);
  EXPECT_EQ(carve.flags_offset_bytes, 38400u);
  EXPECT_GE(carve.flags_bytes, 3u * 8);
  EXPECT_GE(carve.total_bytes, carve.flags_offset_bytes + carve.flags_bytes);
  EXPECT_EQ(carve.page_bytes(0), 2624u);
  EXPECT_EQ(carve.page_bytes(1), 528u);
  EXPECT_EQ(carve.slot_offset(1, 1, 2), 19200u + 15872u + 2 * 528u);
}

TEST(ModelStaging, ArenaCarveRegionsAreAlignedAndDoNotOverlap) {
  // Peers write into each other's regions by offset: an overlap would let one kind's fill (or a
  // barrier flag) clobber another's slots. Checked over several shapes.
  for (std::int64_t slots : {1, 5, 6, 166, 709}) {
    for (std::int32_t page_size : {1, 4, 64}) {
      Setting s = tiny_setting();
      s.page_size = page_size;
      s.kinds = {*find_buffer_kind("kv_fp8"), *find_buffer_kind("indexer_k"),
                 *find_buffer_kind("kv_bf16")};
      const ArenaCarve carve = carve_arena(s, slots, 4);
      std::vector<std::pair<std::uint64_t, std::uint64_t>> regions;  // [begin, end)
      for (std::int32_t half = 0; half < 2; ++half) {
        for (std::size_t kind = 0; kind < 3; ++kind) {
          const std::uint64_t begin = carve.slot_offset(half, kind, 0);
          EXPECT_EQ(begin % ArenaCarve::alignment_bytes, 0u) << "half " << half << " kind " << kind;
          const std::uint64_t size = static_cast<std::uint64_t>(slots) * carve.page_bytes(kind);
          regions.emplace_back(begin, begin + size);
          EXPECT_LE(begin + size, (half + 1) * carve.half_bytes) << "kind spills out of its half";
        }
      }
      EXPECT_EQ(carve.half_bytes % ArenaCarve::alignment_bytes, 0u);
      EXPECT_EQ(carve.staging_bytes, 2 * carve.half_bytes);
      EXPECT_GE(carve.flags_offset_bytes, carve.staging_bytes);
      EXPECT_EQ(carve.flags_offset_bytes % ArenaCarve::alignment_bytes, 0u);
      EXPECT_GE(carve.flags_bytes, 4u * 8);
      regions.emplace_back(carve.flags_offset_bytes, carve.flags_offset_bytes + carve.flags_bytes);
      EXPECT_GE(carve.total_bytes, carve.flags_offset_bytes + carve.flags_bytes);
      std::sort(regions.begin(), regions.end());
      for (std::size_t i = 1; i < regions.size(); ++i) {
        EXPECT_LE(regions[i - 1].second, regions[i].first)
            << "overlap at slots=" << slots << " P=" << page_size;
      }
    }
  }
}

TEST(ModelStaging, ArenaCarveIsDeterministic) {
  // Every rank carves independently; the offsets must agree without exchanging them.
  const ArenaCarve a = carve_arena(tiny_setting(), 6, 3);
  const ArenaCarve b = carve_arena(tiny_setting(), 6, 3);
  EXPECT_EQ(a.kind_offset_bytes, b.kind_offset_bytes);
  EXPECT_EQ(a.half_bytes, b.half_bytes);
  EXPECT_EQ(a.flags_offset_bytes, b.flags_offset_bytes);
  EXPECT_EQ(a.total_bytes, b.total_bytes);
}

TEST(ModelStaging, LayerUsesParityHalfLayerModTwo) {
  // Section 6: distance-2 reuse of a half is what makes two halves enough.
  EXPECT_EQ(parity_half(0), 0);
  EXPECT_EQ(parity_half(1), 1);
  EXPECT_EQ(parity_half(2), 0);
  EXPECT_EQ(parity_half(77), 1);
}

TEST(ModelStaging, StagingSourceNamesAreDistinct) {
  EXPECT_NE(to_string(StagingSource::caps), to_string(StagingSource::pool_fallback));
  EXPECT_NE(to_string(StagingSource::caps), to_string(StagingSource::mib_override));
  EXPECT_NE(to_string(StagingSource::pool_fallback), to_string(StagingSource::mib_override));
}

}  // namespace
}  // namespace cpkv::model

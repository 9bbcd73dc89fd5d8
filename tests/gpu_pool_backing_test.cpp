// The host half of the sparse pool (gpu/pool_backing.cpp, gpu/vmm.cpp), checked without a GPU: which
// chunks back a rank's pool slabs (PROTOCOL.md: logical page g lives on rank g % cp at local page
// g / cp; a slab per layer and kind holds pool_pages_per_rank pages), the memory each GPU needs and
// the one-line refusal for a given free figure, and the descriptors crossing a rank socket.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "cpkv/harness/source.hpp"
#include "cpkv/model/staging.hpp"
#include "cuda_backend.hpp"
#include "device_plan.hpp"
#include "pool_backing.hpp"
#include "vmm.hpp"

namespace cpkv {
namespace {

constexpr std::uint64_t kChunk = 64 << 10;  // a 64-KiB granularity keeps the hand arithmetic small

// cp 2, page 16, kv_fp8 (10,496 B a page) + indexer_k (2,112 B), 2 layers, 1,024 pages (512 per rank).
model::Setting small_setting() {
  model::Setting s;
  s.cp = 2;
  s.page_size = 16;
  s.kinds = {*model::find_buffer_kind("kv_fp8"), *model::find_buffer_kind("indexer_k")};
  s.layer_pattern = "FF";
  s.pool_pages = 1024;
  s.caps.max_total_extend_tokens = 64;
  s.caps.max_batch_requests = 2;
  return s;
}

harness::SourceShape shape_touching(std::vector<std::int64_t> pages) {
  harness::SourceShape shape;
  shape.batches = 1;
  shape.pool_pages_touched = std::move(pages);
  return shape;
}

TEST(PoolBacking, LocalPagesAreTheOwnersShareAtGOverCp) {
  const std::vector<std::int64_t> touched = {1, 3, 201, 1023};
  EXPECT_EQ(cuda::local_pages(touched, 2, 1), (std::vector<std::int64_t>{0, 1, 100, 511}));
  EXPECT_TRUE(cuda::local_pages(touched, 2, 0).empty());
  EXPECT_EQ(cuda::local_pages({0, 4, 5, 8}, 4, 0), (std::vector<std::int64_t>{0, 1, 2}));
}

// Slabs (hand-computed, each 256-aligned already): layer 0 kv at 0 (512 x 10,496 = 5,373,952 B),
// layer 0 indexer at 5,373,952 (512 x 2,112 = 1,081,344 B), layer 1 kv at 6,455,296, layer 1
// indexer at 11,829,248, ending at 12,910,592 = 197 chunks. Rank 1's local pages 0, 1, 100, 511 of
// every slab fall in chunks 0 | 16 | 81 (kv 511) and 82 (indexer 0, 1: merged into one run) | 85 |
// 98 (indexer 511 and layer 1 kv 0, 1) | 114 | 180 | 183 | 196 (the last chunk of the reservation).
TEST(PoolBacking, TheBackedRunsAreTheChunksOfTheReferencedPagesMerged) {
  const model::Setting s = small_setting();
  const cuda::BufferLayout layout = cuda::buffer_layout(s, 2, shape_touching({}));
  ASSERT_EQ(layout.pool_offset, (std::vector<std::vector<std::uint64_t>>{{0, 5373952}, {6455296, 11829248}}));
  ASSERT_EQ(layout.pool_bytes, 12910592u);
  const std::vector<cuda::ByteRun> runs = cuda::backed_runs(layout, {0, 1, 100, 511}, kChunk);
  const std::vector<std::pair<std::uint64_t, std::uint64_t>> chunks = {{0, 1}, {16, 1}, {81, 2}, {85, 1}, {98, 1}, {114, 1}, {180, 1}, {183, 1}, {196, 1}};
  ASSERT_EQ(runs.size(), chunks.size());
  for (std::size_t i = 0; i < runs.size(); ++i) {
    EXPECT_EQ(runs[i], (cuda::ByteRun{chunks[i].first * kChunk, chunks[i].second * kChunk})) << "run " << i;
  }
  EXPECT_EQ(cuda::total_bytes(runs), 10 * kChunk);
  EXPECT_TRUE(cuda::backed_runs(layout, {}, kChunk).empty());
  EXPECT_EQ(cuda::round_up(layout.pool_bytes, kChunk), 197 * kChunk);
}

TEST(PoolBacking, EveryReferencedPageIsBackedAndAFarPageIsNot) {
  const cuda::BufferLayout layout = cuda::buffer_layout(small_setting(), 2, shape_touching({}));
  const std::vector<std::int64_t> local = {0, 1, 100, 511};
  const std::vector<cuda::ByteRun> runs = cuda::backed_runs(layout, local, kChunk);
  for (std::int32_t l = 0; l < 2; ++l) {
    for (std::size_t k = 0; k < 2; ++k) {
      for (std::int64_t page : local) EXPECT_TRUE(cuda::page_backed(layout, runs, l, k, page)) << l << " " << k << " " << page;
    }
  }
  EXPECT_FALSE(cuda::page_backed(layout, runs, 0, 0, 300));  // kv bytes 3,148,800..3,159,296: chunk 48, not backed
  EXPECT_FALSE(cuda::page_backed(layout, runs, 1, 0, 300));
  EXPECT_TRUE(cuda::page_backed(layout, runs, 0, 0, 2));      // shares chunk 0 with pages 0 and 1
}

TEST(PoolBacking, BadGeometryIsRefusedNamingIt) {
  const cuda::BufferLayout layout = cuda::buffer_layout(small_setting(), 2, shape_touching({}));
  EXPECT_THROW(cuda::backed_runs(layout, {0}, 3 << 10), std::invalid_argument);
  try {
    cuda::backed_runs(layout, {512}, kChunk);
    FAIL() << "a page past the slab was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("local pool page 512 is outside 0..511"), std::string::npos) << e.what();
  }
  EXPECT_EQ(cuda::pool_memory_from(nullptr), cuda::PoolMemory::sparse);
  EXPECT_EQ(cuda::pool_memory_from("dense"), cuda::PoolMemory::dense);
  EXPECT_THROW(cuda::pool_memory_from("half"), std::invalid_argument);
}

// The production pool: cp 2, page 64, kv_fp8 (41,984 B a page) + indexer_k (8,448 B), 61 layers,
// 65,536 pages: 32,768 a rank, slabs of 1,375,731,712 B (656 chunks of 2 MiB) and 276,824,064 B
// (132 chunks), so 61 x 32,768 x 50,432 = 100,805,902,336 B of pool a rank.
model::Setting production_setting() {
  model::Setting s = small_setting();
  s.page_size = 64;
  s.layer_pattern = std::string(61, 'F');
  s.pool_pages = 65536;
  s.caps.max_total_extend_tokens = 16384;
  s.caps.max_batch_requests = 16;
  return s;
}

TEST(PoolNeed, TheProductionPoolIsRefusedDenseOnOneGpuAndFitsSparse) {
  const model::Setting s = production_setting();
  std::vector<std::int64_t> touched;
  for (std::int64_t g = 0; g < 100; ++g) touched.push_back(g);  // 50 local pages a rank: 2 kv chunks + 1 indexer chunk a layer
  const harness::SourceShape shape = shape_touching(touched);
  const std::uint64_t free = 139ULL << 30;
  cuda::NeedInputs dense{cuda::PoolMemory::dense, 2 << 20, false, 0};
  const cuda::PoolVerdict one_gpu = cuda::pool_verdict(s, 61, shape, dense, {free});
  ASSERT_EQ(one_gpu.needs.size(), 1u);
  EXPECT_EQ(one_gpu.needs[0].ranks, (std::vector<std::int32_t>{0, 1}));
  EXPECT_EQ(one_gpu.needs[0].need.pool_backed, 2 * 100805902336ULL);
  EXPECT_EQ(one_gpu.needs[0].need.overhead, 2 * cuda::kRankOverheadBytes);
  EXPECT_TRUE(one_gpu.plan.runs.empty()) << "a dense pool backs every slab whole";
  const std::string& refused = one_gpu.refusal;
  EXPECT_NE(refused.find("cuda: the run does not fit: GPU 0 (ranks 0 1) needs 189."), std::string::npos) << refused;
  EXPECT_NE(refused.find("139.00 GiB free"), std::string::npos) << refused;
  EXPECT_EQ(refused.find('\n'), std::string::npos) << "one line";
  EXPECT_NE(one_gpu.need_line.find("gpu memory (dense pool): GPU 0 (ranks 0 1) needs 189."), std::string::npos) << one_gpu.need_line;
  cuda::NeedInputs sparse{cuda::PoolMemory::sparse, 2 << 20, false, 0};
  const cuda::PoolVerdict fits = cuda::pool_verdict(s, 61, shape, sparse, {free});
  ASSERT_EQ(fits.plan.runs.size(), 2u) << "one rank's backed runs each";
  EXPECT_EQ(fits.needs[0].need.pool_backed, 2 * 61 * 3 * (2ULL << 20));
  EXPECT_EQ(fits.needs[0].need.pool_reserved, 2 * 100805902336ULL);
  EXPECT_TRUE(fits.refusal.empty());
  const std::string& line = fits.need_line;
  EXPECT_NE(line.find("gpu memory (sparse pool): GPU 0 (ranks 0 1) needs "), std::string::npos) << line;
  EXPECT_NE(line.find("pool 0.71 GiB backed of 187.77 GiB reserved"), std::string::npos) << line;
}

TEST(PoolNeed, TwoGpusCarryOneRankEachAndTheBenchBuffersCount) {
  const model::Setting s = production_setting();
  cuda::NeedInputs in{cuda::PoolMemory::sparse, 2 << 20, true, 512ULL << 20};
  const cuda::PoolVerdict verdict = cuda::pool_verdict(s, 61, shape_touching({0, 1}), in, {1ULL << 30, 100ULL << 30});
  const std::vector<cuda::GpuNeed>& needs = verdict.needs;
  ASSERT_EQ(needs.size(), 2u);
  EXPECT_EQ(needs[0].ranks, std::vector<std::int32_t>{0});
  EXPECT_EQ(needs[1].ranks, std::vector<std::int32_t>{1});
  EXPECT_EQ(needs[1].need.bench, 512ULL << 20);
  EXPECT_EQ(needs[0].need.pool_backed, 61 * 2 * (2ULL << 20));  // page 0's kv and indexer chunk on every layer
  const std::string& refused = verdict.refusal;
  EXPECT_NE(refused.find("GPU 0 (ranks 0)"), std::string::npos) << refused;  // 1 GiB free is less than the context allowance alone
  EXPECT_NE(refused.find("1.00 GiB free"), std::string::npos) << refused;
}

// The cheap guard that no plan reads a pool page with no memory behind it: every pool entry of the
// GPU planted-bug workload's plan (prefix pages 3, 10 and 21 at cp 2) is a referenced page, and the
// same plan checked against a set that lacks page 10 (rank 0's local page 5) stops the process.
TEST(PoolBackingDeathTest, APlanReadingAnUnreferencedPoolPageIsStopped) {
  const harness::BatchSource source = cuda::gpu_mutant_source(2);
  const harness::SourceShape shape = harness::measure(source);
  ASSERT_EQ(shape.pool_pages_touched, (std::vector<std::int64_t>{3, 10, 21}));
  const std::int64_t staging_slots = model::staging_capacity(source.setting).staging_slots;
  std::vector<bool> populated(source.setting.pool_pages_per_rank(), false);
  const cuda::BatchPlan b = cuda::build_batch_plan(source.setting, source.batches.front(), model::Variant::staging_direct, 0, staging_slots, populated);
  std::vector<std::vector<bool>> referenced(2, std::vector<bool>(source.setting.pool_pages_per_rank(), false));
  for (std::int64_t g : shape.pool_pages_touched) referenced[g % 2][g / 2] = true;
  cuda::TableBounds bounds{2, source.setting.pool_pages_per_rank(), staging_slots, &referenced};
  std::int64_t pool_reads = 0;
  for (const kernels::GatherEntry& e : b.compose) pool_reads += e.table_index >= 0 && e.table_index < 2 ? 1 : 0;
  EXPECT_EQ(pool_reads, 3) << "one pool read per prefix page";
  cuda::check_entries(b.compose, bounds);  // passes
  referenced[0][5] = false;
  EXPECT_DEATH(cuda::check_entries(b.compose, bounds), "pool_referenced");
}

// Descriptors cross a rank socket between two processes, as between two ranks: 150 pipe write ends
// (three messages) arrive in order and still refer to the same pipes.
TEST(RankSocket, DescriptorsCrossToASiblingProcessInOrder) {
  std::vector<int> read_ends, write_ends;
  for (int i = 0; i < 150; ++i) {
    int p[2];
    ASSERT_EQ(::pipe(p), 0);
    read_ends.push_back(p[0]);
    write_ends.push_back(p[1]);
  }
  cuda::FdChannels channels(2);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // rank 1: receive, write byte i into descriptor i
    const std::vector<int> ends = channels.own_ends(1);
    int status = 0;
    try {
      const std::vector<int> got = cuda::receive_fds(ends[0], 150, 10000);
      for (std::size_t i = 0; i < got.size(); ++i) {
        const char byte = static_cast<char>(i);
        if (::write(got[i], &byte, 1) != 1) status = 3;
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank 1: %s\n", e.what());
      status = 4;
    }
    ::_exit(status);
  }
  const std::vector<int> ends = channels.own_ends(0);
  ASSERT_EQ(ends[0], -1);
  cuda::send_fds(ends[1], write_ends, 10000);
  int status = -1;
  ASSERT_EQ(::waitpid(child, &status, 0), child);  // bounded: the child's receive gives up after 10 s
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  for (std::size_t i = 0; i < read_ends.size(); ++i) {
    char back = 0;
    ASSERT_EQ(::read(read_ends[i], &back, 1), 1);
    EXPECT_EQ(back, static_cast<char>(i)) << "descriptor " << i << " arrived as another pipe";
  }
  for (const std::vector<int>* v : {&read_ends, &write_ends}) for (int fd : *v) ::close(fd);
}

TEST(RankSocket, ARankKeepsItsOwnEndsAndAReceiveWithNothingSentTimesOut) {
  cuda::FdChannels channels(3);
  const std::vector<int> ends = channels.own_ends(1);
  ASSERT_EQ(ends.size(), 3u);
  EXPECT_EQ(ends[1], -1);
  for (int p : {0, 2}) EXPECT_NE(::fcntl(ends[p], F_GETFD), -1) << "rank 1's end towards rank " << p << " is not open";
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
  const auto start = std::chrono::steady_clock::now();
  try {
    cuda::receive_fds(sv[0], 1, 200);
    FAIL() << "a receive with nothing sent returned";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("waited 200 ms"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  for (int fd : {sv[0], sv[1], ends[0], ends[2]}) ::close(fd);
}

}  // namespace
}  // namespace cpkv

// The GPU side of the planted bugs: which switches the CUDA backend has (the switches themselves sit
// in the fused plugin's layer, gpu/fused/fused_exchange.cpp, through gpu/mutant_policy.hpp) and the
// verify kernel's self-test.


#include <cstring>
#include <vector>

#include <cuda_runtime.h>
#include <fmt/format.h>

#include "cpkv/harness/probe.hpp"
#include "cuda_backend.hpp"
#include "cpkv/model/setting.hpp"
#include "launchers.cuh"

namespace cpkv::cuda {

model::Setting gpu_small_setting(std::int32_t cp) {
  model::Setting s;
  s.cp = cp;
  s.page_size = 16;
  s.kinds = {*model::find_buffer_kind("kv_fp8"), *model::find_buffer_kind("indexer_k")};
  s.layer_pattern = "FSFS";
  s.pool_pages = 64;
  s.caps.max_total_extend_tokens = 1024;
  s.caps.max_batch_requests = 8;
  return s;
}

harness::BatchSource gpu_mutant_source(std::int32_t cp) {
  const model::Setting s = gpu_small_setting(cp);
  model::Batch b;
  b.requests.push_back({32, 40, {3, 10}});           // 2 prefix pages, 3 current pages (the last 8 rows)
  b.requests.push_back({0, 16 * 2 * cp + 5, {}});    // 2cp full pages and a 5-row tail: every rank writes
  b.requests.push_back({16, 1, {21}});               // one token after a cached page
  return harness::BatchSource::from_batches(s, {b});
}

harness::BatchSource gpu_plugin_mutant_source(std::int32_t cp) {
  const harness::BatchSource first = gpu_mutant_source(cp);
  model::Batch second;
  second.requests.push_back({0, 16 * cp + 3, {}});      // current pages first: every slot's source moves
  second.requests.push_back({48, 20, {1, 5, 30}});      // 3 prefix pages, 2 current pages (the last 4 rows)
  return harness::BatchSource::from_batches(first.setting, {first.batches.front(), second});
}

std::string first_finding(const harness::RunReport& report) {
  for (const harness::Totals& t : report.ranks) {
    if (t.mismatches > 0) return t.first_mismatch;
  }
  if (!report.violations.empty()) return harness::describe(report.violations.front());
  return report.failure;
}

namespace {

// The self-test's buffer: 3 prefix pages (pool content of logical pages 7, 8, 9) and one slot with
// no valid row (all zero), P = 4 rows of the indexer's 132 B. The planted byte: slot 1, row 2, byte 77.
constexpr std::int32_t kPageSize = 4;
constexpr std::uint32_t kRowBytes = 132;
constexpr std::int64_t kSlots = 4;
constexpr std::int64_t kPlantedSlot = 1;
constexpr std::int32_t kPlantedRow = 2;
constexpr std::int32_t kPlantedByte = 77;
constexpr int kSelfTestMs = 60000;  // a child that takes longer is killed and reported

struct Wire {  // what the child sends back: plain bytes through a pipe
  int cuda_error;
  unsigned long long clean_wrong, corrupted_wrong, first_wrong;
  int planted_expected, planted_actual;
};

#define CPKV_SELF_TEST_CHECK(call)               \
  do {                                           \
    const cudaError_t e_ = (call);               \
    if (e_ != cudaSuccess) return static_cast<int>(e_); \
  } while (0)

int run_on_device(Wire& out) {
  const std::uint64_t bytes = kSlots * kPageSize * kRowBytes;
  std::uint8_t* dense = nullptr;
  CPKV_SELF_TEST_CHECK(cudaMalloc(&dense, bytes));
  CPKV_SELF_TEST_CHECK(cudaMemset(dense, 0, bytes));
  const std::vector<std::int64_t> logical = {7, 8, 9}, local = {0, 1, 2};
  const std::vector<kernels::SlotSource> slots = {{7, 0, 0, kPageSize}, {8, 0, 0, kPageSize}, {9, 0, 0, kPageSize}, {-1, 0, 0, 0}};
  std::int64_t *d_logical = nullptr, *d_local = nullptr;
  kernels::SlotSource* d_slots = nullptr;
  kernels::VerifyResult* d_result = nullptr;
  CPKV_SELF_TEST_CHECK(cudaMalloc(&d_logical, 3 * sizeof(std::int64_t)));
  CPKV_SELF_TEST_CHECK(cudaMalloc(&d_local, 3 * sizeof(std::int64_t)));
  CPKV_SELF_TEST_CHECK(cudaMalloc(&d_slots, slots.size() * sizeof(kernels::SlotSource)));
  CPKV_SELF_TEST_CHECK(cudaMalloc(&d_result, sizeof(kernels::VerifyResult)));
  CPKV_SELF_TEST_CHECK(cudaMemcpy(d_logical, logical.data(), 3 * sizeof(std::int64_t), cudaMemcpyHostToDevice));
  CPKV_SELF_TEST_CHECK(cudaMemcpy(d_local, local.data(), 3 * sizeof(std::int64_t), cudaMemcpyHostToDevice));
  CPKV_SELF_TEST_CHECK(cudaMemcpy(d_slots, slots.data(), slots.size() * sizeof(kernels::SlotSource), cudaMemcpyHostToDevice));
  CPKV_SELF_TEST_CHECK(kernels::launch_populate_pool(dense, kRowBytes, kPageSize, d_logical, d_local, 3, 11, 1, 0, nullptr));
  const auto verify = [&](unsigned long long& wrong, unsigned long long* first) {
    const kernels::VerifyResult init{0, ~0ULL};
    kernels::VerifyResult result{};
    CPKV_SELF_TEST_CHECK(cudaMemcpy(d_result, &init, sizeof(init), cudaMemcpyHostToDevice));
    CPKV_SELF_TEST_CHECK(kernels::launch_verify(dense, kRowBytes, kPageSize, d_slots, kSlots, 11, 1, 0, d_result, nullptr));
    CPKV_SELF_TEST_CHECK(cudaMemcpy(&result, d_result, sizeof(result), cudaMemcpyDeviceToHost));
    wrong = result.wrong_bytes;
    if (first != nullptr) *first = result.first_wrong;
    return 0;
  };
  if (const int e = verify(out.clean_wrong, nullptr); e != 0) return e;
  // Flip every bit of the planted byte.
  std::uint8_t* planted = dense + (kPlantedSlot * kPageSize + kPlantedRow) * kRowBytes + kPlantedByte;
  std::uint8_t value = 0;
  CPKV_SELF_TEST_CHECK(cudaMemcpy(&value, planted, 1, cudaMemcpyDeviceToHost));
  const std::uint8_t flipped = static_cast<std::uint8_t>(value ^ 0xFF);
  CPKV_SELF_TEST_CHECK(cudaMemcpy(planted, &flipped, 1, cudaMemcpyHostToDevice));
  out.planted_expected = value;
  out.planted_actual = flipped;
  return verify(out.corrupted_wrong, &out.first_wrong);
}

}  // namespace

VerifySelfTest verify_self_test() {
  VerifySelfTest t;
  t.planted_slot = kPlantedSlot;
  t.planted_row = kPlantedRow;
  t.planted_byte = kPlantedByte;
  // In a child: this process never touches CUDA (its ranks fork later).
  Wire wire{};
  const harness::ProbeOutcome probe = harness::run_probe<Wire>([](Wire& w) { w.cuda_error = run_on_device(w); }, wire,
                                                                std::chrono::milliseconds(kSelfTestMs));
  if (!probe.answered) {
    t.failure = "verify self-test: " + probe.failure;
    return t;
  }
  if (wire.cuda_error != 0) {
    t.failure = fmt::format("verify self-test: CUDA error {}: {}", wire.cuda_error, cudaGetErrorString(static_cast<cudaError_t>(wire.cuda_error)));
    return t;
  }
  t.wrong_bytes_clean = wire.clean_wrong;
  t.wrong_bytes_corrupted = wire.corrupted_wrong;
  t.planted_expected = wire.planted_expected;
  t.planted_actual = wire.planted_actual;
  if (wire.corrupted_wrong > 0) {
    // The packed first wrong byte: (byte index << 16) | (expected << 8) | actual.
    const unsigned long long index = wire.first_wrong >> 16;
    const unsigned long long row_global = index / kRowBytes;
    t.slot = static_cast<std::int64_t>(row_global / kPageSize);
    t.row = static_cast<std::int32_t>(row_global % kPageSize);
    t.byte = static_cast<std::int32_t>(index % kRowBytes);
    t.expected = static_cast<std::int32_t>((wire.first_wrong >> 8) & 0xff);
    t.actual = static_cast<std::int32_t>(wire.first_wrong & 0xff);
  }
  return t;
}

}  // namespace cpkv::cuda

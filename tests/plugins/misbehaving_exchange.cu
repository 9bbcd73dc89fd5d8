// Test plugins that misbehave in one way each on top of a correct exchange: the plain example
// (examples/exchange_plain/plain_exchange.cu, compiled in here under another symbol), whose bytes
// are right, so what cpkv reports is the misbehaviour alone (tests/gpu_guard_test.cpp). One define each:
//   MISBEHAVE_NONE        the plain exchange as it is (passes)
//   MISBEHAVE_PAST_DENSE  after its layer's work, one byte (0x00) just past the dense buffer of kind 0
//   MISBEHAVE_POOL        after its layer's work, one byte of the first own pool page its plan reads
//                         incremented (kind 0 of the layer's slab)
//   MISBEHAVE_COUNTERS    reports one byte gathered from peers per layer (it counts nothing really)
//   MISBEHAVE_FAULT       on layer 1 of every batch, a kernel that stores through an illegal address
#include <cuda_runtime.h>

#define cpkv_exchange_v1 cpkv_plain_inner_v1
#include "../../examples/exchange_plain/plain_exchange.cu"
#undef cpkv_exchange_v1

namespace {

#if defined(MISBEHAVE_POOL)
__global__ void bump_first_own_pool_page(unsigned char* pool, const int* table_index, const int64_t* source_page, int64_t slots, int rank,
                                         unsigned long long page_bytes) {
  for (int64_t s = 0; s < slots; ++s) {
    if (table_index[s] != rank) continue;
    pool[source_page[s] * page_bytes] += 1;
    return;
  }
}

#endif
#if defined(MISBEHAVE_FAULT)
__global__ void store_through_an_illegal_address(int* where) { *where = 1; }
#endif

cpkv_status misbehaving_compose(cpkv_exchange_ctx* c, int32_t layer, void* stream_ptr) {
  const cpkv_status status = cpkv_plain_inner_v1.compose_layer(c, layer, stream_ptr);
  if (status != CPKV_OK) return status;
  [[maybe_unused]] cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  [[maybe_unused]] const int half = layer % 2;
#if defined(MISBEHAVE_PAST_DENSE)
  if (c->kinds[0].active[layer]) cudaMemsetAsync(static_cast<unsigned char*>(c->dense[half * c->kind_count]) + c->slot_count_max * page_bytes(c, 0), 0, 1, stream);
#elif defined(MISBEHAVE_POOL)
  if (c->kinds[0].active[layer] && c->batch->slot_count > 0) {
    bump_first_own_pool_page<<<1, 1, 0, stream>>>(static_cast<unsigned char*>(c->pool[c->rank]) + c->pool_offset[layer * c->kind_count], c->batch->plan_table_index,
                                                  c->batch->plan_source_page, c->batch->slot_count, c->rank, page_bytes(c, 0));
  }
#elif defined(MISBEHAVE_COUNTERS)
  c->counters.bytes_gathered_from_peers += 1;
#elif defined(MISBEHAVE_FAULT)
  if (layer == 1) store_through_an_illegal_address<<<1, 1, 0, stream>>>(reinterpret_cast<int*>(0x10));
#endif
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? CPKV_OK : cuda_failed(c, "misbehaving launch", e);
}

#if defined(MISBEHAVE_PAST_DENSE)
#define MISBEHAVE_NAME "past_dense"
#elif defined(MISBEHAVE_POOL)
#define MISBEHAVE_NAME "pool_write"
#elif defined(MISBEHAVE_COUNTERS)
#define MISBEHAVE_NAME "lying_counters"
#elif defined(MISBEHAVE_FAULT)
#define MISBEHAVE_NAME "faulting"
#else
#define MISBEHAVE_NAME "well_behaved"
#endif

}  // namespace

extern "C" __attribute__((visibility("default"))) const cpkv_exchange_v1_t cpkv_exchange_v1 = {
    CPKV_EXCHANGE_ABI_VERSION, sizeof(cpkv_exchange_v1_t), MISBEHAVE_NAME, kVariants, nullptr, CPKV_USES_ROWS | CPKV_USES_PLAN | CPKV_USES_INVERSE, 0,
    setup, begin_batch, misbehaving_compose, end_batch, teardown};

// The minimum an engine team writes to put its own CUDA exchange under cpkv's harness: staging_direct
// (PROTOCOL.md section 5) as three plain kernels per layer, against include/cpkv/exchange_abi.h only.
//   fill:    copy this rank's current pages (the rows cpkv hands over, tails already zero) into
//            staging half l % 2 at their current index;
//   barrier: a counting barrier over the flag pads (one thread per peer: release-store the phase
//            into the peer's word for this rank, then acquire-poll this rank's word of every peer,
//            bounded, the timeout written to a status word the host reads in end_batch);
//   gather:  one slot-dense gather per kind over the plan cpkv hands over (pool of rank t, or the
//            staging half of rank t - cp).
// Build: nvcc -shared -Xcompiler -fPIC -arch=sm_90 -I include plain_exchange.cu -o libcpkv_exchange_plain.so
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <new>

#include "cpkv/exchange_abi.h"

namespace {

constexpr long long kWaitCycles = 1LL << 33;  // about 4.5 s at 1.9 GHz: far above any healthy wait

struct Status {
  unsigned long long phase;  // non-zero: the phase that timed out
  int rank, peer;
};

struct State {
  cpkv_symmetric staging;
  unsigned long long phase = 0;
  Status* status = nullptr;   // device
  unsigned long long half_bytes = 0;
  unsigned long long kind_offset[CPKV_KINDS_MAX] = {};  // within a half
};

struct Tables {
  const unsigned char* pool[CPKV_CP_MAX];
  const unsigned char* staging[CPKV_CP_MAX];
};

unsigned long long page_bytes(const cpkv_exchange_ctx* c, int k) { return 1ULL * c->kinds[k].row_bytes * c->page_size; }

cpkv_status cuda_failed(cpkv_exchange_ctx* c, const char* what, cudaError_t e) {
  std::snprintf(c->error, CPKV_ERROR_BYTES, "%s: %s", what, cudaGetErrorString(e));
  return CPKV_ERROR;
}

__global__ void fill(unsigned char* dst, const unsigned char* rows, const int64_t* own_index, int64_t own_pages, unsigned long long bytes) {
  for (int64_t j = blockIdx.x; j < own_pages; j += gridDim.x) {
    const unsigned char* from = rows + j * bytes;
    unsigned char* to = dst + own_index[j] * bytes;
    for (unsigned long long b = threadIdx.x; b < bytes; b += blockDim.x) to[b] = from[b];
  }
}

__global__ void barrier(uint64_t* const* pads, int rank, int cp, unsigned long long phase, Status* status) {
  const int peer = threadIdx.x;
  if (peer >= cp) return;
  uint64_t* theirs = pads[peer] + rank;
  __threadfence_system();
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(theirs), "l"(static_cast<uint64_t>(phase)) : "memory");
  const uint64_t* mine = pads[rank] + peer;
  const long long start = clock64();
  uint64_t seen = 0;
  do {
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(seen) : "l"(mine) : "memory");
    if (clock64() - start > kWaitCycles) {
      *status = Status{phase, rank, peer};
      return;
    }
  } while (seen < phase);
}

__global__ void gather(unsigned char* dense, Tables t, unsigned long long pool_offset, unsigned long long staging_offset, const int* table_index,
                       const int64_t* source_page, int64_t slots, int cp, unsigned long long bytes) {
  for (int64_t s = blockIdx.x; s < slots; s += gridDim.x) {
    const int ti = table_index[s];
    const unsigned char* from = ti < cp ? t.pool[ti] + pool_offset + source_page[s] * bytes : t.staging[ti - cp] + staging_offset + source_page[s] * bytes;
    unsigned char* to = dense + s * bytes;
    for (unsigned long long b = threadIdx.x * 16; b < bytes; b += blockDim.x * 16) {
      if (b + 16 <= bytes && (bytes % 16) == 0) {
        *reinterpret_cast<uint4*>(to + b) = *reinterpret_cast<const uint4*>(from + b);
      } else {
        for (unsigned long long i = b; i < b + 16 && i < bytes; ++i) to[i] = from[i];
      }
    }
  }
}

cpkv_status setup(cpkv_exchange_ctx* c) {
  State* s = new (std::nothrow) State();
  if (s == nullptr) return CPKV_ERROR;
  c->plugin_state = s;
  for (int k = 0; k < c->kind_count; ++k) {
    s->kind_offset[k] = s->half_bytes;
    s->half_bytes += c->staging_slots * page_bytes(c, k);
  }
  if (c->alloc_symmetric(c, 2 * s->half_bytes, &s->staging) != CPKV_OK) return CPKV_ERROR;  // ctx->error says why
  cudaError_t e = cudaMalloc(&s->status, sizeof(Status));
  if (e == cudaSuccess) e = cudaMemset(s->status, 0, sizeof(Status));
  return e == cudaSuccess ? CPKV_OK : cuda_failed(c, "status word", e);
}

cpkv_status begin_batch(cpkv_exchange_ctx* c) {
  if (c->batch->current_pages <= c->staging_slots) return CPKV_OK;
  std::snprintf(c->error, CPKV_ERROR_BYTES, "%lld current pages exceed the staging's %lld slots", static_cast<long long>(c->batch->current_pages),
                static_cast<long long>(c->staging_slots));
  return CPKV_OVERFLOW;  // every rank decides from the same batch-logical numbers
}

cpkv_status compose_layer(cpkv_exchange_ctx* c, int32_t layer, void* stream_ptr) {
  State* s = static_cast<State*>(c->plugin_state);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const cpkv_batch* b = c->batch;
  const int half = layer % 2;
  unsigned char* own_staging = static_cast<unsigned char*>(s->staging.local) + half * s->half_bytes;
  for (int k = 0; k < c->kind_count; ++k) {
    if (!c->kinds[k].active[layer] || b->own_pages == 0) continue;
    fill<<<256, 256, 0, stream>>>(own_staging + s->kind_offset[k], static_cast<const unsigned char*>(c->rows[k]), b->own_current_index, b->own_pages,
                                  page_bytes(c, k));
  }
  barrier<<<1, CPKV_CP_MAX, 0, stream>>>(c->flag_pad_table, c->rank, c->cp, ++s->phase, s->status);
  for (int k = 0; k < c->kind_count; ++k) {
    if (!c->kinds[k].active[layer] || b->slot_count == 0) continue;
    Tables t{};
    for (int p = 0; p < c->cp; ++p) {
      t.pool[p] = static_cast<const unsigned char*>(c->pool[p]);
      t.staging[p] = static_cast<const unsigned char*>(s->staging.peers[p]);
    }
    gather<<<512, 128, 0, stream>>>(static_cast<unsigned char*>(c->dense[half * c->kind_count + k]), t, c->pool_offset[layer * c->kind_count + k],
                                    half * s->half_bytes + s->kind_offset[k], b->plan_table_index, b->plan_source_page, b->slot_count, c->cp,
                                    page_bytes(c, k));
  }
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? CPKV_OK : cuda_failed(c, "launch", e);
}

cpkv_status end_batch(cpkv_exchange_ctx* c) {
  State* s = static_cast<State*>(c->plugin_state);
  Status status{};
  const cudaError_t e = cudaMemcpy(&status, s->status, sizeof(status), cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) return cuda_failed(c, "status word", e);
  if (status.phase == 0) return CPKV_OK;
  std::snprintf(c->error, CPKV_ERROR_BYTES, "barrier phase %llu: rank %d waited for rank %d", status.phase, status.rank, status.peer);
  return CPKV_TIMEOUT;
}

cpkv_status teardown(cpkv_exchange_ctx* c) {
  State* s = static_cast<State*>(c->plugin_state);
  if (s != nullptr) cudaFree(s->status);
  delete s;
  c->plugin_state = nullptr;
  return CPKV_OK;  // the symmetric staging is cpkv's to release
}

const char* const kVariants[] = {"staging_direct", nullptr};

}  // namespace

extern "C" __attribute__((visibility("default"))) const cpkv_exchange_v1_t cpkv_exchange_v1 = {
    CPKV_EXCHANGE_ABI_VERSION, sizeof(cpkv_exchange_v1_t), "plain", kVariants, nullptr, CPKV_USES_ROWS | CPKV_USES_PLAN | CPKV_USES_INVERSE, 0,
    setup, begin_batch, compose_layer, end_batch, teardown};

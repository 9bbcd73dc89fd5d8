// The minimum an engine team writes to put its own CUDA exchange under cpkv's harness: staging_direct
// (PROTOCOL.md section 5) as three plain kernels per layer, against include/cpkv/exchange_abi.h only.
//   fill:    copy this rank's current pages (the rows cpkv hands over, tails already zero) into
//            staging half l % 2 at their current index;
//   barrier: a counting barrier over the flag pads (one thread per peer: release-store the phase
//            into the peer's word for this rank, then acquire-poll this rank's word of every peer,
//            bounded, the timeout written to a status word the host reads in end_batch);
//   gather:  one slot-dense gather per kind over the plan cpkv hands over (pool of rank t, or the
//            staging half of rank t - cp).
// Beside the bytes it returns its attention plan (CPKV_FLAG_ATTENTION_PLAN: the segments of the rows it
// writes, PROTOCOL.md section 11) and holds one planted bug of cpkv's table itself,
// address_keyed_plan_cache (ctx->mutant: the first batch's plan kept under the dense buffer's
// address, which every batch shares, and served to every later batch).
// Build: nvcc -shared -Xcompiler -fPIC -arch=sm_90 -I include plain_exchange.cu -o libcpkv_exchange_plain.so
// (-DPLAIN_ZERO_TAILS: the fill zeroes the rows past a request's end itself, so it does not depend
// on cpkv's zeroed tails; cpkv's tests build it so, as libcpkv_exchange_plain_zero_tails.so)
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <new>
#include <vector>

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
  std::vector<cpkv_attention_segment> attention;       // the batch's plan (ctx->attention_segments)
  bool cache_plan = false;                             // the planted bug address_keyed_plan_cache
  const void* cache_key = nullptr;                     // the dense address the cached plan was stored under
  int* cached_index = nullptr;                         // device [slot_count_max]: the cached plan
  int64_t* cached_page = nullptr;
  const int* plan_index = nullptr;                     // the plan the gathers read this batch
  const int64_t* plan_page = nullptr;
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

__global__ void fill(unsigned char* dst, const unsigned char* rows, const int64_t* own_index, int64_t own_pages, unsigned long long bytes,
                     const int32_t* row_request, unsigned long long row_bytes, int page_size) {
  for (int64_t j = blockIdx.x; j < own_pages; j += gridDim.x) {
    const unsigned char* from = rows + j * bytes;
    unsigned char* to = dst + own_index[j] * bytes;
    for (unsigned long long b = threadIdx.x; b < bytes; b += blockDim.x) {
#ifdef PLAIN_ZERO_TAILS
      if (row_request[j * page_size + b / row_bytes] < 0) {  // past its request's end
        to[b] = 0;
        continue;
      }
#endif
      to[b] = from[b];
    }
  }
  (void)row_request;
  (void)row_bytes;
  (void)page_size;
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
  s->cache_plan = std::strcmp(c->mutant, "address_keyed_plan_cache") == 0;
  const unsigned long long slots = c->slot_count_max > 0 ? c->slot_count_max : 1;
  if (e == cudaSuccess && s->cache_plan) e = cudaMalloc(&s->cached_index, slots * sizeof(int));
  if (e == cudaSuccess && s->cache_plan) e = cudaMalloc(&s->cached_page, slots * sizeof(int64_t));
  if (e == cudaSuccess && s->cache_plan) e = cudaMemset(s->cached_index, 0, slots * sizeof(int));  // slot 0 of rank 0's pool: in range
  if (e == cudaSuccess && s->cache_plan) e = cudaMemset(s->cached_page, 0, slots * sizeof(int64_t));
  return e == cudaSuccess ? CPKV_OK : cuda_failed(c, "status word", e);
}

// This rank's attention plan (PROTOCOL.md section 11): its queries are the rows it writes, own page
// j's rows at j * page_size, in order (the row tables cpkv hands over, copied to the host once per
// batch; row_token is the position in the request, prefix included); one segment per run of consecutive tokens of one request. Key j of request r is dense row
// k_base + j, where r's span begins (section 3: every earlier request's prefix and current pages).
cpkv_status plan_attention(cpkv_exchange_ctx* c, State* s) {
  const cpkv_batch* b = c->batch;
  const int64_t rows = b->own_pages * c->page_size;
  std::vector<int32_t> request(rows);
  std::vector<int64_t> token(rows);
  cudaError_t e = cudaMemcpy(request.data(), b->row_request, rows * sizeof(int32_t), cudaMemcpyDeviceToHost);
  if (e == cudaSuccess) e = cudaMemcpy(token.data(), b->row_token, rows * sizeof(int64_t), cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) return cuda_failed(c, "the row tables", e);
  std::vector<int64_t> k_base(b->requests, 0);
  for (int32_t r = 1; r < b->requests; ++r) {
    k_base[r] = k_base[r - 1] + b->prefix_len[r - 1] + (b->extend_len[r - 1] + c->page_size - 1) / c->page_size * c->page_size;
  }
  s->attention.clear();
  for (int64_t i = 0; i < rows; ++i) {
    if (request[i] < 0) continue;
    const int64_t q = token[i] - b->prefix_len[request[i]];  // row_token counts the prefix; q_base the extend
    cpkv_attention_segment* last = s->attention.empty() ? nullptr : &s->attention.back();
    if (last != nullptr && last->request == request[i] && last->q_base + last->q_len == q) {
      ++last->q_len;
    } else {
      s->attention.push_back(cpkv_attention_segment{request[i], q, 1, 0, k_base[request[i]]});
    }
  }
  for (cpkv_attention_segment& g : s->attention) g.kv_len = b->prefix_len[g.request] + g.q_base + g.q_len;
  if (CPKV_CTX_HAS(c, attention_segment_count)) {  // a cpkv before revision 3 of the context reads no plan
    c->attention_segments = s->attention.data();
    c->attention_segment_count = static_cast<int64_t>(s->attention.size());
  }
  return CPKV_OK;
}

// The plan the gathers read: cpkv's for this batch, or, under address_keyed_plan_cache, the one
// cached under the dense buffer's address (the first batch's: the address never changes).
cpkv_status choose_plan(cpkv_exchange_ctx* c, State* s) {
  s->plan_index = c->batch->plan_table_index;
  s->plan_page = c->batch->plan_source_page;
  if (!s->cache_plan) return CPKV_OK;
  if (s->cache_key != c->dense[0]) {
    cudaError_t e = cudaMemcpy(s->cached_index, c->batch->plan_table_index, c->batch->slot_count * sizeof(int), cudaMemcpyDeviceToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(s->cached_page, c->batch->plan_source_page, c->batch->slot_count * sizeof(int64_t), cudaMemcpyDeviceToDevice);
    if (e != cudaSuccess) return cuda_failed(c, "the plan cache", e);
    s->cache_key = c->dense[0];
  }
  s->plan_index = s->cached_index;
  s->plan_page = s->cached_page;
  return CPKV_OK;
}

cpkv_status begin_batch(cpkv_exchange_ctx* c) {
  if (c->batch->current_pages > c->staging_slots) {
    std::snprintf(c->error, CPKV_ERROR_BYTES, "%lld current pages exceed the staging's %lld slots", static_cast<long long>(c->batch->current_pages),
                  static_cast<long long>(c->staging_slots));
    return CPKV_OVERFLOW;  // every rank decides from the same batch-logical numbers
  }
  State* s = static_cast<State*>(c->plugin_state);
  const cpkv_status planned = plan_attention(c, s);
  return planned != CPKV_OK ? planned : choose_plan(c, s);
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
                                  page_bytes(c, k), b->row_request, c->kinds[k].row_bytes, c->page_size);
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
                                    half * s->half_bytes + s->kind_offset[k], s->plan_index, s->plan_page, b->slot_count, c->cp,
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
  if (s != nullptr) {
    cudaFree(s->status);
    cudaFree(s->cached_index);
    cudaFree(s->cached_page);
  }
  delete s;
  c->plugin_state = nullptr;
  return CPKV_OK;  // the symmetric staging is cpkv's to release
}

const char* const kVariants[] = {"staging_direct", nullptr};
const char* const kMutants[] = {"address_keyed_plan_cache", nullptr};

}  // namespace

extern "C" __attribute__((visibility("default"))) const cpkv_exchange_v1_t cpkv_exchange_v1 = {
    CPKV_EXCHANGE_ABI_VERSION, sizeof(cpkv_exchange_v1_t), "plain", kVariants, kMutants, CPKV_USES_ROWS | CPKV_USES_PLAN | CPKV_USES_INVERSE,
    CPKV_FLAG_ATTENTION_PLAN, setup, begin_batch, compose_layer, end_batch, teardown};

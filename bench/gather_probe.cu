// The gather's design space on the GPUs, one process driving every visible GPU at once (each pulls
// scattered pages from the next one through peer access), against the copy engines' contiguous
// pull measured the same way. An experiment for issue 14 ("a faster gather"): it sweeps the knobs
// the compose kernel's copy has (chunk per warp, 16-byte loads in flight per lane, blocks per SM)
// and the load instruction's cache hints, and prints one CSV row per configuration, so the fastest
// one can be carried into kernels/compose_kernels.cu with a measurement behind it.
// Usage: cpkv.bench.gather_probe [--quick]   (CSV on stdout; per case, the copy engines moving the same
// bytes contiguously and the best pull and push, on stderr)
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>

#define PROBE_CHECK(call)                                                                          \
  do {                                                                                             \
    const cudaError_t err_ = (call);                                                               \
    if (err_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "gather_probe: %s failed: %s (%s:%d)\n", #call, cudaGetErrorString(err_), __FILE__, __LINE__); \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

namespace {

struct Entry {
  std::int64_t dst_page;
  std::int64_t src_page;
};

// The load flavours: plain, non-coherent without L1 allocation, the same with a 256-byte L2
// prefetch hint, and plain with the hint.
enum Load { kPlain = 0, kNoAllocate = 1, kNoAllocate256 = 2, kPlain256 = 3, kLoads = 4 };
const char* const kLoadNames[kLoads] = {"plain", "nc_noalloc", "nc_noalloc_L2_256", "plain_L2_256"};

template <int L>
__device__ __forceinline__ uint4 load16(const uint4* p) {
  uint4 v;
  if constexpr (L == kPlain) {
    v = *p;
  } else if constexpr (L == kNoAllocate) {
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  } else if constexpr (L == kNoAllocate256) {
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  } else {
    asm volatile("ld.global.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  }
  return v;
}

// One warp per work item (a chunk of a page), U 16-byte loads per lane in flight before the stores:
// the compose kernel's copy, with the chunk, the unroll and the load as parameters.
template <int U, int L>
__global__ void __launch_bounds__(256) warp_chunk_kernel(std::uint8_t* dst, const std::uint8_t* src, std::uint64_t page_bytes, std::uint64_t chunk_bytes,
                                                          int chunks, const Entry* entries, std::int64_t items) {
  const int lane = threadIdx.x % 32;
  const std::int64_t warps = std::int64_t{gridDim.x} * blockDim.x / 32;
  for (std::int64_t item = (std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32; item < items; item += warps) {
    const Entry e = entries[item / chunks];
    const std::uint64_t offset = (item % chunks) * chunk_bytes;
    const std::uint64_t n = (min(chunk_bytes, page_bytes - offset)) / 16;
    const uint4* in = reinterpret_cast<const uint4*>(src + e.src_page * page_bytes + offset);
    uint4* out = reinterpret_cast<uint4*>(dst + e.dst_page * page_bytes + offset);
    for (std::uint64_t base = lane; base < n; base += 32 * U) {
      uint4 v[U];
#pragma unroll
      for (int j = 0; j < U; ++j) {
        const std::uint64_t i = base + 32 * j;
        if (i < n) v[j] = load16<L>(in + i);
      }
#pragma unroll
      for (int j = 0; j < U; ++j) {
        const std::uint64_t i = base + 32 * j;
        if (i < n) out[i] = v[j];
      }
    }
  }
}

using KernelFn = void (*)(std::uint8_t*, const std::uint8_t*, std::uint64_t, std::uint64_t, int, const Entry*, std::int64_t);

template <int U>
KernelFn pick_load(int load) {
  switch (load) {
    case kPlain: return warp_chunk_kernel<U, kPlain>;
    case kNoAllocate: return warp_chunk_kernel<U, kNoAllocate>;
    case kNoAllocate256: return warp_chunk_kernel<U, kNoAllocate256>;
    default: return warp_chunk_kernel<U, kPlain256>;
  }
}

KernelFn pick(int unroll, int load) {
  switch (unroll) {
    case 4: return pick_load<4>(load);
    case 8: return pick_load<8>(load);
    default: return pick_load<16>(load);
  }
}

// Holds a stream until the host opens the gate (a host-mapped word), so every GPU's timed calls are
// queued before any starts and all start together; gives up after about 2^32 cycles (~2 s).
__global__ void gate_kernel(const volatile int* gate) {
  const long long start = clock64();
  while (*gate == 0 && clock64() - start < (1LL << 32)) {
  }
}

// Source content that names its place: word w of GPU g's source half is (g << 56) | w.
__global__ void pattern_kernel(std::uint64_t* words, std::uint64_t count, std::uint64_t gpu) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < count; i += std::uint64_t{gridDim.x} * blockDim.x) {
    words[i] = (gpu << 56) | i;
  }
}

// Counts the words of every destination page that differ from the source page its entry names, on
// the GPU `from` (the pattern above).
__global__ void check_kernel(const std::uint64_t* dst, std::uint64_t page_bytes, const Entry* entries, std::int64_t count, std::uint64_t from,
                             unsigned long long* wrong) {
  const std::uint64_t words = page_bytes / 8;
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < count * words; i += std::uint64_t{gridDim.x} * blockDim.x) {
    const Entry e = entries[i / words];
    const std::uint64_t want = (from << 56) | (e.src_page * words + i % words);
    if (dst[e.dst_page * words + i % words] != want) atomicAdd(wrong, 1ULL);
  }
}

struct Gpu {
  int device = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  std::uint8_t* buffer = nullptr;  // [0, half): sources the next GPU pulls; [half, 2 half): destinations
  Entry* entries = nullptr;
  unsigned long long* wrong = nullptr;
};

int* g_gate = nullptr;  // host-mapped (cudaHostAllocMapped | Portable): every GPU reads it

constexpr std::uint64_t kHalf = 256ULL << 20;
constexpr std::int64_t kEntriesMax = 4096;

// Runs `launch(g)` on every GPU: 2 warm-ups, then `reps` between events, every GPU's queued behind
// one gate opened at once; the slowest GPU's ms per call.
template <typename Launch>
double time_all(std::vector<Gpu>& gpus, int reps, const Launch& launch) {
  for (Gpu& g : gpus) {
    PROBE_CHECK(cudaSetDevice(g.device));
    for (int w = 0; w < 2; ++w) launch(g);
  }
  for (Gpu& g : gpus) {
    PROBE_CHECK(cudaSetDevice(g.device));
    PROBE_CHECK(cudaStreamSynchronize(g.stream));
  }
  *reinterpret_cast<volatile int*>(g_gate) = 0;
  for (Gpu& g : gpus) {
    PROBE_CHECK(cudaSetDevice(g.device));
    int* gate = nullptr;
    PROBE_CHECK(cudaHostGetDevicePointer(&gate, g_gate, 0));
    gate_kernel<<<1, 1, 0, g.stream>>>(gate);
    PROBE_CHECK(cudaEventRecord(g.start, g.stream));
    for (int i = 0; i < reps; ++i) launch(g);
    PROBE_CHECK(cudaEventRecord(g.stop, g.stream));
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
  *reinterpret_cast<volatile int*>(g_gate) = 1;  // every GPU's calls are queued: all start now
  double worst = 0;
  for (Gpu& g : gpus) {
    PROBE_CHECK(cudaSetDevice(g.device));
    PROBE_CHECK(cudaEventSynchronize(g.stop));
    float ms = 0;
    PROBE_CHECK(cudaEventElapsedTime(&ms, g.start, g.stop));
    worst = std::max(worst, static_cast<double>(ms) / reps);
  }
  return worst;
}

// Every visible GPU's buffers, stream, events, entry list and wrong-word counter; the first n
// GPUs each with peer access to the next. The SMs per GPU go to `sms`.
std::vector<Gpu> setup_gpus(int n, int& sms) {
  std::vector<Gpu> gpus(n);
  for (int d = 0; d < n; ++d) {
    Gpu& g = gpus[d];
    g.device = d;
    PROBE_CHECK(cudaSetDevice(d));
    PROBE_CHECK(cudaDeviceEnablePeerAccess((d + 1) % n, 0));
    PROBE_CHECK(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking));
    PROBE_CHECK(cudaEventCreate(&g.start));
    PROBE_CHECK(cudaEventCreate(&g.stop));
    PROBE_CHECK(cudaMalloc(&g.buffer, 2 * kHalf));
    pattern_kernel<<<1024, 256>>>(reinterpret_cast<std::uint64_t*>(g.buffer), kHalf / 8, static_cast<std::uint64_t>(d) + 1);
    PROBE_CHECK(cudaGetLastError());
    PROBE_CHECK(cudaDeviceSynchronize());
    PROBE_CHECK(cudaMalloc(&g.entries, kEntriesMax * sizeof(Entry)));
    PROBE_CHECK(cudaMalloc(&g.wrong, sizeof(unsigned long long)));
    PROBE_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d));
  }
  PROBE_CHECK(cudaHostAlloc(&g_gate, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable));
  return gpus;
}

// What one sweep holds fixed: the GPUs, the reference rate and the knobs it varies.
struct Sweep {
  std::vector<Gpu>& gpus;
  int sms = 0;
  double ce_gbps = 0;  // the copy engines' contiguous 256-MiB pull: the reference every rate is a fraction of
  std::vector<int> unrolls;
  int loads = 0;
};

// One case of the sweep: `count` pages of `page_bytes`, and the best exact rate (and its CSV row)
// pulling [0] and pushing [1].
struct Case {
  std::uint64_t page_bytes = 0;
  std::int64_t count = 0;
  double best_gbps[2] = {0, 0};
  char best_line[2][256] = {"", ""};
};

// One launch shape of the copy kernel.
struct Shape {
  int push = 0;
  std::uint64_t chunk = 0;
  int chunks = 0;
  int unroll = 0;
  int load = 0;
  int per_sm = 0;
  int blocks = 0;
};

// True when every word of every page landed equals the word of the source page its entry names on
// the other GPU (sources carry their GPU and place; with 2 GPUs the next one is the previous one).
bool pages_exact(Sweep& sw, const Case& c) {
  const int n = static_cast<int>(sw.gpus.size());
  bool exact = true;
  for (Gpu& g : sw.gpus) {
    PROBE_CHECK(cudaSetDevice(g.device));
    PROBE_CHECK(cudaMemsetAsync(g.wrong, 0, sizeof(unsigned long long), g.stream));
    check_kernel<<<1024, 256, 0, g.stream>>>(reinterpret_cast<const std::uint64_t*>(g.buffer + kHalf), c.page_bytes, g.entries, c.count,
                                             static_cast<std::uint64_t>((g.device + 1) % n) + 1, g.wrong);
    PROBE_CHECK(cudaGetLastError());
    unsigned long long wrong = 0;
    PROBE_CHECK(cudaMemcpyAsync(&wrong, g.wrong, sizeof(wrong), cudaMemcpyDeviceToHost, g.stream));
    PROBE_CHECK(cudaStreamSynchronize(g.stream));
    exact = exact && wrong == 0;
  }
  return exact;
}

// Times one launch shape on every GPU at once, checks its bytes, prints its CSV row and keeps it
// as the case's best when it is exact and faster.
void run_shape(Sweep& sw, Case& c, const Shape& s) {
  const int n = static_cast<int>(sw.gpus.size());
  const std::int64_t items = c.count * s.chunks;
  const KernelFn kernel = pick(s.unroll, s.load);
  for (Gpu& g : sw.gpus) {
    PROBE_CHECK(cudaSetDevice(g.device));
    PROBE_CHECK(cudaMemsetAsync(g.buffer + kHalf, 0, c.count * c.page_bytes, g.stream));
    PROBE_CHECK(cudaStreamSynchronize(g.stream));
  }
  // Pulling: this GPU's destinations from the next GPU's sources. Pushing: this GPU's sources into
  // the next GPU's destinations (remote stores).
  const double ms = time_all(sw.gpus, 10, [&](Gpu& g) {
    Gpu& next = sw.gpus[(g.device + 1) % n];
    std::uint8_t* dst = s.push ? next.buffer + kHalf : g.buffer + kHalf;
    const std::uint8_t* src = s.push ? g.buffer : next.buffer;
    kernel<<<s.blocks, 256, 0, g.stream>>>(dst, src, c.page_bytes, s.chunk, s.chunks, g.entries, items);
    PROBE_CHECK(cudaGetLastError());
  });
  const bool exact = pages_exact(sw, c);
  const double gbps = static_cast<double>(c.count) * c.page_bytes / (ms * 1e6);
  char line[256];
  std::snprintf(line, sizeof(line), "%s,%llu,%lld,%llu,%d,%s,%d,%d,%.1f,%.3f,%d", s.push ? "push" : "pull",
                static_cast<unsigned long long>(c.page_bytes), static_cast<long long>(c.count), static_cast<unsigned long long>(s.chunk), s.unroll,
                kLoadNames[s.load], s.per_sm, s.blocks, gbps, gbps / sw.ce_gbps, exact ? 1 : 0);
  std::printf("%s\n", line);
  if (exact && gbps > c.best_gbps[s.push]) {
    c.best_gbps[s.push] = gbps;
    std::strcpy(c.best_line[s.push], line);
  }
}

// Every launch shape for one case: pulled and pushed, each chunk size, loads in flight, load
// flavour and blocks per SM (a blocks count the work caps is the smaller per_sm's launch: skipped).
void sweep_shapes(Sweep& sw, Case& c) {
  const std::uint64_t chunk_choices[] = {2048, 4096, 8192, 16384, 1ULL << 30};
  const int per_sm_choices[] = {1, 2, 4, 8};
  for (int push = 0; push < 2; ++push) {
    for (std::uint64_t chunk_wanted : chunk_choices) {
      const std::uint64_t chunk = std::min(chunk_wanted, c.page_bytes);
      if (chunk_wanted != chunk_choices[4] && chunk_wanted >= c.page_bytes) continue;  // same as a whole page
      const int chunks = static_cast<int>((c.page_bytes + chunk - 1) / chunk);
      const std::int64_t items = c.count * chunks;
      for (int unroll : sw.unrolls) {
        for (int load = 0; load < sw.loads; ++load) {
          if (push && (unroll != 8 || load != kPlain)) continue;  // pushing: the loads are local
          int previous_blocks = 0;
          for (int per_sm : per_sm_choices) {
            const int blocks = static_cast<int>(std::min<std::int64_t>((items + 7) / 8, std::int64_t{sw.sms} * per_sm));
            if (blocks == previous_blocks) continue;
            previous_blocks = blocks;
            run_shape(sw, c, Shape{push, chunk, chunks, unroll, load, per_sm, blocks});
          }
        }
      }
    }
  }
}

// One case: its entries uploaded, the copy engines moving the same bytes in one contiguous copy
// (pulled and pushed: what the link gives a transfer this small, latency and launch included),
// then every launch shape; the case's line on stderr.
void sweep_case(Sweep& sw, std::uint64_t page_bytes, std::int64_t count) {
  const int n = static_cast<int>(sw.gpus.size());
  const std::int64_t source_pages = static_cast<std::int64_t>(kHalf / page_bytes);
  std::vector<Entry> entries;
  for (std::int64_t i = 0; i < count; ++i) entries.push_back({i, (i * 7919) % source_pages});
  for (Gpu& g : sw.gpus) {
    PROBE_CHECK(cudaSetDevice(g.device));
    PROBE_CHECK(cudaMemcpy(g.entries, entries.data(), entries.size() * sizeof(Entry), cudaMemcpyHostToDevice));
  }
  const double bytes = static_cast<double>(count) * page_bytes;
  const double ce_pull_same = bytes / (time_all(sw.gpus, 10, [&](Gpu& g) {
    PROBE_CHECK(cudaMemcpyAsync(g.buffer + kHalf, sw.gpus[(g.device + 1) % n].buffer, count * page_bytes, cudaMemcpyDeviceToDevice, g.stream));
  }) * 1e6);
  const double ce_push_same = bytes / (time_all(sw.gpus, 10, [&](Gpu& g) {
    PROBE_CHECK(cudaMemcpyAsync(sw.gpus[(g.device + 1) % n].buffer + kHalf, g.buffer, count * page_bytes, cudaMemcpyDeviceToDevice, g.stream));
  }) * 1e6);
  Case c;
  c.page_bytes = page_bytes;
  c.count = count;
  sweep_shapes(sw, c);
  std::fprintf(stderr, "%llu B x %lld pages: copy engines, same bytes contiguous: pull %.3f, push %.3f of the big pull\n  best %s\n  best %s\n",
               static_cast<unsigned long long>(page_bytes), static_cast<long long>(count), ce_pull_same / sw.ce_gbps, ce_push_same / sw.ce_gbps,
               c.best_line[0], c.best_line[1]);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  int n = 0;
  PROBE_CHECK(cudaGetDeviceCount(&n));
  if (n < 2) {
    std::fprintf(stderr, "gather_probe: needs 2 GPUs with peer access, found %d\n", n);
    return 1;
  }
  n = 2;
  int sms = 0;
  std::vector<Gpu> gpus = setup_gpus(n, sms);
  const double ce_ms = time_all(gpus, 5, [&](Gpu& g) {
    PROBE_CHECK(cudaMemcpyAsync(g.buffer + kHalf, gpus[(g.device + 1) % n].buffer, kHalf, cudaMemcpyDeviceToDevice, g.stream));
  });
  // --quick: the knobs the first full run (2026-11-30) found to make no difference are held at one value.
  Sweep sw{gpus, sms, kHalf / (ce_ms * 1e6), quick ? std::vector<int>{8} : std::vector<int>{4, 8, 16}, quick ? 1 : kLoads};
  std::printf("direction,page_bytes,pages,chunk_bytes,unroll,load,blocks_per_sm,blocks,gbps,of_ce,exact\n");
  std::fprintf(stderr, "copy engines, contiguous pull of %llu MiB, every GPU at once: %.1f GB/s (%d SMs)\n",
               static_cast<unsigned long long>(kHalf >> 20), sw.ce_gbps, sms);
  const std::uint64_t page_sizes[] = {41984, 8448};  // kv_fp8 and indexer pages of 64 rows
  const std::int64_t counts[] = {64, 256, 1024, 4096};
  for (std::uint64_t page_bytes : page_sizes) {
    for (std::int64_t count : counts) sweep_case(sw, page_bytes, count);
  }
  return 0;
}

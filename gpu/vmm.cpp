#include "vmm.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <utility>

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <fmt/format.h>

#include "cpkv/harness/probe.hpp"

namespace cpkv::cuda {

namespace {

// The driver calls this file makes, resolved once through the runtime.
struct Driver {
  PFN_cuMemAddressReserve_v10020 reserve = nullptr;
  PFN_cuMemAddressFree_v10020 address_free = nullptr;
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;
  PFN_cuMemExportToShareableHandle_v10020 export_handle = nullptr;
  PFN_cuMemImportFromShareableHandle_v10020 import_handle = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
  PFN_cuDeviceGetAttribute_v2000 attribute = nullptr;
  PFN_cuGetErrorString_v6000 error_string = nullptr;
};

template <typename F>
void resolve(const char* symbol, F& out) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status{};
  if (cudaGetDriverEntryPointByVersion(symbol, &fn, 12000, cudaEnableDefault, &status) != cudaSuccess || fn == nullptr) {
    throw std::runtime_error(fmt::format("the CUDA driver has no entry point {} (status {})", symbol, static_cast<int>(status)));
  }
  out = reinterpret_cast<F>(fn);
}

const Driver& driver() {
  static const Driver d = [] {
    Driver x;
    resolve("cuMemAddressReserve", x.reserve);
    resolve("cuMemAddressFree", x.address_free);
    resolve("cuMemCreate", x.create);
    resolve("cuMemRelease", x.release);
    resolve("cuMemMap", x.map);
    resolve("cuMemUnmap", x.unmap);
    resolve("cuMemSetAccess", x.set_access);
    resolve("cuMemExportToShareableHandle", x.export_handle);
    resolve("cuMemImportFromShareableHandle", x.import_handle);
    resolve("cuMemGetAllocationGranularity", x.granularity);
    resolve("cuDeviceGetAttribute", x.attribute);
    resolve("cuGetErrorString", x.error_string);
    return x;
  }();
  return d;
}

void check(CUresult result, const char* what) {
  if (result == CUDA_SUCCESS) return;
  const char* text = nullptr;
  if (driver().error_string(result, &text) != CUDA_SUCCESS || text == nullptr) text = "unknown error";
  throw std::runtime_error(fmt::format("{} failed: {} (CUresult {})", what, text, static_cast<int>(result)));
}

CUmemAllocationProp allocation_prop(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

CUmemAccessDesc access_for(int device) {
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return access;
}

void probe_one(int d, DeviceProbe& out) {
  const Driver& drv = driver();
  std::size_t free = 0, total = 0;
  if (cudaSetDevice(d) != cudaSuccess || cudaMemGetInfo(&free, &total) != cudaSuccess) {
    std::snprintf(out.error, sizeof(out.error), "cudaMemGetInfo on device %d: %s", d, cudaGetErrorString(cudaGetLastError()));
    return;
  }
  out.free[d] = free;
  out.total[d] = total;
  int vmm = 0, fd = 0;
  check(drv.attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, d), "cuDeviceGetAttribute");
  check(drv.attribute(&fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, d), "cuDeviceGetAttribute");
  out.vmm[d] = vmm != 0 && fd != 0 ? 1 : 0;
  std::size_t granularity = 0;
  const CUmemAllocationProp prop = allocation_prop(d);
  check(drv.granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity");
  out.granularity[d] = granularity;
}

struct Deadline {
  std::chrono::steady_clock::time_point at;
  std::int64_t ms;  // the bound it was set from, for the message
};

// Waits until `socket` is ready for `events`, or throws when the deadline passes.
void wait_ready(int socket, short events, const Deadline& deadline, const char* what) {
  while (true) {
    const std::int64_t left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline.at - std::chrono::steady_clock::now()).count();
    if (left <= 0) throw std::runtime_error(fmt::format("waited {} ms to {} pool handles over the rank socket", deadline.ms, what));
    pollfd p{socket, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left, 1000)));
    if (n > 0) return;
    if (n < 0 && errno != EINTR) throw std::runtime_error(fmt::format("poll on the rank socket: {}", std::strerror(errno)));
  }
}

constexpr std::size_t kFdsPerMessage = 64;
struct FdHeader {
  std::uint64_t first = 0;
  std::uint32_t count = 0;
};

}  // namespace

DeviceProbe probe_devices() {
  DeviceProbe probe;
  const harness::ProbeOutcome outcome = harness::run_probe<DeviceProbe>([](DeviceProbe& out) {
    if (cudaGetDeviceCount(&out.count) != cudaSuccess) out.count = 0;
    out.count = std::clamp(out.count, 0, kDevicesMax);
    try {
      for (int d = 0; d < out.count && out.error[0] == '\0'; ++d) probe_one(d, out);
    } catch (const std::exception& e) {
      std::snprintf(out.error, sizeof(out.error), "%s", e.what());
    }
  }, probe, std::chrono::seconds(60));
  if (!outcome.answered) probe = DeviceProbe{};
  return probe;
}

FdChannels::FdChannels(std::int32_t cp) : cp_(cp), ends_(static_cast<std::size_t>(2 * cp * cp), -1) {
  for (std::int32_t i = 0; i < cp; ++i) {
    for (std::int32_t j = i + 1; j < cp; ++j) {
      int sv[2];
      if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
        const int error = errno;
        for (int& fd : ends_) if (fd >= 0) ::close(fd);
        throw std::runtime_error(fmt::format("socketpair for ranks {} and {}: {}", i, j, std::strerror(error)));
      }
      ends_[2 * (i * cp + j)] = sv[0];
      ends_[2 * (i * cp + j) + 1] = sv[1];
    }
  }
}

FdChannels::~FdChannels() {
  for (int fd : ends_) {
    if (fd >= 0) ::close(fd);
  }
}

std::vector<int> FdChannels::own_ends(std::int32_t rank) {
  std::vector<int> own(cp_, -1);
  for (std::int32_t i = 0; i < cp_; ++i) {
    for (std::int32_t j = i + 1; j < cp_; ++j) {
      int& a = ends_[2 * (i * cp_ + j)];
      int& b = ends_[2 * (i * cp_ + j) + 1];
      if (rank == i) own[j] = std::exchange(a, -1);
      if (rank == j) own[i] = std::exchange(b, -1);
      for (int* fd : {&a, &b}) {
        if (*fd >= 0) ::close(std::exchange(*fd, -1));
      }
    }
  }
  return own;
}

namespace {

// One message: the header (the first descriptor's index, the count) and up to kFdsPerMessage descriptors.
void send_message(int socket, std::uint64_t first, const int* fds, std::size_t count, const Deadline& deadline) {
  FdHeader header{first, static_cast<std::uint32_t>(count)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kFdsPerMessage)] = {};
  iovec iov{&header, sizeof(header)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (count > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * count);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * count);
    std::memcpy(CMSG_DATA(c), fds, sizeof(int) * count);
  }
  wait_ready(socket, POLLOUT, deadline, "send");
  if (::sendmsg(socket, &msg, MSG_NOSIGNAL | MSG_DONTWAIT) != static_cast<ssize_t>(sizeof(header))) {
    throw std::runtime_error(fmt::format("sending pool handles {}..{} over the rank socket: {}", first, first + count, std::strerror(errno)));
  }
}

// One message's descriptors, which must start at `first`; throws (closing what came) otherwise.
std::vector<int> receive_message(int socket, std::uint64_t first, std::size_t count, const Deadline& deadline) {
  FdHeader header;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kFdsPerMessage)] = {};
  iovec iov{&header, sizeof(header)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  wait_ready(socket, POLLIN, deadline, "receive");
  const ssize_t n = ::recvmsg(socket, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  const int error = errno;
  std::vector<int> fds;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); n > 0 && c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const int* data = reinterpret_cast<const int*>(CMSG_DATA(c));
    fds.insert(fds.end(), data, data + (c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
  }
  const auto fail = [&](const std::string& why) {
    for (int fd : fds) ::close(fd);
    return std::runtime_error(fmt::format("receiving pool handle {} of {} over the rank socket: {}", first, count, why));
  };
  if (n != static_cast<ssize_t>(sizeof(header))) throw fail(n == 0 ? "the peer closed it" : n < 0 ? std::strerror(error) : "a short message");
  if ((msg.msg_flags & MSG_CTRUNC) != 0) throw fail("the control message was truncated (the descriptor limit?)");
  if (header.first != first || header.count != fds.size()) throw fail(fmt::format("a message of {} from {} came", fds.size(), header.first));
  return fds;
}

}  // namespace

void send_fds(int socket, const std::vector<int>& fds, std::int64_t ms) {
  const Deadline deadline{std::chrono::steady_clock::now() + std::chrono::milliseconds(ms), ms};
  std::size_t first = 0;
  do {
    const std::size_t count = std::min(kFdsPerMessage, fds.size() - first);
    send_message(socket, first, fds.data() + first, count, deadline);
    first += count;
  } while (first < fds.size());
}

void receive_fds(int socket, std::size_t count, std::int64_t ms, const std::function<void(std::size_t first, std::vector<int>& fds)>& consume) {
  const Deadline deadline{std::chrono::steady_clock::now() + std::chrono::milliseconds(ms), ms};
  std::size_t first = 0;
  do {
    std::vector<int> fds = receive_message(socket, first, count, deadline);
    if (first + fds.size() > count) {
      for (int fd : fds) ::close(fd);
      throw std::runtime_error(fmt::format("receiving pool handles over the rank socket: {} came, {} expected", first + fds.size(), count));
    }
    const std::size_t got = fds.size();  // consume may take them out of the vector
    try {
      consume(first, fds);
    } catch (...) {
      for (int fd : fds) if (fd >= 0) ::close(fd);
      throw;
    }
    first += got;
    if (got == 0 && first < count) throw std::runtime_error(fmt::format("receiving pool handles over the rank socket: an empty message at {} of {}", first, count));
  } while (first < count);
}

std::vector<int> receive_fds(int socket, std::size_t count, std::int64_t ms) {
  std::vector<int> all;
  try {
    receive_fds(socket, count, ms, [&](std::size_t, std::vector<int>& fds) {
      all.insert(all.end(), fds.begin(), fds.end());
      fds.clear();
    });
  } catch (...) {
    for (int fd : all) ::close(fd);
    throw;
  }
  return all;
}

VmmPool create_pool(int device, std::uint64_t reserved, const std::vector<ByteRun>& runs) {
  const Driver& drv = driver();
  VmmPool pool;
  pool.reserved = reserved;
  pool.runs = runs;
  CUdeviceptr base = 0;
  check(drv.reserve(&base, reserved, 0, 0, 0), "cuMemAddressReserve of the pool");
  pool.base = base;
  const CUmemAllocationProp prop = allocation_prop(device);
  const CUmemAccessDesc access = access_for(device);
  for (const ByteRun& run : runs) {
    if (run.offset + run.bytes > reserved) throw std::logic_error(fmt::format("pool run {}+{} past the {}-byte reservation", run.offset, run.bytes, reserved));
    CUmemGenericAllocationHandle handle = 0;
    check(drv.create(&handle, run.bytes, &prop, 0), "cuMemCreate of a pool chunk");
    pool.handles.push_back(handle);
    check(drv.map(base + run.offset, run.bytes, 0, handle, 0), "cuMemMap of a pool chunk");
    check(drv.set_access(base + run.offset, run.bytes, &access, 1), "cuMemSetAccess of a pool chunk");
  }
  return pool;
}

void send_pool(int socket, const VmmPool& pool, std::int64_t ms) {
  const Deadline deadline{std::chrono::steady_clock::now() + std::chrono::milliseconds(ms), ms};
  std::size_t first = 0;
  do {  // exported a message at a time: never more than kFdsPerMessage descriptors open
    std::vector<int> fds;
    const std::size_t count = std::min(kFdsPerMessage, pool.handles.size() - first);
    try {
      for (std::size_t i = first; i < first + count; ++i) {
        int fd = -1;
        check(driver().export_handle(&fd, pool.handles[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), "cuMemExportToShareableHandle");
        fds.push_back(fd);
      }
      send_message(socket, first, fds.data(), count, deadline);
    } catch (...) {
      for (int fd : fds) ::close(fd);
      throw;
    }
    for (int fd : fds) ::close(fd);
    first += count;
  } while (first < pool.handles.size());
}

bool receive_pool(int socket, int device, std::uint64_t reserved, const std::vector<ByteRun>& runs, std::int64_t ms, VmmPool& out) {
  const Driver& drv = driver();
  out = VmmPool{};
  CUdeviceptr base = 0;
  check(drv.reserve(&base, reserved, 0, 0, 0), "cuMemAddressReserve of a peer's pool");
  out.base = base;
  out.reserved = reserved;
  const CUmemAccessDesc access = access_for(device);
  bool granted = true;
  try {
    receive_fds(socket, runs.size(), ms, [&](std::size_t first, std::vector<int>& fds) {
      for (std::size_t i = 0; i < fds.size(); ++i) {
        const ByteRun& run = runs[first + i];
        CUmemGenericAllocationHandle handle = 0;
        const CUresult imported = drv.import_handle(&handle, reinterpret_cast<void*>(static_cast<std::intptr_t>(fds[i])), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        ::close(std::exchange(fds[i], -1));
        check(imported, "cuMemImportFromShareableHandle");
        const CUresult mapped = drv.map(base + run.offset, run.bytes, 0, handle, 0);
        check(drv.release(handle), "cuMemRelease of an imported chunk");  // the mapping holds it from here
        check(mapped, "cuMemMap of a peer's chunk");
        out.runs.push_back(run);
        granted = granted && drv.set_access(base + run.offset, run.bytes, &access, 1) == CUDA_SUCCESS;
      }
    });
  } catch (...) {
    release_pool(out);
    throw;
  }
  if (!granted) release_pool(out);
  return granted;
}

void release_pool(VmmPool& pool) {
  if (pool.base == 0) return;
  const Driver& drv = driver();
  for (const ByteRun& run : pool.runs) check(drv.unmap(pool.base + run.offset, run.bytes), "cuMemUnmap");
  for (std::uint64_t handle : pool.handles) check(drv.release(handle), "cuMemRelease");
  check(drv.address_free(pool.base, pool.reserved), "cuMemAddressFree");
  pool = VmmPool{};
}

}  // namespace cpkv::cuda

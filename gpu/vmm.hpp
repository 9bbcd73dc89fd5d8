// The pool slabs through CUDA virtual memory management: each rank reserves its whole pool as
// address space, backs only the chunks pool_backing.hpp lists (cuMemCreate, exportable as POSIX
// file descriptors), maps them, and hands the descriptors to every peer over a Unix socket
// (SCM_RIGHTS); a peer imports them and maps them at the same offsets of its own reservation of
// that rank's pool. The driver API comes through the runtime's entry points (no link to libcuda,
// so the CPU tests of this library start on a machine without a driver). Also the parent's probe
// of every device's free memory and granularity, in a forked child (fork-safety).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pool_backing.hpp"

namespace cpkv::cuda {

inline constexpr int kDevicesMax = 16;

// What a forked child found on the devices (count 0: no driver, no device, or the probe hung).
struct DeviceProbe {
  int count = 0;
  std::uint64_t free[kDevicesMax] = {};
  std::uint64_t total[kDevicesMax] = {};
  std::uint64_t granularity[kDevicesMax] = {};  // cuMemGetAllocationGranularity, minimum, for a pinned device allocation
  int vmm[kDevicesMax] = {};                    // virtual memory management and POSIX file descriptor handles supported
  char error[160] = {};                         // the first failing call, when one failed
};
DeviceProbe probe_devices();

// One SOCK_SEQPACKET socket pair per pair of ranks, made in the parent before the ranks fork; each
// rank keeps its own ends (own_ends) and closes the rest. The parent closes every end it holds
// when the object goes.
class FdChannels {
 public:
  explicit FdChannels(std::int32_t cp);
  FdChannels(const FdChannels&) = delete;
  FdChannels& operator=(const FdChannels&) = delete;
  ~FdChannels();
  // In rank `rank`: closes every end not its own; returns its end towards each peer (-1 for itself).
  std::vector<int> own_ends(std::int32_t rank);

 private:
  std::int32_t cp_;
  std::vector<int> ends_;  // [2 * (i * cp + j)], i < j: end 0 for rank i, end 1 for rank j
};

// Sends `fds` to the peer on `socket` (messages of up to 64, each naming its first index), within `ms` milliseconds.
void send_fds(int socket, const std::vector<int>& fds, std::int64_t ms);
// Receives the `count` descriptors send_fds (or send_pool) sends, handing each message's to
// `consume` (with the index of its first; what it leaves open in the vector is closed here on a
// throw). Throws on a timeout, a closed peer, a message out of order, or a truncated control message.
void receive_fds(int socket, std::size_t count, std::int64_t ms, const std::function<void(std::size_t first, std::vector<int>& fds)>& consume);
// All `count` at once (the caller closes them).
std::vector<int> receive_fds(int socket, std::size_t count, std::int64_t ms);

// How a group's pools are held, decided in the parent before the ranks fork: the pool plan (the
// mode, the layout, the reservation, every rank's runs, identical on every rank: a peer maps rank
// p's descriptors at runs[p]'s offsets) and the socket pairs (sparse only).
struct PoolShare {
  PoolPlan plan;                             // sparse or dense, the layout every rank carves, each rank's reservation and (sparse) backed runs
  std::unique_ptr<FdChannels> channels;
};

// A rank's own pool: the reservation, its backed runs, their allocation handles.
struct VmmPool {
  std::uint64_t base = 0;
  std::uint64_t reserved = 0;
  std::vector<ByteRun> runs;
  std::vector<std::uint64_t> handles;
};
// Reserves `reserved` bytes on `device`, creates and maps every run (read-write for `device`).
VmmPool create_pool(int device, std::uint64_t reserved, const std::vector<ByteRun>& runs);
// The pool's handles to the peer on `socket` as file descriptors, exported a message at a time
// (never more than 64 open), within `ms` milliseconds.
void send_pool(int socket, const VmmPool& pool, std::int64_t ms);
// A peer's pool in this process: a reservation of `reserved` bytes and every run imported from the
// descriptors arriving on `socket` (each closed once imported) and mapped at its offset. Returns
// false (nothing left mapped) when `device` cannot be granted access (no peer access between the
// GPUs); throws on any other failure.
bool receive_pool(int socket, int device, std::uint64_t reserved, const std::vector<ByteRun>& runs, std::int64_t ms, VmmPool& out);
// Unmaps every run, releases the own handles, frees the reservation.
void release_pool(VmmPool& pool);

}  // namespace cpkv::cuda

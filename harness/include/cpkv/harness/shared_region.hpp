// A named POSIX shared-memory region (Boost.Interprocess) that outlives fork() and is removed when its
// owner goes away. Names are unique per run: "cpkv.<pid>.<serial>". The creator holds a shared flock
// on the region's file from before its first byte, inherited by its forked ranks; a region that no
// process holds and whose creator pid does not run is stale and removed by sweep_stale_regions(), so
// a crashed or killed run never leaves a name behind for the next one, and a live run in another PID
// namespace sharing /dev/shm (a container) never loses its region.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>

namespace cpkv::harness {

// /dev/shm cannot hold a region: bad input for the run as asked (exit 2), never a SIGBUS later.
class SharedMemoryFull : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class SharedRegion {
 public:
  // Creates a new zero-filled region of `bytes` bytes, owned by this process, its pages reserved up
  // front (posix_fallocate): a /dev/shm too small for it throws SharedMemoryFull naming the bytes
  // needed and free, instead of a SIGBUS when a page is first touched. The first region a process
  // creates also sweeps the stale regions of dead processes (every subcommand that makes one).
  // The name is tracked for removal on SIGINT/SIGTERM (cpkv/harness/interrupt.hpp).
  static SharedRegion create(std::size_t bytes);
  // The same, reserving only these ranges (a sparse region: the rest is never written).
  struct ByteRange {
    std::uint64_t offset = 0;
    std::uint64_t bytes = 0;
  };
  static SharedRegion create(std::size_t bytes, const std::vector<ByteRange>& reserve);
  SharedRegion(SharedRegion&&) noexcept;
  SharedRegion& operator=(SharedRegion&&) = delete;
  SharedRegion(const SharedRegion&) = delete;
  ~SharedRegion();  // the owner removes the name; forked children never do (they leave with _exit)

  std::uint8_t* base() const { return static_cast<std::uint8_t*>(region_.get_address()); }
  std::size_t size() const { return region_.get_size(); }
  const std::string& name() const { return name_; }

  template <typename T>
  T* at(std::uint64_t offset) const {
    return reinterpret_cast<T*>(base() + offset);
  }

 private:
  SharedRegion(std::string name, boost::interprocess::mapped_region region, int owner_pid, int alive_fd);
  std::string name_;
  boost::interprocess::mapped_region region_;
  int owner_pid_;
  int alive_fd_ = -1;  // holds the liveness flock (LOCK_SH) while this region lives
};

// Bytes free in /dev/shm now (UINT64_MAX if it cannot be asked).
std::uint64_t shm_free_bytes();

// A size for a message, never "0 MiB" for a few KiB (issue 22, item 23): "512 KiB", "3.2 MiB", "40 MiB".
std::string size_text(std::uint64_t bytes);

// Removes every cpkv region that is stale: its creator's pid does not run in this PID namespace, no
// process holds its liveness flock, and it is not empty (an empty one may be a creator's between
// making and locking it). Returns how many it removed.
int sweep_stale_regions();

// True if a region of that name exists now (tests use it to prove nothing is left behind).
bool region_exists(const std::string& name);

}  // namespace cpkv::harness

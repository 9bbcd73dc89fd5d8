// A named POSIX shared-memory region (Boost.Interprocess) that outlives fork() and is removed when its
// owner goes away. Names are unique per run: "cpkv.<pid>.<serial>". A region whose creator process is
// dead is stale and removed by sweep_stale_regions(), so a crashed or killed run never leaves a name
// behind for the next one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>

namespace cpkv::sim {

class SharedRegion {
 public:
  // Creates a new zero-filled region of `bytes` bytes, owned by this process.
  static SharedRegion create(std::size_t bytes);
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
  SharedRegion(std::string name, boost::interprocess::mapped_region region, int owner_pid);
  std::string name_;
  boost::interprocess::mapped_region region_;
  int owner_pid_;
};

// Removes every cpkv region whose creator process no longer exists. Returns how many it removed.
int sweep_stale_regions();

// True if a region of that name exists now (tests use it to prove nothing is left behind).
bool region_exists(const std::string& name);

}  // namespace cpkv::sim

#include "cpkv/sim/shared_region.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>

namespace cpkv::sim {

namespace bip = boost::interprocess;

namespace {
constexpr std::string_view kPrefix = "cpkv.";

std::string fresh_name() {
  static std::atomic<std::uint64_t> serial{0};
  return fmt::format("{}{}.{}", kPrefix, ::getpid(), serial.fetch_add(1));
}

// The pid encoded in a region name, or -1 if the name is not one of ours.
int creator_pid(const std::string& name) {
  if (name.rfind(kPrefix, 0) != 0) return -1;
  const std::size_t dot = name.find('.', kPrefix.size());
  if (dot == std::string::npos) return -1;
  try {
    return std::stoi(name.substr(kPrefix.size(), dot - kPrefix.size()));
  } catch (const std::exception&) {
    return -1;
  }
}
}  // namespace

SharedRegion SharedRegion::create(std::size_t bytes) {
  const std::string name = fresh_name();
  bip::shared_memory_object::remove(name.c_str());
  try {
    bip::shared_memory_object object(bip::create_only, name.c_str(), bip::read_write);
    object.truncate(static_cast<bip::offset_t>(bytes));  // tmpfs pages read as zero until written
    bip::mapped_region region(object, bip::read_write);
    return SharedRegion(name, std::move(region), ::getpid());
  } catch (const bip::interprocess_exception& e) {
    bip::shared_memory_object::remove(name.c_str());  // never leave the name behind
    throw std::runtime_error(fmt::format("cannot create shared memory region {} of {} bytes: {}", name, bytes, e.what()));
  }
}

SharedRegion::SharedRegion(std::string name, bip::mapped_region region, int owner_pid)
    : name_(std::move(name)), region_(std::move(region)), owner_pid_(owner_pid) {}

SharedRegion::SharedRegion(SharedRegion&& other) noexcept
    : name_(std::move(other.name_)), region_(std::move(other.region_)), owner_pid_(other.owner_pid_) {
  other.owner_pid_ = -1;
  other.name_.clear();
}

SharedRegion::~SharedRegion() {
  if (owner_pid_ == ::getpid() && !name_.empty()) bip::shared_memory_object::remove(name_.c_str());
}

int sweep_stale_regions() {
  int removed = 0;
  const std::filesystem::path shm = "/dev/shm";
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(shm, error)) {
    const std::string name = entry.path().filename().string();
    const int pid = creator_pid(name);
    if (pid <= 0) continue;
    if (::kill(pid, 0) == 0 || errno == EPERM) continue;  // creator alive
    if (bip::shared_memory_object::remove(name.c_str())) ++removed;
  }
  return removed;
}

bool region_exists(const std::string& name) {
  return std::filesystem::exists(std::filesystem::path("/dev/shm") / name);
}

}  // namespace cpkv::sim

#include "cpkv/harness/temp_files.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>

#include <fmt/format.h>

namespace cpkv::harness {

namespace {

// The pid in "<prefix>-<pid>-...", or -1 when `name` is not one of ours.
pid_t creator_pid(std::string_view name, std::string_view prefix) {
  if (name.size() <= prefix.size() + 1 || name.substr(0, prefix.size()) != prefix || name[prefix.size()] != '-') return -1;
  std::int64_t pid = 0;
  std::size_t at = prefix.size() + 1;
  for (; at < name.size() && name[at] >= '0' && name[at] <= '9' && pid < (std::int64_t{1} << 31); ++at) pid = pid * 10 + (name[at] - '0');
  if (at == prefix.size() + 1 || at >= name.size() || name[at] != '-' || pid <= 0 || pid >= (std::int64_t{1} << 31)) return -1;
  return static_cast<pid_t>(pid);
}

}  // namespace

std::string temp_folder() {
  const char* env = std::getenv("TMPDIR");
  const bool from_env = env != nullptr && *env != '\0';
  const std::string folder = from_env ? env : "/tmp";
  // Named as the user set it: "filesystem error: temp_directory_path" named neither (issue 22, item 22).
  const auto refuse = [&](const std::string& why) -> std::runtime_error {
    return std::runtime_error(fmt::format("{}{}: {}; temporary files need a writable folder", from_env ? "TMPDIR=" : "", folder, why));
  };
  struct stat st {};
  if (::stat(folder.c_str(), &st) != 0) throw refuse(std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) throw refuse("not a folder");
  if (::access(folder.c_str(), W_OK | X_OK) != 0) throw refuse(std::strerror(errno));
  return folder;
}

std::string temp_stem(std::string_view prefix) { return fmt::format("{}-{}-", prefix, ::getpid()); }

std::string private_folder(const std::string& prefix) {
  static std::mutex mutex;
  static std::map<std::pair<pid_t, std::string>, std::string> made;  // keyed by pid too: a fork makes its own
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::pair{::getpid(), prefix};
  if (const auto it = made.find(key); it != made.end()) return it->second;
  std::string name = fmt::format("{}/{}XXXXXX", temp_folder(), temp_stem(prefix));
  if (::mkdtemp(name.data()) == nullptr) throw std::runtime_error(fmt::format("cannot create a private folder {}: {}", name, std::strerror(errno)));
  made.emplace(key, name);
  return name;
}

std::string owned_output_folder(const std::string& option, const std::string& dir) {
  const auto refuse = [&](const std::string& why) { return std::runtime_error(fmt::format("{} {}: {}", option, dir, why)); };
  if (dir.empty()) throw refuse("an empty name is no folder");
  if (::mkdir(dir.c_str(), 0700) == 0) return dir;
  if (errno != EEXIST) throw refuse(fmt::format("cannot create it: {}", std::strerror(errno)));
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) throw refuse(std::strerror(errno));
  if (S_ISLNK(st.st_mode)) throw refuse("a symbolic link (name the folder itself)");
  if (!S_ISDIR(st.st_mode)) throw refuse("exists and is not a folder");
  if (st.st_uid != ::geteuid()) throw refuse(fmt::format("owned by uid {}, not by this user", st.st_uid));
  if ((st.st_mode & S_IWOTH) != 0) throw refuse("writable by others (anyone could plant links in it)");
  if (::access(dir.c_str(), W_OK | X_OK) != 0) throw refuse(std::strerror(errno));
  return dir;
}

int write_all(int fd, std::string_view content) {
  for (std::size_t done = 0; done < content.size();) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO;  // a write that makes no progress would loop for ever
    done += static_cast<std::size_t>(n);
  }
  return 0;
}

void write_new_file(const std::string& path, std::string_view content) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) throw std::runtime_error(fmt::format("cannot write {}: {}", path, std::strerror(errno)));
  int error = write_all(fd, content);
  // close reports what a network or quota-bound file system only notices at the end.
  if (::close(fd) != 0 && error == 0) error = errno;
  if (error == 0) return;
  ::unlink(path.c_str());  // ours: O_EXCL made it
  throw std::runtime_error(fmt::format("cannot write {}: {}", path, std::strerror(error)));
}

void replace_private_file(const std::string& path, std::string_view content) {
  static std::atomic<std::uint64_t> serial{0};
  const std::string fresh = fmt::format("{}.{}.{}.new", path, ::getpid(), serial.fetch_add(1));
  write_new_file(fresh, content);
  if (::rename(fresh.c_str(), path.c_str()) == 0) return;
  const int error = errno;
  ::unlink(fresh.c_str());
  throw std::runtime_error(fmt::format("cannot write {}: {}", path, std::strerror(error)));
}

int sweep_dead_temporaries(const std::string& folder, std::string_view prefix) {
  DIR* dir = ::opendir(folder.c_str());
  if (dir == nullptr) return 0;
  int removed = 0;
  const uid_t me = ::geteuid();
  while (const dirent* entry = ::readdir(dir)) {
    const pid_t pid = creator_pid(entry->d_name, prefix);
    if (pid < 0 || pid == ::getpid()) continue;
    if (::kill(pid, 0) == 0 || errno == EPERM) continue;  // its creator is alive
    struct stat st {};
    if (::fstatat(::dirfd(dir), entry->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) || st.st_uid != me) continue;
    removed += ::unlinkat(::dirfd(dir), entry->d_name, 0) == 0 ? 1 : 0;
  }
  ::closedir(dir);
  return removed;
}

}  // namespace cpkv::harness

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
#include <optional>
#include <stdexcept>
#include <vector>

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

std::string printable(std::string_view text) {
  std::string out;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) out += fmt::format("\\x{:02x}", byte);
    else out += c;
  }
  return out;
}

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

namespace {

// The folders owned_output_folder() opened, by the name it returned: every file made in one is made
// relative to its descriptor (issue 34, item 9: a folder swapped for a link after the check got 42
// counterexample files written through the link). Kept for the life of the process; forked ranks
// inherit the descriptors.
struct OpenedFolder {
  std::string name;
  int fd = -1;
};
std::mutex g_folders_mutex;
std::vector<OpenedFolder>& opened_folders() {
  static std::vector<OpenedFolder> folders;
  return folders;
}

// "DIR", "DIR/", "DIR/." and "DIR/./" name one folder; the last component must be the folder itself,
// so that O_NOFOLLOW sees a link there (issue 34, item 20: `link/` and `link/.` went through it).
std::string folder_name(std::string dir) {
  for (bool changed = true; changed && dir.size() > 1;) {
    changed = false;
    if (dir.back() == '/') dir.pop_back(), changed = true;
    else if (dir.size() >= 2 && dir.compare(dir.size() - 2, 2, "/.") == 0) dir.resize(dir.size() - 2), changed = true;
  }
  return dir.empty() ? std::string("/") : dir;
}

// Why `st`, the folder opened, is not one this user's files may go into, or "".
std::string unsafe_folder(const struct stat& st) {
  if (!S_ISDIR(st.st_mode)) return "exists and is not a folder";
  if (st.st_uid != ::geteuid()) return fmt::format("owned by uid {}, not by this user", st.st_uid);
  if ((st.st_mode & S_IWOTH) != 0) return "writable by others (anyone could plant links in it)";
  // This user's own group is this user's choice; any other group's members could plant links.
  if ((st.st_mode & S_IWGRP) != 0 && st.st_gid != ::getegid()) return fmt::format("writable by group {}, not this user's own group (its members could plant links in it)", st.st_gid);
  return "";
}

}  // namespace

std::string owned_output_folder(const std::string& option, const std::string& dir) {
  const auto refuse = [&](const std::string& why) { return std::runtime_error(fmt::format("{} {}: {}", option, printable(dir), why)); };
  if (dir.empty()) throw refuse("an empty name is no folder");
  for (const char c : dir) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) throw refuse("a control character in the name (it would break every line that names a file in it)");
  }
  const std::string name = folder_name(dir);
  const bool made = ::mkdir(name.c_str(), 0700) == 0;
  if (!made && errno != EEXIST) throw refuse(fmt::format("cannot create it: {}", std::strerror(errno)));
  // Opened once, the last component never followed; what is checked is what is written into.
  const int fd = ::open(name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0 && (errno == ELOOP || errno == ENOTDIR)) {  // O_DIRECTORY|O_NOFOLLOW on a link: ENOTDIR
    struct stat link {};
    throw refuse(::lstat(name.c_str(), &link) == 0 && S_ISLNK(link.st_mode) ? "a symbolic link (name the folder itself)" : "exists and is not a folder");
  }
  if (fd < 0) throw refuse(std::strerror(errno));
  struct stat st {};
  std::string why = ::fstat(fd, &st) != 0 ? std::string(std::strerror(errno)) : unsafe_folder(st);
  if (why.empty() && ::faccessat(fd, ".", W_OK | X_OK, 0) != 0) why = std::strerror(errno);
  if (!why.empty()) {
    ::close(fd);
    throw refuse(why);
  }
  const std::lock_guard<std::mutex> lock(g_folders_mutex);
  opened_folders().push_back(OpenedFolder{name, fd});
  return name;
}

std::optional<FolderFile> in_opened_folder(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  if (slash == std::string::npos || slash + 1 == path.size()) return std::nullopt;
  const std::string parent = slash == 0 ? std::string("/") : path.substr(0, slash);
  const std::lock_guard<std::mutex> lock(g_folders_mutex);
  for (const OpenedFolder& folder : opened_folders()) {
    if (folder.name == parent) return FolderFile{folder.fd, path.substr(slash + 1)};
  }
  return std::nullopt;
}

int open_file(const std::string& path, int flags, mode_t mode) {
  if (const std::optional<FolderFile> file = in_opened_folder(path)) return ::openat(file->folder_fd, file->name.c_str(), flags, mode);
  return ::open(path.c_str(), flags, mode);
}

int rename_file(const std::string& from, const std::string& to) {
  const std::optional<FolderFile> a = in_opened_folder(from), b = in_opened_folder(to);
  if (a && b) return ::renameat(a->folder_fd, a->name.c_str(), b->folder_fd, b->name.c_str());
  if (a || b) {
    errno = EXDEV;  // one inside an opened folder, one outside: never by name
    return -1;
  }
  return ::rename(from.c_str(), to.c_str());
}

int remove_file(const std::string& path) {
  if (const std::optional<FolderFile> file = in_opened_folder(path)) return ::unlinkat(file->folder_fd, file->name.c_str(), 0);
  return ::unlink(path.c_str());
}

namespace {
// The errno of a failed write, by the file's path, for the message (this process's writers).
std::mutex g_failures_mutex;
std::map<std::string, int>& write_failures() {
  static std::map<std::string, int> failures;
  return failures;
}
}  // namespace

void mark_write_failed(int fd, const std::string& path, int error) {
  {
    const std::lock_guard<std::mutex> lock(g_failures_mutex);
    write_failures().emplace(path, error);
  }
  // On the file itself, for the process that renames it (a rank process's write failed): a mode
  // change needs no free block, so it works on the full disk that made the write fail.
  struct stat st {};
  if (::fstat(fd, &st) == 0) (void)::fchmod(fd, (st.st_mode & 07777) | kWriteFailedMark);
}

int write_failure(int fd, const std::string& path) {
  {
    const std::lock_guard<std::mutex> lock(g_failures_mutex);
    if (const auto it = write_failures().find(path); it != write_failures().end()) return it->second;
  }
  struct stat st {};
  if (::fstat(fd, &st) == 0 && (st.st_mode & kWriteFailedMark) != 0) return -1;
  return 0;
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
  const int fd = open_file(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) throw std::runtime_error(fmt::format("cannot write {}: {}", path, std::strerror(errno)));
  int error = write_all(fd, content);
  // close reports what a network or quota-bound file system only notices at the end.
  if (::close(fd) != 0 && error == 0) error = errno;
  if (error == 0) return;
  remove_file(path);  // ours: O_EXCL made it
  throw std::runtime_error(fmt::format("cannot write {}: {}", path, std::strerror(error)));
}

void replace_private_file(const std::string& path, std::string_view content) {
  static std::atomic<std::uint64_t> serial{0};
  const std::string fresh = fmt::format("{}.{}.{}.new", path, ::getpid(), serial.fetch_add(1));
  write_new_file(fresh, content);
  if (rename_file(fresh, path) == 0) return;
  const int error = errno;
  remove_file(fresh);
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

#include "files.hpp"
#include "cpkv/traces/trace.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <utility>

#include <fmt/format.h>

#include "commands.hpp"
#include "cpkv/harness/interrupt.hpp"
#include "cpkv/harness/spool.hpp"
#include "cpkv/harness/temp_files.hpp"
#include "cpkv/properties/properties.hpp"

namespace cpkv::cli {
namespace {

namespace fs = std::filesystem;

// Extensions longer than this are not kept on a temporary file's name (NAME_MAX is 255).
constexpr std::size_t kExtensionCharsMax = 16;
// Names of temporary files, each followed by "-<creator pid>-" (harness/temp_files.hpp).
constexpr std::string_view kOutputPrefix = ".cpkv";  // hidden, beside the output it will replace

// The spool files alive in this process and the names the user gave them, for messages.
std::vector<std::pair<std::string, std::string>>& spool_names() {
  static std::vector<std::pair<std::string, std::string>> names;
  return names;
}

std::string errno_text(int error) { return std::strerror(error); }

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a pipe";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

// Removes a temporary file (a spool file, an output's temporary) and forgets it (the interrupt
// watcher removes the ones it still tracks).
void remove_tracked(const std::string& name) { harness::remove_tracked_file(name); }

// A private copy of a non-seekable input in $TMPDIR (harness/spool.hpp); returns its path. Tracked
// from its creation, so that SIGINT or SIGTERM (whose watcher ends the process without unwinding)
// removes it too. A refusal of the input is bad input (exit 2).
std::string spool(const std::string& option, const std::string& path) {
  try {
    return harness::spool_input(option, path);
  } catch (const harness::SpoolRefused& e) {
    throw OptionError(e.what());
  }
}

bool is_terminal(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool terminal = ::isatty(fd) != 0;
  ::close(fd);
  return terminal;
}

}  // namespace

// A trace that cannot be opened is reported as the trace reader reports it (file, line 0, field
// "file"), so the CLI and the Python package say the same; any other input names its option.
void InputFile::throw_unreadable(int error_number) const {
  // Out of descriptors or memory is this process's limit, not bad input (exit 1, not 2).
  if (error_number == EMFILE || error_number == ENFILE || error_number == ENOMEM) {
    throw std::runtime_error(fmt::format("{}: cannot open {}: {} (a limit of this process or system, not a problem of the file)", option_, path_, errno_text(error_number)));
  }
  if (option_ == "trace") throw traces::TraceError(path_, 0, "file", fmt::format("cannot open: {}", std::strerror(error_number)));
  throw OptionError(fmt::format("{}: cannot read {}: {}", option_, path_, errno_text(error_number)));
}

InputFile::InputFile(std::string option, std::string path, bool spool_pipes)
    : option_(std::move(option)), path_(std::move(path)), read_path_(path_) {
  if (path_.empty()) throw OptionError(fmt::format("{}: an empty file name", option_));
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) throw_unreadable(errno);
  if (S_ISDIR(st.st_mode)) throw OptionError(fmt::format("{}: {} is a directory, not a file", option_, path_));
  id_ = FileId{st.st_dev, st.st_ino};
  if (S_ISREG(st.st_mode)) {
    if (::access(path_.c_str(), R_OK) != 0) throw_unreadable(errno);
    return;
  }
  // A device other than a terminal is never a trace (/dev/zero would spool forever).
  if ((S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) && !is_terminal(path_)) {
    throw OptionError(fmt::format("{}: {} is {}, not a file", option_, path_, kind_of(st.st_mode)));
  }
  if (!spool_pipes) return;
  read_path_ = spool(option_, path_);
  spooled_ = true;
  owner_ = ::getpid();
  spool_names().emplace_back(read_path_, path_);
}

InputFile::~InputFile() {
  if (!spooled_ || ::getpid() != owner_) return;
  // The name stays in spool_names(): main() prints the error that unwound this object afterwards.
  remove_tracked(read_path_);
}

OutputFile::OutputFile(std::string option, std::string path) : option_(std::move(option)), path_(std::move(path)) {
  if (path_.empty()) throw OptionError(fmt::format("{}: an empty file name", option_));
  if (path_ == "-") throw OptionError(fmt::format("{}: '-' is not accepted (standard output carries the report); give a file name", option_));
  struct stat st {};
  if (::lstat(path_.c_str(), &st) != 0) {
    if (errno != ENOENT) throw OptionError(fmt::format("{}: cannot write {}: {}", option_, path_, errno_text(errno)));
    const fs::path parent = fs::path(path_).parent_path().empty() ? fs::path(".") : fs::path(path_).parent_path();
    struct stat dir {};
    if (::stat(parent.c_str(), &dir) != 0) throw OptionError(fmt::format("{}: cannot write {}: folder {}: {}", option_, path_, parent.string(), errno_text(errno)));
    if (!S_ISDIR(dir.st_mode)) throw OptionError(fmt::format("{}: cannot write {}: {} is not a folder", option_, path_, parent.string()));
    target_ = fs::weakly_canonical(fs::absolute(path_)).string();
  } else {
    if (S_ISLNK(st.st_mode)) {
      // A link to a regular file writes that file, in its folder; a link to anything else is refused.
      if (::stat(path_.c_str(), &st) != 0) throw OptionError(fmt::format("{}: {} is a symbolic link to nothing ({})", option_, path_, errno_text(errno)));
      if (!S_ISREG(st.st_mode)) throw OptionError(fmt::format("{}: {} is a symbolic link to {}; outputs are regular files only", option_, path_, kind_of(st.st_mode)));
    }
    if (!S_ISREG(st.st_mode)) throw OptionError(fmt::format("{}: {} is {}; outputs are regular files only", option_, path_, kind_of(st.st_mode)));
    if (::access(path_.c_str(), W_OK) != 0) throw OptionError(fmt::format("{}: cannot write {}: {}", option_, path_, errno_text(errno)));
    target_ = fs::canonical(path_).string();
    existed_ = true;
    mode_ = st.st_mode & 07777;
    owner_ = st.st_uid;
    group_ = st.st_gid;
    id_ = FileId{st.st_dev, st.st_ino};
  }
  const std::string folder = fs::path(target_).parent_path().string();
  if (::access(folder.c_str(), W_OK | X_OK) != 0) {
    throw OptionError(fmt::format("{}: cannot write {}: folder {}: {}", option_, path_, folder, errno_text(errno)));
  }
  check_replaceable(folder);
}

// What the final rename needs, tried now rather than refused after the whole run (issue 22, item
// 15): a file can be made in the folder (not so in /proc, on a read-only mount, for a folder full
// or of another user), and, in a sticky folder (/tmp), an existing file of another user can be
// replaced only by its owner, the folder's owner or root.
void OutputFile::check_replaceable(const std::string& folder) const {
  struct stat dir {};
  struct stat file {};
  if (existed_ && ::stat(folder.c_str(), &dir) == 0 && (dir.st_mode & S_ISVTX) != 0 && ::stat(target_.c_str(), &file) == 0) {
    const uid_t me = ::geteuid();
    if (me != 0 && file.st_uid != me && dir.st_uid != me) {
      throw OptionError(fmt::format("{}: cannot replace {}: it belongs to another user in the sticky folder {}", option_, path_, folder));
    }
  }
  std::string probe = fmt::format("{}/{}XXXXXX", folder, harness::temp_stem(kOutputPrefix));
  const int fd = harness::create_tracked_file(probe, 0);
  if (fd < 0) throw OptionError(fmt::format("{}: cannot write {}: cannot create a file in {}: {}", option_, path_, folder, errno_text(errno)));
  ::close(fd);
  remove_tracked(probe);
}

OutputFile::~OutputFile() {
  if (committed_ || temporary_.empty()) return;
  out_.reset();
  remove_tracked(temporary_);
}

const std::string& OutputFile::temporary() {
  if (!temporary_.empty()) return temporary_;
  // Hidden, in the target's folder (so the rename is atomic), keeping the extension (a plotting
  // library picks the format from it).
  const fs::path target(target_);
  std::string extension = target.extension().string();
  if (extension.size() > kExtensionCharsMax) extension.clear();
  // A partial output of a SIGKILLed cpkv (a 48 MB hidden import was seen) goes when the next run
  // writes into the same folder.
  harness::sweep_dead_temporaries(target.parent_path().string(), kOutputPrefix);
  std::string name = (target.parent_path() / (harness::temp_stem(kOutputPrefix) + "XXXXXX" + extension)).string();
  // Tracked from its creation, as a spool file: SIGINT or SIGTERM (no unwinding) removes it too.
  const int fd = harness::create_tracked_file(name, static_cast<int>(extension.size()));
  if (fd < 0) throw std::runtime_error(fmt::format("{}: cannot create a temporary file beside {}: {}", option_, path_, errno_text(errno)));
  ::close(fd);
  temporary_ = name;
  return temporary_;
}

std::ostream& OutputFile::stream() {
  if (!out_) {
    out_ = std::make_unique<std::ofstream>(temporary(), std::ios::binary | std::ios::trunc);
    if (!*out_) throw std::runtime_error(fmt::format("{}: cannot open a temporary file beside {}: {}", option_, path_, errno_text(errno)));
  }
  return *out_;
}

void OutputFile::commit() {
  const auto fail = [&](const std::string& step, int error) {
    out_.reset();
    remove_tracked(temporary_);
    temporary_.clear();
    throw std::runtime_error(fmt::format("{}: cannot write {}: {}: {}; the file was left as it was", option_, path_, step, errno_text(error)));
  };
  temporary();
  if (out_) {
    if (!*out_) fail("write", write_errno_ != 0 ? write_errno_ : EIO);
    errno = 0;
    out_->flush();
    if (!*out_) fail("write", errno != 0 ? errno : EIO);
    out_->close();
    if (!*out_) fail("close", errno != 0 ? errno : EIO);
    out_.reset();
  }
  const int fd = ::open(temporary_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("reopen", errno);
  if (::fsync(fd) != 0) {
    const int error = errno;
    ::close(fd);
    fail("fsync", error);
  }
  if (::close(fd) != 0) fail("close", errno);
  mode_t mode = mode_;
  if (!existed_) {
    const mode_t mask = ::umask(0);
    ::umask(mask);
    mode = 0666 & ~mask;
  }
  // The replaced file's owner and group kept where this user may give them (root replacing a
  // user's file left it root-owned: issue 22, item 16); before the mode, which chown may clear.
  if (existed_ && ::chown(temporary_.c_str(), owner_, group_) != 0 && errno != EPERM) fail("chown", errno);
  if (::chmod(temporary_.c_str(), mode) != 0) fail("chmod", errno);
  if (::rename(temporary_.c_str(), target_.c_str()) != 0) fail("rename", errno);
  harness::untrack_file(temporary_);  // the name is gone: nothing left for the watcher to remove
  committed_ = true;
}

void OutputFile::write(std::string_view text) {
  std::ostream& out = stream();
  errno = 0;
  out << text;
  if (!out) write_errno_ = errno;  // the reason, before later calls overwrite errno
  commit();
}

void refuse_same_files(const std::vector<const InputFile*>& inputs, const std::vector<const OutputFile*>& outputs) {
  // stdout and stderr carry the report and the errors: an output that is their file (`/dev/stdout`
  // with stdout redirected to a file, or `--json F > F`) would be overwritten or interleaved.
  std::vector<std::pair<FileId, const char*>> streams;
  for (const auto& [fd, name] : {std::pair{STDOUT_FILENO, "standard output"}, std::pair{STDERR_FILENO, "standard error"}}) {
    struct stat st {};
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) streams.emplace_back(FileId{st.st_dev, st.st_ino}, name);
  }
  // Options not given are null entries.
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    if (outputs[k] == nullptr) continue;
    const OutputFile& out = *outputs[k];
    for (const auto& [id, name] : streams) {
      if (out.id() && *out.id() == id) throw OptionError(fmt::format("{}: {} is the file {} goes to; give another file", out.option(), out.path(), name));
    }
    for (const InputFile* in : inputs) {
      if (in != nullptr && out.id() && in->id() && *out.id() == *in->id()) {
        throw OptionError(fmt::format("{}: {} is the same file as the input {} ({}); refusing to overwrite an input", out.option(), out.path(),
                                      in->name(), in->option()));
      }
    }
    for (std::size_t j = 0; j < k; ++j) {
      if (outputs[j] != nullptr && outputs[j]->target() == out.target()) {
        throw OptionError(fmt::format("{}: {} is the same file as {} {}", out.option(), out.path(), outputs[j]->option(), outputs[j]->path()));
      }
    }
  }
}

std::string with_input_names(std::string text) {
  for (const auto& [spool_path, name] : spool_names()) {
    for (std::size_t at = text.find(spool_path); at != std::string::npos; at = text.find(spool_path, at + name.size())) {
      text.replace(at, spool_path.size(), name);
    }
  }
  return text;
}

std::string use_out_folder(const std::optional<std::string>& dir) {
  if (!dir) return "";
  try {
    properties::set_counterexample_folder(harness::owned_output_folder("--out", *dir));
  } catch (const std::runtime_error& e) {
    throw OptionError(e.what());
  }
  return *dir;
}

}  // namespace cpkv::cli

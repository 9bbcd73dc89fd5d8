#include "files.hpp"
#include "cpkv/traces/trace.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
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

// The spool files and output temporaries of this process and the names the user gave them, for messages.
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
  // A writer's error names the temporary (the event log's, the timeline's); the user named the target.
  spool_names().emplace_back(temporary_, path_);
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
  const auto fail_because = [&](const std::string& step, const std::string& why) {
    out_.reset();
    remove_tracked(temporary_);
    temporary_.clear();
    throw std::runtime_error(fmt::format("{}: cannot write {}: {}: {}; the file was left as it was", option_, path_, step, why));
  };
  const auto fail = [&](const std::string& step, int error) { fail_because(step, errno_text(error)); };
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
  // A writer that appends by itself (the event log, the timeline, a rank process) marked the file
  // when a write failed: the partial file never replaces the old one (issue 34, item 3).
  if (const int failed = harness::write_failure(fd, temporary_); failed != 0) {
    ::close(fd);
    if (failed > 0) fail("write", failed);
    fail_because("write", "a rank process's write failed (a full disk or a file size limit)");
  }
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

namespace {

// Why `text` nests deeper than `depth_max` ([ and { outside strings), or "". Scanned before parsing:
// nlohmann's parser and its recursive copy, compare and dump of a value would overflow the stack on
// a file nested 200,000 deep (issue 34, item 4: `cpkv merge` died of SIGSEGV).
std::string too_deep(std::string_view text, std::size_t depth_max) {
  std::size_t depth = 0;
  bool in_string = false, escaped = false;
  for (std::size_t at = 0; at < text.size(); ++at) {
    const char c = text[at];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    if ((c == '[' || c == '{') && ++depth > depth_max) return fmt::format("nested deeper than {} levels (at byte {})", depth_max, at);
    if ((c == ']' || c == '}') && depth > 0) --depth;
  }
  return "";
}

// The whole of a regular file, at most `bytes_max` bytes, or an OptionError "<where>: ...".
std::string read_bounded(const InputFile& input, const std::string& where, std::size_t bytes_max) {
  // O_NONBLOCK: a FIFO that slipped past the input check (made after it) never blocks the open.
  const int fd = ::open(input.path().c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) throw OptionError(fmt::format("{}: cannot read {}: {}", where, input.name(), errno_text(errno)));
  struct stat st {};
  std::string why;
  if (::fstat(fd, &st) != 0) why = errno_text(errno);
  else if (!S_ISREG(st.st_mode)) why = fmt::format("{}, not a regular file (read only from a file: a pipe could block for good)", kind_of(st.st_mode));
  else if (static_cast<std::uint64_t>(st.st_size) > bytes_max) why = fmt::format("{} bytes, more than the {} this input may hold", st.st_size, bytes_max);
  std::string text;
  char buffer[1 << 16];
  while (why.empty()) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) why = errno_text(errno);
    if (n <= 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
    if (text.size() > bytes_max) why = fmt::format("more than the {} bytes this input may hold (it grew while read)", bytes_max);
  }
  ::close(fd);
  if (!why.empty()) throw OptionError(fmt::format("{}: {}: {}", where, input.name(), why));
  return text;
}

}  // namespace

nlohmann::json read_json_input(const InputFile& input, const std::string& where, const JsonLimits& limits) {
  const std::string text = read_bounded(input, where, limits.bytes_max);
  if (const std::string why = too_deep(text, limits.depth_max); !why.empty()) throw OptionError(fmt::format("{}: {}: {}", where, input.name(), why));
  // A key twice in one object: nlohmann keeps the last silently; a callback sees every key.
  std::vector<std::set<std::string>> keys;
  std::string twice;
  const nlohmann::json::parser_callback_t note_keys = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::object_start) keys.emplace_back();
    if (event == nlohmann::json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == nlohmann::json::parse_event_t::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second && twice.empty()) {
      twice = parsed.get<std::string>();
    }
    return true;
  };
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text, note_keys);
  } catch (const nlohmann::json::parse_error& e) {
    throw OptionError(fmt::format("{}: {}: not JSON (at byte {})", where, input.name(), e.byte));
  } catch (const nlohmann::json::out_of_range& e) {
    // 406: a number a double cannot hold (1e400): out of range, not "not JSON".
    const std::string what = e.what();  // "[json.exception.out_of_range.406] number overflow parsing '1e400'": the words after the tag
    const std::size_t tag = what.find("] ");
    throw OptionError(fmt::format("{}: {}: a number out of range (numbers must be finite doubles): {}", where, input.name(),
                                  printable_line(tag == std::string::npos ? what : what.substr(tag + 2))));
  }
  if (!twice.empty() && limits.unique_keys) {
    throw OptionError(fmt::format("{}: {}: the key \"{}\" is given twice in one object", where, input.name(), printable_line(twice)));
  }
  return json;
}

std::string printable_line(std::string_view text) { return harness::printable(text); }

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
    const std::string name = harness::owned_output_folder("--out", *dir);  // opened once; its files written through it
    properties::set_counterexample_folder(name);
    return name;
  } catch (const std::runtime_error& e) {
    throw OptionError(e.what());
  }
}

}  // namespace cpkv::cli

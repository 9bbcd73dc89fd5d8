// The files a cpkv command reads and writes, checked before any work (cli/files.cpp).
//
// Inputs: a named input must exist and not be a directory; a trace that is not a regular file (a
// pipe, `/dev/stdin` fed by a pipe, `<(...)`) is copied once into a private spool file, because
// every rank reopens the trace.
//
// Outputs: the target is checked when the options are (before any work): it must be a regular
// file or not exist yet in an existing folder where a file can be made (tried: one is made and
// removed) and, in a sticky folder, be this user's to replace; a directory, a device,
// a pipe, `-` and `/dev/stdout` are refused (stdout carries the report); a symbolic link to a
// regular file writes that file. An output that is the same file (device and inode) as an input or
// as another output is refused. The content goes to a temporary file in the target's folder, is
// flushed, synced and closed with every error checked, and only then renamed over the target: a
// failed run leaves the old file as it was and no partial file.
#pragma once

#include <sys/types.h>

#include <fstream>
#include <optional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace cpkv::cli {

// Where a path leads (stat, following links): the identity same-file checks compare.
struct FileId {
  dev_t device = 0;
  ino_t inode = 0;
  bool operator==(const FileId&) const = default;
};

// An input named by `option`, checked: it exists, is readable and is not a directory.
class InputFile {
 public:
  // Throws OptionError naming the option. With `spool`, a non-seekable input is copied to a private
  // temporary file ($TMPDIR) that path() then names; the copy is removed when this object goes.
  InputFile(std::string option, std::string path, bool spool = false);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  const std::string& path() const { return read_path_; }      // what to open (the spool, if any)
  const std::string& name() const { return path_; }           // what the user named
  const std::optional<FileId>& id() const { return id_; }     // of the original, never the spool
  const std::string& option() const { return option_; }

 private:
  [[noreturn]] void throw_unreadable(int error_number) const;
  std::string option_;
  std::string path_;
  std::string read_path_;
  std::optional<FileId> id_;
  bool spooled_ = false;
  pid_t owner_ = 0;  // only the process that made the spool removes it (rank processes are forks)
};

// One output named by `option`. Construction checks the target, and that a file can be made in
// its folder (one is made and removed at once), and leaves nothing there.
class OutputFile {
 public:
  OutputFile(std::string option, std::string path);
  ~OutputFile();  // removes a temporary file left uncommitted
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  const std::string& option() const { return option_; }
  const std::string& path() const { return path_; }
  const std::string& target() const { return target_; }   // absolute, links resolved
  const std::optional<FileId>& id() const { return id_; } // when the target exists

  // Creates the temporary file beside the target and returns its path, for a writer that opens the
  // file itself (the chart's plotting process). Throws std::runtime_error (exit 1) when it cannot.
  const std::string& temporary();
  // A stream on the temporary file (created if needed).
  std::ostream& stream();
  // Flushes, syncs and closes the temporary file, checking each step, and renames it over the
  // target. Throws std::runtime_error naming the option and the reason; the target is untouched.
  void commit();
  // The whole content at once: stream() << text; commit().
  void write(std::string_view text);

 private:
  void check_replaceable(const std::string& folder) const;
  std::string option_;
  std::string path_;          // as given, for messages
  std::string target_;        // the file replaced (a link resolved)
  std::string temporary_;
  std::optional<FileId> id_;  // of the existing target
  std::unique_ptr<std::ofstream> out_;
  bool existed_ = false;
  mode_t mode_ = 0;           // the replaced file's permissions, kept
  uid_t owner_ = 0;           // and its owner and group, where this user may give them
  gid_t group_ = 0;
  bool committed_ = false;
  int write_errno_ = 0;       // why a write failed, kept for the message
};

// Refuses (OptionError, exit 2) an output that is the same file as an input or as another output.
// Null entries (options not given) are skipped.
void refuse_same_files(const std::vector<const InputFile*>& inputs, const std::vector<const OutputFile*>& outputs);

// The bounds of a JSON input read whole (`cpkv merge` shard files, `--ceilings`).
struct JsonLimits {
  std::size_t bytes_max = 0;
  std::size_t depth_max = 0;
  bool unique_keys = true;  // a key twice in one object refused
};

// A JSON input, bounded (issue 34, items 4, 12, 13, 14): read only from a regular file (a FIFO or
// a device is refused, never read: it could block for good), at most limits.bytes_max bytes, nested
// at most limits.depth_max deep (checked before parsing), no key twice in an object (with
// unique_keys), a number past a double named as out of range. Throws OptionError "<where>: FILE: why".
nlohmann::json read_json_input(const InputFile& input, const std::string& where, const JsonLimits& limits);

// `text` with each control character written \xNN: a file's text printed on a terminal can neither
// forge a line nor send escape sequences.
std::string printable_line(std::string_view text);

// For error messages: the spool files' paths replaced by the names the user gave.
std::string with_input_names(std::string text);

// `--out DIR` of soak, mutants and explore: the counterexamples' folder (harness::owned_output_folder:
// made 0700 when new, else a real folder this user owns that others cannot write; opened once and
// every counterexample file written relative to that descriptor), set for the property suite
// (properties::set_counterexample_folder). Without it they go to the private per-run folder in
// $TMPDIR. A bad DIR is an OptionError (one line, exit 2). Returns the folder's name (DIR without a
// trailing `/` or `/.`), or "" without it.
std::string use_out_folder(const std::optional<std::string>& dir);

}  // namespace cpkv::cli

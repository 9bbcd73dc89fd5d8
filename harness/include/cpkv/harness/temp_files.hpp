// Temporary files and folders, the one way cpkv makes them (harness/src/temp_files.cpp).
//
// Why one facility: a fixed name in a shared folder (/tmp) is an attack. Another local user who
// creates `$TMPDIR/cpkv-counterexamples` first, full of symbolic links, made the next user (or root)
// overwrite whatever the links pointed at (issue 22, item 1). So every file cpkv creates outside an
// output's own folder is either made by mkstemp or lies in a private folder made by mkdtemp (mode
// 0700, a fresh name), and is opened O_CREAT|O_EXCL|O_NOFOLLOW: it never follows a link and never
// truncates a file that was there before. Every write and the close are checked, so a full tmpfs is
// one line naming the file and the reason, never a 0-byte file reported as written.
//
// Every name carries the creating process's pid ("cpkv-spool-<pid>-XXXXXX"), so a sweep can tell a
// leftover of a dead cpkv (SIGKILL, a power cut) from one a live run is using.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>

namespace cpkv::harness {

// The folder for temporary files: $TMPDIR when set and not empty, else /tmp. A TMPDIR that is not
// an existing, writable, searchable folder throws std::runtime_error naming TMPDIR and its value.
std::string temp_folder();

// A private folder in temp_folder(), "<prefix>-<pid>-XXXXXX", made with mkdtemp (mode 0700) once
// per process and prefix and kept (it holds what the user reads afterwards). Throws
// std::runtime_error naming the folder and the reason.
std::string private_folder(const std::string& prefix);

// A folder the user named for the files a run keeps (`--out DIR`: counterexamples): made (mode
// 0700) when it does not exist (its parent must), else it must be a real folder owned by this user,
// not writable by others nor by a group other than this user's own, so no one else can plant links
// in it. A name with a control character is refused (it would break every line naming a file in
// it). `DIR/` and `DIR/.` are DIR: the last component is never followed, so a link is refused
// however it is spelled. The folder is opened once (O_DIRECTORY|O_NOFOLLOW), checked through that
// descriptor, and kept open: every file the functions below make, write, rename or remove in it is
// reached relative to the descriptor (openat), so swapping the name for a link after the check
// changes nothing. Returns the folder's name (DIR without a trailing `/` or `/.`), the prefix the
// files' paths are built from. Throws std::runtime_error naming `option`, the folder and the reason.
std::string owned_output_folder(const std::string& option, const std::string& dir);

// A path directly in a folder owned_output_folder() opened: the folder's descriptor and the name.
struct FolderFile {
  int folder_fd = -1;
  std::string name;
};
std::optional<FolderFile> in_opened_folder(const std::string& path);

// open(2), rename(2), unlink(2) of a path, relative to its folder's descriptor when the path lies
// directly in a folder owned_output_folder() opened (a rename between such a folder and any other
// place is EXDEV). Return what the system calls return; errno is theirs.
int open_file(const std::string& path, int flags, mode_t mode = 0600);
int rename_file(const std::string& from, const std::string& to);
int remove_file(const std::string& path);

// A write to an output's temporary file failed (a full disk, a file size limit): the one output
// discipline must then leave the old output as it was (issue 34, item 3: a timeline's appender
// dropped its error and the empty file replaced the old one). A writer records `error` by path (for
// this process's message) and marks the file itself with kWriteFailedMark (a mode bit: a temporary
// is made 0600, and a mode change needs no free block), so that the process that renames the file
// learns of a rank process's failure too.
inline constexpr mode_t kWriteFailedMark = 0100;  // S_IXUSR
void mark_write_failed(int fd, const std::string& path, int error);
// The errno recorded for `path` in this process, -1 when only the file's mark says a write failed
// (another process's), 0 when no write failed.
int write_failure(int fd, const std::string& path);

// `text` with each control character written \xNN, for a message that must stay one line.
std::string printable(std::string_view text);

// Creates `path` (O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600; relative to an opened folder's descriptor
// when in one), writes `content`, checks every write and
// the close. Throws std::runtime_error "cannot write PATH: REASON" (an existing file or link is
// EEXIST and is left as it was); a partial file is removed.
void write_new_file(const std::string& path, std::string_view content);

// For a file in a folder from private_folder(), which only this user can change: writes `content`
// to a fresh file beside `path` (write_new_file) and renames it over `path`, so a later version (a
// shrunk counterexample) replaces an earlier one whole. Throws as write_new_file does.
void replace_private_file(const std::string& path, std::string_view content);

// Writes all of `content` to `fd`, retrying short writes and EINTR. Returns 0 or the errno of the
// failing write (EPIPE and EFBIG included: cpkv ignores SIGPIPE and SIGXFSZ, see interrupt.hpp).
int write_all(int fd, std::string_view content);

// The name stem a temporary file of this process starts with: "<prefix>-<pid>-".
std::string temp_stem(std::string_view prefix);

// Removes the regular files directly in `folder` whose name is "<prefix>-<pid>-..." for a pid that
// no longer runs (a cpkv killed by SIGKILL cannot remove its own). Returns how many were removed.
// Links, folders and other users' files stay; errors are ignored (a sweep is a courtesy).
int sweep_dead_temporaries(const std::string& folder, std::string_view prefix);

}  // namespace cpkv::harness

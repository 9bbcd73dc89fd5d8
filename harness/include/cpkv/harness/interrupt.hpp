// Interruption of a process that owns rank processes and shared-memory regions (SIGINT, SIGTERM,
// SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGXCPU: Ctrl-C signals the whole process group, a
// scheduler or `timeout` signals the parent only). A signal the process was started with ignored
// (nohup, `trap '' INT`) stays ignored, in the ranks too. SIGPIPE and SIGXFSZ are ignored: a write
// to a closed pipe or past the file-size limit fails (EPIPE, EFBIG) and is reported as a write error.
//
// The handler does nothing but record the signal and write its number to a pipe (both
// async-signal-safe). A watcher thread reads the pipe and does the work, in an order that keeps the
// promise "no name left in /dev/shm within 1 s" even when a rank is slow to die: it removes every
// tracked region name first (ranks keep their mappings), forwards the signal to every tracked
// rank, kills with SIGKILL those alive after kForwardGraceMs, removes the temporary files (once no
// rank runs: a starting rank opens the spool file by name), reaps the killed ranks within
// kReapMsMax, prints one line to stderr and ends the process with _exit(128 + signal). Nothing else in the process has to
// poll for the signal; loops that would otherwise report the dying ranks as failures ask
// interrupted() and stay quiet.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>

namespace cpkv::harness {

// Opens /dev/null (read-only) on any closed fd 0-2, so that no file cpkv opens becomes its standard
// input, output or error; a write to a closed standard output then fails and is reported.
void open_missing_standard_streams();

// Installs the handlers and starts the watcher (once per process; later calls do nothing); calls
// open_missing_standard_streams() first. Throws std::runtime_error when the pipe or the thread
// cannot be made (a file-descriptor limit).
// Forked rank children must not keep the handlers: launch_ranks and prepare_child() reset them.
void install_interrupt_handling();
// The signal dispositions and mask the process was started with (the handlers gone, a signal it
// was started with ignored still ignored), for a process about to exec another program in its place
// (cpkv replay --backend torch execs Python's conformance harness: its Ctrl-C is Python's).
void restore_signals();

// What the process is doing now, for the one line ("replay tiny.jsonl variant v2, sim/processes").
void set_activity(const std::string& what);

// The signal that interrupted this process, or 0.
int interrupted();

// A stop asked by a front end that owns the process and keeps running it (Python's replay() on
// Ctrl-C or SIGTERM, issue 22 item 8): every tracked rank process and helper group is SIGKILLed at
// once, and the launcher, rank threads, the scheduled runner and the variant loop end at their next
// check (each within a poll or a step), unwinding normally so that every region and temporary file
// is removed by its owner. The process is not ended. clear_stop() before the next run.
void request_stop(int signal_number);
void clear_stop();
// The signal given to request_stop, or 0.
int stop_requested();

// Shared-memory names (shm_open names) and rank pids the watcher cleans up on interruption.
// Tracking a name before creating it closes the window where a signal would leak it.
void track_region(const std::string& name);
void untrack_region(const std::string& name);
// fork() for a rank process, the child tracked before the watcher can see the registry again: 0 in
// the child, the pid in the parent (tracked; reap_tracked forgets it once it has ended), -1 with errno.
pid_t fork_tracked_rank();

// A helper program in a process group of its own (POSIX_SPAWN_SETPGROUP, group id = its pid):
// `spawn` runs under the registry's lock and returns the pid (or -1); the watcher SIGKILLs the
// whole group on interruption. The owner kills the group itself when done and untracks it.
pid_t spawn_tracked_group(const std::function<pid_t()>& spawn);
void untrack_group(pid_t pid);

// Temporary files (a trace read from a pipe and spooled) the watcher removes on interruption.
// create_tracked_file makes one with mkstemps(name_template, suffix_chars) under the registry's
// lock, so that no signal falls between its creation and its tracking; returns the open
// descriptor, or -1 with errno set. The owner removes it normally and then calls untrack_file.
int create_tracked_file(std::string& name_template, int suffix_chars);
// The same for a file of a given name (O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600): a GPU timeline's rank
// part beside the output's own temporary file (harness/timeline.hpp).
int create_tracked_named_file(const std::string& path);
void untrack_file(const std::string& path);

}  // namespace cpkv::harness

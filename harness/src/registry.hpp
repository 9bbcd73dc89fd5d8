// Internal to the harness: reaping a tracked rank under the registry's lock, so that the watcher
// never signals a pid the launcher has already reaped (and the system may have reused).
#pragma once

#include <sys/types.h>

namespace cpkv::harness::detail {

// waitpid(pid, raw, flags) under the lock; a rank that exited or died is untracked before unlock.
pid_t reap_tracked(pid_t pid, int* raw, int flags);

// The signal's short name ("SIGTERM"), or "signal N".
const char* signal_name(int signal_number);

}  // namespace cpkv::harness::detail

// A long C++ run from Python that Ctrl-C and SIGTERM can end (issue 22, item 8). Python's own
// SIGINT handler only records the signal; the KeyboardInterrupt is raised when the main thread next
// runs Python code or calls PyErr_CheckSignals, and a replay that released the GIL for minutes never
// did: Ctrl-C was ignored for the whole run and SIGTERM's default action ended the process with its
// shared-memory regions left. Here the run goes on a thread of its own while the calling thread
// checks for signals every kSignalCheckMs; on one it asks the harness to stop (rank processes
// SIGKILLed, rank threads and loops ending at their next check), waits for the run to unwind (so its
// owners remove every region), and then raises what Python's handler raised.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include "bindings.hpp"
#include "cpkv/harness/interrupt.hpp"

namespace cpkv::python {
namespace {

constexpr std::chrono::milliseconds kSignalCheckMs{50};  // Ctrl-C felt at once; a wake-up 20 times a second costs nothing

std::atomic<int> g_terminated{0};
extern "C" void on_terminate(int signal_number) { g_terminated.store(signal_number); }

// SIGTERM caught while a run is in flight, where its action was the default (a handler that Python
// code installed is left to Python: PyErr_CheckSignals runs it). Restored on destruction.
class TerminateGuard {
 public:
  TerminateGuard() {
    struct sigaction current {};
    if (::sigaction(SIGTERM, nullptr, &current) != 0 || current.sa_handler != SIG_DFL || (current.sa_flags & SA_SIGINFO) != 0) return;
    struct sigaction action {};
    action.sa_handler = on_terminate;
    action.sa_flags = SA_RESTART;
    sigemptyset(&action.sa_mask);
    g_terminated.store(0);
    installed_ = ::sigaction(SIGTERM, &action, &old_) == 0;
  }
  ~TerminateGuard() { restore(); }
  void restore() {
    if (installed_) ::sigaction(SIGTERM, &old_, nullptr);
    installed_ = false;
  }
  TerminateGuard(const TerminateGuard&) = delete;
  TerminateGuard& operator=(const TerminateGuard&) = delete;

 private:
  bool installed_ = false;
  struct sigaction old_ {};
};

}  // namespace

void run_interruptible(const std::function<void()>& work) {
  TerminateGuard terminate;
  std::mutex mutex;
  std::condition_variable done_changed;
  bool done = false;
  std::exception_ptr failure;
  std::thread worker([&] {
    try {
      work();
    } catch (...) {
      failure = std::current_exception();
    }
    const std::lock_guard<std::mutex> lock(mutex);
    done = true;
    done_changed.notify_all();
  });
  int stopped_by = 0;
  std::optional<py::error_already_set> raised;
  while (true) {
    bool finished = false;
    {
      py::gil_scoped_release release;  // the run never touches Python
      std::unique_lock<std::mutex> lock(mutex);
      finished = done_changed.wait_for(lock, kSignalCheckMs, [&] { return done; });
    }
    if (finished) break;
    if (stopped_by != 0) continue;  // the run is unwinding: every rank wait and reap is bounded
    if (g_terminated.load() != 0) {
      stopped_by = SIGTERM;
    } else if (PyErr_CheckSignals() != 0) {
      raised.emplace();  // fetches KeyboardInterrupt (or what a Python handler raised)
      stopped_by = SIGINT;
    }
    if (stopped_by != 0) harness::request_stop(stopped_by);
  }
  worker.join();
  if (stopped_by != 0) harness::clear_stop();
  if (stopped_by == SIGTERM) {  // the regions are gone: now SIGTERM's default action, as the caller was started with
    terminate.restore();
    ::raise(SIGTERM);
  }
  if (raised) throw std::move(*raised);
  if (failure) std::rethrow_exception(failure);
}

}  // namespace cpkv::python

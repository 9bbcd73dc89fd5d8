// launch_ranks: the one fork-and-reap loop of cpkv. It forks one process per rank (call it before
// any CUDA call in the parent: a CUDA context does not survive fork), makes each child die with the
// parent, runs the rank body, and watches the group with a bound on everything:
//   - a rank that dies or exits non-zero ends the run (the others would wait for it forever);
//   - a rank stopped (by a signal or a tracer) whose own record has not advanced for stuck_ms_max
//     ends the run, named, whatever its peers do meanwhile;
//   - a rank whose own record has not advanced for its window (stuck_ms_max, or its own declared
//     quiet step), not waiting on one named peer, while a peer kept making progress well after
//     it fell silent (a device barrier that timed out, a bounded wait that retries), ends the run,
//     named: the peers' activity never restarts its clock;
//   - ranks each silent for their window while waiting on a named peer, whose waits lead round in
//     a cycle (0 waits for 1, 1 for 0), end the run once a rank outside them made progress well
//     after they fell silent, every one named with whom it waited for (and any rank waiting into
//     the cycle); waits that lead to a rank that progresses are left alone;
//   - a group in which no rank made progress for stuck_ms_max (or a longer quiet step a rank
//     declared) ends the run (a stopped or hung rank that the others wait for, in a host barrier,
//     a device barrier or a collective);
//   - the whole run is bounded by run_ms_max, and reaping the ranks killed at the end by
//     kKillReapMsMax.
// Every way out kills and reaps every rank, and the report names the rank at fault and where every
// rank was, from a per-rank progress record the ranks keep in memory shared with the parent.
#pragma once

#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "cpkv/model/limits.hpp"

namespace cpkv::harness {

// Exit codes of a rank process.
inline constexpr int kRankExitOk = 0;
inline constexpr int kRankExitDeadlock = 3;  // the rank gave up waiting (its own wait bound)
inline constexpr int kRankExitError = 4;     // an exception or a failed setup

// Limits of the launcher, each with its reason.
// Progress records are carved up front, one per rank: as many as the model admits (a trace's cp).
// A backend may cap itself lower in its registry entry (BackendEntry::ranks_max).
inline constexpr std::int32_t kRanksMax = model::limits::cp_max;
inline constexpr std::int64_t kPollUs = 500;            // reap/watch tick: a dead rank is seen within a millisecond
inline constexpr std::int64_t kTickMs = 100;            // on_tick cadence (a progress bar)
inline constexpr std::int64_t kSignalSettleMs = 200;    // a rank killed by Ctrl-C: time for the parent's own SIGINT to be seen
inline constexpr std::int64_t kKillReapMsMax = 10000;   // reaping SIGKILLed ranks (a GPU context's teardown takes seconds)

// What a rank is waiting on (Progress::waiting_on): a rank number, or one of these.
inline constexpr std::int32_t kNotWaiting = -1;
inline constexpr std::int32_t kWaitingOnPeers = -2;   // a barrier or collective of the group, peer unknown
inline constexpr std::int32_t kWaitingOnDevice = -3;  // the GPU's queued work (its barriers and collectives)

// One rank's progress, written by the rank, read by the parent's watchdog. Plain atomics in an
// anonymous shared mapping: nothing to name, nothing to leak.
struct alignas(64) Progress {
  std::atomic<std::uint64_t> heartbeat{0};  // advances whenever the rank does work (not while it waits)
  std::atomic<std::int64_t> batch{-1};
  std::atomic<std::int32_t> layer{-1};
  std::atomic<std::int32_t> waiting_on{kNotWaiting};
  std::atomic<std::int32_t> started{0};     // 1 once the body runs, 2 once it returned
  std::atomic<std::int64_t> quiet_ms_max{0};  // a longer silence this rank declared for its current step (0: none)
  std::array<std::atomic<char>, 40> step{};  // the step's name; a torn read only garbles a report
  // What ended the body with an exception (its what(), cut to fit): written by the rank just before
  // it exits, read by the parent only once it has reaped the rank, so never torn.
  std::array<char, 384> error{};
};

// The rank body's handle on its record.
class RankProgress {
 public:
  explicit RankProgress(Progress& record) : record_(&record) {}
  void beat() { record_->heartbeat.fetch_add(1, std::memory_order_relaxed); }
  void at(std::int64_t batch, std::int32_t layer);
  void step(std::string_view name);  // names what the rank does now; beats
  void wait_on(std::int32_t who) { record_->waiting_on.store(who, std::memory_order_relaxed); }
  // The beat comes first, and the wait's end is published after it (release): a watcher that sees
  // the wait ended sees the beat too, so a rank ending a long wait is never seen silent and not
  // waiting in between (end_on_silent_rank reads the heartbeat again after the wait).
  void done_waiting() {
    beat();
    record_->waiting_on.store(kNotWaiting, std::memory_order_release);
  }
  std::int32_t waiting_on() const { return record_->waiting_on.load(std::memory_order_relaxed); }
  Progress& record() { return *record_; }

 private:
  Progress* record_;
};

// Declares, for its scope, a step that may be silent longer than the watchdog's window (NCCL
// communicator setup); the watchdog then waits up to this long before calling the group stuck.
class Quiet {
 public:
  Quiet(Progress& record, std::int64_t ms_max) : record_(record) { record_.quiet_ms_max.store(ms_max); }
  ~Quiet() { record_.quiet_ms_max.store(0); }
  Quiet(const Quiet&) = delete;
  Quiet& operator=(const Quiet&) = delete;

 private:
  Progress& record_;
};

// Marks a wait for its scope (a host barrier, a stream synchronize).
class Waiting {
 public:
  Waiting(RankProgress& progress, std::int32_t who) : progress_(progress) { progress_.wait_on(who); }
  ~Waiting() { progress_.done_waiting(); }
  Waiting(const Waiting&) = delete;
  Waiting& operator=(const Waiting&) = delete;

 private:
  RankProgress& progress_;
};

// The shortest no-progress window the watchdog applies, whatever stuck_ms_max asks: a rank that is
// runnable can wait this long for a CPU on a loaded machine (Linux CFS's latency period is up to
// 24 ms, several of them with a few runnable processes per core; 200 of the watcher's polls), and
// silence shorter than that is the scheduler's, not a deadlock: a window of 1 ms turned correct
// runs into invariant-8 verdicts.
// The request checks refuse a smaller --stuck-ms-max (issue 34): it was accepted and raised unseen.
inline constexpr std::int64_t kStuckMsFloor = 100;

struct LaunchOptions {
  std::int32_t ranks = 1;
  std::int64_t run_ms_max = 300000;    // the whole run
  std::int64_t stuck_ms_max = 30000;   // no rank's heartbeat advanced this long: the run ends
  std::string label = "rank";          // "cuda rank": the prefix of a rank's error line on stderr
  // The caller's own view of where every rank is (the simulator's step machines), appended to a
  // failure after the harness's positions. May be empty.
  std::function<std::string()> positions;
  std::function<void()> on_tick;       // about every kTickMs while the ranks run (a progress bar)
};

struct LaunchResult {
  std::string failure;        // empty when every rank exited 0
  bool deadlock = false;      // a rank gave up waiting, or the group made no progress
  bool stuck = false;         // the watchdog ended the run (no progress for stuck_ms_max)
  std::int32_t culprit = -1;  // the rank that died or made no progress, -1 if none stands out
  std::int64_t culprit_batch = -1;  // where the culprit was, from its progress record
  std::int32_t culprit_layer = -1;
};

// The rank body: returns the rank's exit code. Exceptions become one stderr line and kRankExitError.
using RankBody = std::function<int(std::int32_t rank, RankProgress& progress)>;

// Forks options.ranks children running `body`, watches and reaps them. Throws std::runtime_error
// (after killing and reaping the ranks already started) if a fork fails.
LaunchResult launch_ranks(const LaunchOptions& options, const RankBody& body);

// For a child forked by hand (a probe): die with the parent even if it died before this call
// (PR_SET_PDEATHSIG, then getppid), default signal dispositions. Returns false if the parent is
// already gone (the child should _exit at once).
bool prepare_child(pid_t parent);

}  // namespace cpkv::harness

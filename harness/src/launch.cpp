#include "cpkv/harness/launch.hpp"
#include "cpkv/harness/source.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <new>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "cpkv/harness/interrupt.hpp"
#include "registry.hpp"

namespace cpkv::harness {

void RankProgress::at(std::int64_t batch, std::int32_t layer) {
  record_->batch.store(batch, std::memory_order_relaxed);
  record_->layer.store(layer, std::memory_order_relaxed);
  beat();
}

void RankProgress::step(std::string_view name) {
  const std::size_t n = std::min(name.size(), record_->step.size() - 1);
  for (std::size_t i = 0; i < n; ++i) record_->step[i].store(name[i], std::memory_order_relaxed);
  record_->step[n].store('\0', std::memory_order_relaxed);
  beat();
}

namespace {

using Clock = std::chrono::steady_clock;

// A pause of the watching loop itself longer than this means the parent was stopped (Ctrl-Z) or
// starved; nobody's silence during it counts against them.
constexpr std::int64_t kParentPauseMs = 1000;
// A rank that is not waiting but has not beaten for this long is silent (a working rank beats at
// every step, layer or stage, far more often).
constexpr std::int64_t kSilentMsMin = 100;
// kStuckMsFloor (launch.hpp): the shortest no-progress window the watchdog applies.
// A silent rank's scheduler state (/proc/PID/stat) is read at most this often: a stop that
// waitpid did not report to us (a tracer's stop, 't') is still seen well within any window.
constexpr std::int64_t kStateReadMs = 50;

std::int64_t ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count();
}

// The progress records, in an anonymous shared mapping the children inherit.
class ProgressArea {
 public:
  explicit ProgressArea(std::int32_t ranks) : bytes_(sizeof(Progress) * static_cast<std::size_t>(ranks)) {
    void* at = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (at == MAP_FAILED) throw std::runtime_error(fmt::format("cannot map {} progress records: {}", ranks, std::strerror(errno)));
    records_ = static_cast<Progress*>(at);
    for (std::int32_t r = 0; r < ranks; ++r) new (records_ + r) Progress();
  }
  ~ProgressArea() { ::munmap(records_, bytes_); }
  ProgressArea(const ProgressArea&) = delete;
  ProgressArea& operator=(const ProgressArea&) = delete;
  Progress& operator[](std::int32_t rank) const { return records_[rank]; }

 private:
  std::size_t bytes_;
  Progress* records_ = nullptr;
};

// What the parent knows of one rank.
struct RankWatch {
  pid_t pid = -1;
  bool reaped = false;
  int stop_signal = 0;  // stopped by this signal now (waitpid WUNTRACED), 0 if not
  char state = '?';     // its /proc state while it is silent ('T' stopped, 't' stopped by a tracer), '?' unknown
  Clock::time_point state_read;
  std::string end;      // how it ended: "exited 0", "died from SIGKILL"
  std::uint64_t heartbeat = 0;
  Clock::time_point last_progress;  // its own record last advanced (never a peer's)
};

// The state letter of /proc/PID/stat ('R', 'S', 'D', 'T', 't', 'Z'), '?' if it cannot be read.
char proc_state(pid_t pid) {
  const std::string path = fmt::format("/proc/{}/stat", pid);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return '?';
  char text[512];
  const ssize_t n = ::read(fd, text, sizeof(text) - 1);
  ::close(fd);
  if (n <= 0) return '?';
  text[n] = '\0';
  const char* name_end = std::strrchr(text, ')');  // the command name may hold spaces and parentheses
  return name_end != nullptr && name_end[1] == ' ' && name_end[2] != '\0' ? name_end[2] : '?';
}

[[noreturn]] void run_child(const RankBody& body, const LaunchOptions& o, Progress& record, std::int32_t rank, pid_t parent) {
  if (!prepare_child(parent)) ::_exit(kRankExitError);
  int code = kRankExitError;
  try {
    record.started.store(1);
    RankProgress progress(record);
    code = body(rank, progress);
  } catch (const TraceChanged&) {
    // Every rank would print it: the launching process checks the trace once the ranks have ended
    // (check_unchanged) and says it in one line.
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cpkv: %s %d: %s\n", o.label.c_str(), rank, e.what());
    std::snprintf(record.error.data(), record.error.size(), "%s", e.what());
  }
  record.started.store(2);
  std::fflush(nullptr);
  ::_exit(code);  // never the parent's destructors: they own its shared memory
}

std::string step_of(const Progress& p) {
  std::string out;
  for (const auto& c : p.step) {
    const char ch = c.load(std::memory_order_relaxed);
    if (ch == '\0') break;
    out += ch;
  }
  return out.empty() ? "start" : out;
}

std::string waiting_text(std::int32_t who) {
  if (who == kNotWaiting) return "working";
  if (who == kWaitingOnPeers) return "waiting for its peers";
  if (who == kWaitingOnDevice) return "waiting for its GPU work (barriers, collectives)";
  return fmt::format("waiting for rank {}", who);
}

class Watcher {
 public:
  Watcher(const LaunchOptions& o, const ProgressArea& area) : o_(floored(o)), stuck_ms_asked_(o.stuck_ms_max), area_(area), ranks_(o.ranks) {}
  std::vector<RankWatch>& ranks() { return ranks_; }
  LaunchResult watch();

 private:
  void reap(Clock::time_point now);
  void ended(std::int32_t r, int raw);
  void observe_heartbeats(Clock::time_point now);
  void read_states(Clock::time_point now);
  void end_on_silent_rank(Clock::time_point now);
  void end_on_wait_cycle(Clock::time_point now);
  void end_on_wait_for_ended_rank(Clock::time_point now);
  void end_on_silent_group(Clock::time_point now);
  std::int32_t stalled_on(std::int32_t r, Clock::time_point now) const;
  std::vector<std::int32_t> stalled_waits(Clock::time_point now) const;
  std::vector<bool> behind_cycles(const std::vector<std::int32_t>& next, Clock::time_point* silent_since) const;
  std::string cycles_text(const std::vector<std::int32_t>& next) const;
  bool reaping_overdue(Clock::time_point now);
  std::string stop_cause(std::int32_t r) const;
  std::int32_t moved_on_without(std::int32_t r) const;
  std::int32_t culprit(Clock::time_point now) const;
  std::string positions(Clock::time_point now) const;
  std::string blame(std::int32_t r, Clock::time_point now) const;
  void fail(std::string headline, std::int32_t culprit);
  void stuck(std::string headline, std::int32_t culprit);
  std::int64_t window() const;
  std::int64_t own_window(std::int32_t r) const;
  void kill_all();

  static LaunchOptions floored(LaunchOptions o) {
    o.stuck_ms_max = std::max(o.stuck_ms_max, kStuckMsFloor);
    return o;
  }
  const LaunchOptions o_;             // stuck_ms_max at least kStuckMsFloor
  const std::int64_t stuck_ms_asked_;  // what the caller asked, named in a report when below the floor
  const ProgressArea& area_;
  std::vector<RankWatch> ranks_;
  LaunchResult result_;
  std::int32_t alive_ = 0;
  Clock::time_point group_progress_;
  std::optional<Clock::time_point> killed_;  // when kill_all() ran
};

// The group's no-progress window: stuck_ms_max, or longer while a live rank declared a quiet step
// (every rank inside an NCCL communicator setup is silent together).
std::int64_t Watcher::window() const {
  std::int64_t ms = o_.stuck_ms_max;
  for (std::int32_t r = 0; r < o_.ranks; ++r) {
    if (!ranks_[r].reaped) ms = std::max(ms, area_[r].quiet_ms_max.load());
  }
  return ms;
}

// One rank's own window: its own quiet declaration widens it, never a peer's.
std::int64_t Watcher::own_window(std::int32_t r) const { return std::max(o_.stuck_ms_max, area_[r].quiet_ms_max.load()); }

void Watcher::kill_all() {
  if (!killed_) killed_ = Clock::now();
  for (const RankWatch& w : ranks_) {
    if (!w.reaped) ::kill(w.pid, SIGKILL);
  }
}

// Killed ranks that do not go within kKillReapMsMax (a process stuck in a driver call cannot die
// until the call returns) are left to the kernel: the run ends and says so.
bool Watcher::reaping_overdue(Clock::time_point now) {
  if (!killed_ || alive_ == 0 || ms_between(*killed_, now) <= kKillReapMsMax) return false;
  result_.failure += fmt::format("; {} rank process{} could not be reaped within {} ms of SIGKILL", alive_, alive_ == 1 ? "" : "es", kKillReapMsMax);
  return true;
}

void Watcher::fail(std::string headline, std::int32_t culprit) {
  if (!result_.failure.empty()) return;
  const Clock::time_point now = Clock::now();
  result_.failure = fmt::format("{}: {}", headline, positions(now));
  if (o_.positions) result_.failure += "; " + o_.positions();
  result_.culprit = culprit;
  if (culprit >= 0) {
    result_.culprit_batch = area_[culprit].batch.load();
    result_.culprit_layer = area_[culprit].layer.load();
  }
  kill_all();
}

void Watcher::stuck(std::string headline, std::int32_t culprit) {
  result_.deadlock = true;
  result_.stuck = true;
  if (stuck_ms_asked_ < kStuckMsFloor) {
    headline += fmt::format(" (stuck_ms_max {} ms was raised to the floor of {} ms: shorter silence is scheduling jitter)", stuck_ms_asked_, kStuckMsFloor);
  }
  fail(std::move(headline), culprit);
}

// Why rank r is stopped ("a signal (SIGSTOP)", "a tracer"), or empty while it may run: waitpid's
// report, or its /proc state when waitpid said nothing (a tracer's stop is reported to the tracer).
std::string Watcher::stop_cause(std::int32_t r) const {
  const RankWatch& w = ranks_[r];
  if (w.reaped) return "";
  if (w.stop_signal != 0) return fmt::format("a signal ({})", detail::signal_name(w.stop_signal));
  if (w.state == 'T') return "a signal";
  if (w.state == 't') return "a tracer";
  return "";
}

// A live peer whose own record advanced more than half of r's window after r's last did (the
// latest such), or -1. Peers that all fell silent with r, within half a window, are a deadlock
// among equals, which the group's rule reports without blaming one of them.
std::int32_t Watcher::moved_on_without(std::int32_t r) const {
  std::int32_t latest = -1;
  for (std::int32_t q = 0; q < o_.ranks; ++q) {
    if (q == r || ranks_[q].reaped) continue;
    if (ms_between(ranks_[r].last_progress, ranks_[q].last_progress) <= own_window(r) / 2) continue;
    if (latest < 0 || ranks_[q].last_progress > ranks_[latest].last_progress) latest = q;
  }
  return latest;
}

// The rule of one rank, whatever the group's clock says (peers whose device barrier times out, or
// whose bounded waits give up and retry, keep that clock moving and must not hide the rank they
// wait for). A live rank whose own record has not advanced ends the run, named:
//   - stopped (by a signal or a tracer) and silent for stuck_ms_max: it cannot progress, and no
//     one's quiet declaration (not even its own) excuses that;
//   - silent for its own window while not waiting on one named peer (that peer is judged by this
//     rule in turn), and a peer kept making progress well after it fell silent.
void Watcher::end_on_silent_rank(Clock::time_point now) {
  if (!result_.failure.empty()) return;
  for (std::int32_t r = 0; r < o_.ranks; ++r) {
    const RankWatch& w = ranks_[r];
    const std::int64_t silent_ms = ms_between(w.last_progress, now);
    if (w.reaped || area_[r].started.load() == 2 || silent_ms <= o_.stuck_ms_max) continue;
    if (const std::string cause = stop_cause(r); !cause.empty()) {
      return stuck(fmt::format("{}; it cannot progress, whatever its peers do (window {} ms)", blame(r, now), o_.stuck_ms_max), r);
    }
    if (silent_ms <= own_window(r) || area_[r].waiting_on.load(std::memory_order_acquire) >= 0) continue;
    // The heartbeat was read before the wait (observe_heartbeats, then /proc): a wait that ended in
    // between beat first (done_waiting), so a beat seen now is progress, not silence.
    if (area_[r].heartbeat.load(std::memory_order_relaxed) != w.heartbeat) continue;
    if (const std::int32_t q = moved_on_without(r); q >= 0) {
      return stuck(fmt::format("{}; it made no progress while other ranks did (rank {}, {} ms ago; window {} ms)", blame(r, now), q,
                               ms_between(ranks_[q].last_progress, now), own_window(r)),
                   r);
    }
  }
}

// The peer rank r waits for, where that wait has lasted its whole window: r is live, silent for its
// own window and waiting on one named peer; else -1.
std::int32_t Watcher::stalled_on(std::int32_t r, Clock::time_point now) const {
  const std::int32_t who = area_[r].waiting_on.load();
  if (ranks_[r].reaped || area_[r].started.load() == 2 || who < 0 || who >= o_.ranks) return -1;
  return ms_between(ranks_[r].last_progress, now) > own_window(r) ? who : -1;
}

// stalled_on of every rank, read once per check, so that one walk sees one value per rank.
std::vector<std::int32_t> Watcher::stalled_waits(Clock::time_point now) const {
  std::vector<std::int32_t> next(static_cast<std::size_t>(o_.ranks), -1);
  for (std::int32_t r = 0; r < o_.ranks; ++r) next[r] = stalled_on(r, now);
  return next;
}

// Each cycle of `next` once, from its lowest rank: "0 -> 1 -> 0".
std::string Watcher::cycles_text(const std::vector<std::int32_t>& next) const {
  std::string out;
  for (std::int32_t r = 0; r < o_.ranks; ++r) {
    std::int32_t lowest = r;
    std::int32_t at = next[r];
    for (std::int32_t i = 0; i < o_.ranks && at >= 0 && at != r; ++i, at = next[at]) lowest = std::min(lowest, at);
    if (at != r || lowest != r) continue;  // not on a cycle, or not its lowest rank
    out += fmt::format("{}{}", out.empty() ? "" : ", ", r);
    for (at = next[r]; at != r; at = next[at]) out += fmt::format(" -> {}", at);
    out += fmt::format(" -> {}", r);
  }
  return out;
}

// The ranks a wait cycle holds for good: those of `next` (stalled_waits) whose stalled waits lead
// round in a cycle, and any live rank whose named waits lead to one of those, however short its
// own silence yet. `silent_since`: when the last of the stalled ones fell silent.
std::vector<bool> Watcher::behind_cycles(const std::vector<std::int32_t>& next, Clock::time_point* silent_since) const {
  std::vector<bool> lost(static_cast<std::size_t>(o_.ranks), false);
  *silent_since = Clock::time_point{};
  for (std::int32_t r = 0; r < o_.ranks; ++r) {
    std::int32_t at = r;
    for (std::int32_t i = 0; i < o_.ranks && at >= 0; ++i) at = next[at];  // `ranks` steps still stalled: a cycle
    if (at < 0) continue;
    lost[r] = true;
    *silent_since = std::max(*silent_since, ranks_[r].last_progress);
  }
  if (*silent_since == Clock::time_point{}) return lost;
  const auto waits_for = [&](std::int32_t r) {
    const std::int32_t who = area_[r].waiting_on.load();
    return ranks_[r].reaped || area_[r].started.load() == 2 || who >= o_.ranks ? -1 : who;
  };
  for (std::int32_t r = 0; r < o_.ranks; ++r) {
    std::int32_t at = waits_for(r);
    for (std::int32_t i = 0; i < o_.ranks && at >= 0 && !lost[at]; ++i) at = waits_for(at);
    if (at >= 0 && lost[at] && waits_for(r) >= 0) lost[r] = true;
  }
  return lost;
}

// The rule of a wait cycle: ranks each silent for their own window, each waiting on a named peer,
// whose waits lead round in a cycle (0 waits for 1, 1 for 0), can never progress; the one-rank
// rule excuses each of them (it waits on a peer) and peers whose bounded waits retry keep the
// group's clock moving. Once a rank outside them made progress more than half a window after the
// last of them fell silent, the run ends naming the cycle's ranks and every rank whose waits lead
// into it, each with whom it waited for. Waits that lead to a rank that progresses, or to one the
// other rules judge, are left alone; when every rank fell silent together the group's rule
// reports it.
void Watcher::end_on_wait_cycle(Clock::time_point now) {
  if (!result_.failure.empty()) return;
  // Checked every poll: nothing to walk (or allocate) until some rank has been silent a window.
  bool any_silent = false;
  for (std::int32_t r = 0; r < o_.ranks && !any_silent; ++r) any_silent = !ranks_[r].reaped && ms_between(ranks_[r].last_progress, now) > o_.stuck_ms_max;
  if (!any_silent) return;
  const std::vector<std::int32_t> next = stalled_waits(now);
  Clock::time_point silent_since;
  const std::vector<bool> lost = behind_cycles(next, &silent_since);
  if (silent_since == Clock::time_point{}) return;
  std::int32_t mover = -1;
  for (std::int32_t q = 0; q < o_.ranks; ++q) {
    if (lost[q] || ranks_[q].reaped || ms_between(silent_since, ranks_[q].last_progress) <= o_.stuck_ms_max / 2) continue;
    if (mover < 0 || ranks_[q].last_progress > ranks_[mover].last_progress) mover = q;
  }
  if (mover < 0) return;
  std::string named;
  for (std::int32_t r = 0; r < o_.ranks; ++r) {
    if (lost[r]) named += fmt::format("{}{}", named.empty() ? "" : "; ", blame(r, now));
  }
  stuck(fmt::format("{}; a wait cycle ({}) that no other rank can end, while other ranks made progress (rank {}, {} ms ago; window {} ms)",
                    named, cycles_text(next), mover, ms_between(ranks_[mover].last_progress, now), o_.stuck_ms_max),
        -1);
}

// The rule of an ended peer: a live rank silent for its own window while waiting on a rank that has
// already ended (exited 0: a rank that exits otherwise ends the run at once) can never progress; the
// one-rank rule excuses it (it waits on a named peer) and peers whose bounded waits retry keep the
// group's clock moving. The run ends naming it and the rank it waits for, which is blamed: it left
// the group while a peer still needed it.
void Watcher::end_on_wait_for_ended_rank(Clock::time_point now) {
  if (!result_.failure.empty()) return;
  for (std::int32_t r = 0; r < o_.ranks; ++r) {
    const std::int32_t who = stalled_on(r, now);
    if (who < 0 || !ranks_[who].reaped) continue;
    return stuck(fmt::format("{}; it waits for rank {}, which has ended ({}) and cannot answer (window {} ms)", blame(r, now), who,
                             ranks_[who].end, own_window(r)),
                 who);
  }
}

// The group's rule: no rank made progress for the group's window.
void Watcher::end_on_silent_group(Clock::time_point now) {
  if (!result_.failure.empty() || ms_between(group_progress_, now) <= window()) return;
  const std::int32_t c = culprit(now);
  stuck(c >= 0 ? fmt::format("{}; no rank made progress for {} ms", blame(c, now), window())
               : fmt::format("no rank made progress for {} ms and every rank is waiting (a deadlock)", window()),
        c);
}

void Watcher::observe_heartbeats(Clock::time_point now) {
  for (std::int32_t r = 0; r < o_.ranks; ++r) {
    RankWatch& w = ranks_[r];
    const std::uint64_t beat = area_[r].heartbeat.load(std::memory_order_relaxed);
    if (beat == w.heartbeat) continue;
    w.heartbeat = beat;
    w.last_progress = now;
    w.state = '?';  // it ran: a state read before is stale
    group_progress_ = now;
  }
}

// The /proc state of every silent live rank, at most every kStateReadMs each.
void Watcher::read_states(Clock::time_point now) {
  for (RankWatch& w : ranks_) {
    if (w.reaped || ms_between(w.last_progress, now) <= kSilentMsMin || ms_between(w.state_read, now) < kStateReadMs) continue;
    w.state = proc_state(w.pid);
    w.state_read = now;
  }
}

// The rank that made no progress: one stopped by a signal, else the live rank that is not waiting
// and has been silent longest, else the one furthest behind if it is alone there; -1 when every
// rank waits at the same place (a deadlock among them).
std::int32_t Watcher::culprit(Clock::time_point now) const {
  for (std::int32_t r = 0; r < o_.ranks; ++r) {
    if (!stop_cause(r).empty()) return r;
  }
  std::int32_t silent = -1;
  for (std::int32_t r = 0; r < o_.ranks; ++r) {
    const Progress& p = area_[r];
    if (ranks_[r].reaped || p.started.load() == 2 || p.waiting_on.load() != kNotWaiting) continue;
    if (silent < 0 || ranks_[r].last_progress < ranks_[silent].last_progress) silent = r;
  }
  if (silent >= 0 && ms_between(ranks_[silent].last_progress, now) > kSilentMsMin) return silent;
  std::int32_t behind = -1;
  bool alone = false;
  const auto key = [&](std::int32_t r) { return std::pair(area_[r].batch.load(), area_[r].layer.load()); };
  for (std::int32_t r = 0; r < o_.ranks; ++r) {
    if (ranks_[r].reaped) continue;
    if (behind < 0 || key(r) < key(behind)) {
      behind = r;
      alone = true;
    } else if (key(r) == key(behind)) {
      alone = false;
    }
  }
  return alone ? behind : -1;
}

std::string Watcher::blame(std::int32_t r, Clock::time_point now) const {
  const Progress& p = area_[r];
  const RankWatch& w = ranks_[r];
  const std::string cause = stop_cause(r);
  const std::string why = cause.empty() ? "" : fmt::format(", stopped by {}", cause);
  return fmt::format("rank {} (pid {}) made no progress for {} ms{} (at batch {} layer {} step '{}', {})", r, w.pid,
                     ms_between(w.last_progress, now), why, p.batch.load(), p.layer.load(), step_of(p), waiting_text(p.waiting_on.load()));
}

std::string Watcher::positions(Clock::time_point now) const {
  std::string out;
  for (std::int32_t r = 0; r < o_.ranks; ++r) {
    const Progress& p = area_[r];
    const RankWatch& w = ranks_[r];
    std::string state = w.reaped ? w.end : waiting_text(p.waiting_on.load());
    if (w.stop_signal != 0 && !w.reaped) state = fmt::format("stopped by {}", detail::signal_name(w.stop_signal));
    else if (const std::string cause = stop_cause(r); !cause.empty()) state = fmt::format("stopped by {}", cause);
    out += fmt::format("{}rank {} (pid {}) {} at batch {} layer {} step '{}', heartbeat {}, last progress {} ms ago", out.empty() ? "" : "; ", r,
                       w.pid, state, p.batch.load(), p.layer.load(), step_of(p), w.heartbeat, ms_between(w.last_progress, now));
  }
  return out;
}

void Watcher::ended(std::int32_t r, int raw) {
  RankWatch& w = ranks_[r];
  w.reaped = true;
  --alive_;
  if (WIFSIGNALED(raw)) {
    w.end = fmt::format("died from {}", detail::signal_name(WTERMSIG(raw)));
    const int sig = WTERMSIG(raw);
    // Ctrl-C reaches every rank with the parent: wait for the parent's own interruption before
    // calling this rank's death a failure (the watcher then ends the process quietly).
    const Clock::time_point settle = Clock::now() + std::chrono::milliseconds(kSignalSettleMs);
    while ((sig == SIGINT || sig == SIGTERM || sig == SIGHUP) && interrupted() == 0 && Clock::now() < settle) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (interrupted() == 0 && stop_requested() == 0) fail(fmt::format("rank {} (pid {}) died from signal {}", r, w.pid, sig), r);
    return;
  }
  const int status = WEXITSTATUS(raw);
  w.end = fmt::format("exited {}", status);
  if (status == kRankExitOk) return;
  if (status != kRankExitDeadlock) {
    // The rank's own words where an exception ended it (its stderr line says the same), so a report
    // names what failed, not only that something did.
    const std::string_view error(area_[r].error.data(), ::strnlen(area_[r].error.data(), area_[r].error.size()));
    return fail(fmt::format("rank {} (pid {}) exited with status {}{}", r, w.pid, status, error.empty() ? std::string() : fmt::format(" (\"{}\")", error)), r);
  }
  result_.deadlock = true;
  const Clock::time_point now = Clock::now();
  const std::int32_t c = culprit(now);
  if (c >= 0 && c != r) {
    return fail(fmt::format("{}; rank {} gave up waiting (exit status {})", blame(c, now), r, status), c);
  }
  fail(fmt::format("rank {} (pid {}) exited with status {} (gave up waiting; no other rank stands out: a deadlock)", r, w.pid, status), -1);
}

void Watcher::reap(Clock::time_point now) {
  for (std::int32_t r = 0; r < o_.ranks; ++r) {
    RankWatch& w = ranks_[r];
    if (w.reaped) continue;
    int raw = 0;
    if (detail::reap_tracked(w.pid, &raw, WNOHANG | WUNTRACED | WCONTINUED) != w.pid) continue;
    if (WIFSTOPPED(raw)) {
      w.stop_signal = WSTOPSIG(raw);
    } else if (WIFCONTINUED(raw)) {
      w.stop_signal = 0;
      w.last_progress = now;  // its silence while stopped was someone's decision, not a hang
    } else {
      ended(r, raw);
    }
  }
}

LaunchResult Watcher::watch() {
  const Clock::time_point start = Clock::now();
  Clock::time_point last_tick = start;
  Clock::time_point last_loop = start;
  group_progress_ = start;
  for (RankWatch& w : ranks_) w.last_progress = start;
  alive_ = o_.ranks;
  bool limit_reported = false;
  bool parked = false;
  while (alive_ > 0) {
    const Clock::time_point now = Clock::now();
    if (interrupted() != 0 && !parked) {
      // The interrupt watcher ends every rank and then the process; report nothing meanwhile. If
      // it has not done so within its own bounds, end the ranks here and say why.
      parked = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2 * kKillReapMsMax));
      fail(fmt::format("interrupted by {}, and the process did not end", detail::signal_name(interrupted())), -1);
    }
    if (stop_requested() != 0 && result_.failure.empty()) {  // request_stop has SIGKILLed the ranks: reap them
      fail(fmt::format("stopped: interrupted by {}", detail::signal_name(stop_requested())), -1);
    }
    if (ms_between(last_loop, now) > kParentPauseMs) {  // the parent itself was stopped: restart the clocks
      for (RankWatch& w : ranks_) w.last_progress = now;
      group_progress_ = now;
    }
    last_loop = now;
    reap(now);
    if (reaping_overdue(now)) break;
    observe_heartbeats(now);
    read_states(now);
    end_on_silent_rank(now);
    end_on_wait_cycle(now);
    end_on_wait_for_ended_rank(now);
    end_on_silent_group(now);
    if (!limit_reported && ms_between(start, now) > o_.run_ms_max) {
      limit_reported = true;
      fail(fmt::format("run limit {} ms reached", o_.run_ms_max), -1);
    }
    if (o_.on_tick && ms_between(last_tick, now) > kTickMs) {
      last_tick = now;
      o_.on_tick();
    }
    std::this_thread::sleep_for(std::chrono::microseconds(kPollUs));
  }
  return result_;
}

// A fork that failed after some ranks started: kill and reap those, then throw one line.
[[noreturn]] void abandon(std::vector<RankWatch>& ranks, std::int32_t failed_rank, int error_number) {
  for (RankWatch& w : ranks) {
    if (w.pid <= 0) continue;
    ::kill(w.pid, SIGKILL);
    int raw = 0;
    detail::reap_tracked(w.pid, &raw, 0);
  }
  throw std::runtime_error(fmt::format("fork for rank {} failed: {}", failed_rank, std::strerror(error_number)));
}

}  // namespace

LaunchResult launch_ranks(const LaunchOptions& o, const RankBody& body) {
  if (o.ranks < 1 || o.ranks > kRanksMax) throw std::invalid_argument(fmt::format("{} ranks is outside 1..{}", o.ranks, kRanksMax));
  ProgressArea area(o.ranks);
  Watcher watcher(o, area);
  const pid_t parent = ::getpid();
  std::fflush(nullptr);  // a child must not flush the parent's buffered output a second time
  for (std::int32_t r = 0; r < o.ranks; ++r) {
    const pid_t pid = fork_tracked_rank();
    if (pid < 0) abandon(watcher.ranks(), r, errno);
    if (pid == 0) run_child(body, o, area[r], r, parent);
    watcher.ranks()[r].pid = pid;
  }
  return watcher.watch();
}

}  // namespace cpkv::harness

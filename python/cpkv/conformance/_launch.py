"""The launcher: spawns the ranks, watches them, names the first that fails, and tears the group down.

Every wait is bounded. A rank's own waits are bounded by the process groups' timeout (window_s:
gloo and NCCL raise after it, and the rank reports the raise). The launcher bounds everything else:
a rank that dies is named as soon as its exit code is seen; a run in which no rank has published a
new position for window_s + WATCHDOG_GRACE_S is a hang, and every rank's position is reported. Then
every rank still alive gets SIGTERM, SIGKILL after KILL_GRACE_S, and the run's shared memory is
removed, so nothing is left running and nothing is left in /dev/shm.
"""

from __future__ import annotations

import dataclasses
import itertools
import multiprocessing
import os
import queue as queue_module
import signal
import socket
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

from .._errors import InputError
from . import _adversity as adv
from . import _channel, _lifeline, _stderr
from . import _shm
from ._rank import RunSpec, harness_timeout_s, rank_main

# A rank stuck outside any wait of its own (in the implementation's Python, say) is reported this
# long after the harness group's timeout (harness_timeout_s) would have fired for a rank inside a wait.
WATCHDOG_GRACE_S = 5.0
# How long a terminated rank may take to exit before it is killed.
KILL_GRACE_S = 3.0
POLL_S = 0.05
# Setup (process-group rendezvous, importing torch in a fresh interpreter) on a loaded machine.
STARTUP_S_MAX = 120.0

# A rank seen exiting (PF_EXITING) is reaped within this bound (a bound only: exiting takes milliseconds).
DEATH_S_MAX = 30.0
PF_EXITING = 0x4  # include/linux/sched.h: set at the start of do_exit, before the process's files close

_serial = itertools.count()


def _exiting(pid: Optional[int]) -> bool:
    """The process is a zombie or inside exit (/proc/PID/stat: state Z or X, or flags PF_EXITING)."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return True  # gone
    return fields[0] in ("Z", "X") or int(fields[6]) & PF_EXITING != 0


def _timed_out(line: str) -> bool:
    """A raise that is a wait's timeout (ctx's TimeoutError, gloo's "Timed out"): maybe a consequence."""
    text = line.lower()
    return "timeouterror" in text or "timed out" in text or "timeout" in text


def exit_words(code: int) -> str:
    """An exit status as words: exit code N, or the signal by name (SIGKILL: also the OOM killer's)."""
    if code >= 0:
        return f"exit code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"
    if -code == signal.SIGKILL:
        return f"signal {-code} {name}: killed from outside it, the kernel's OOM killer among others"
    return f"signal {-code} {name}"


@dataclass
class Outcome:
    """What a run found. passed: no mismatch, no finding, no failure."""

    batches: List[dict] = field(default_factory=list)
    failure: Optional[str] = None          # the first rank failure, one located line
    failure_kind: Optional[str] = None     # raised, died, hang, contract
    positions: List[str] = field(default_factory=list)
    seconds: float = 0.0
    leftovers: List[str] = field(default_factory=list)
    capture: List[List[str]] = field(default_factory=list)  # CUDA: per rank, per layer 'yes' or 'no: ...'
    capture_batch: Optional[int] = None                     # the batch whose layers were captured
    builtin: Optional[object] = None  # --time on CUDA: cpkv's staging_direct from `cpkv bench` (a dict, ms) or why not (a line)

    def record(self, message: tuple) -> Optional[dict]:
        """Take a rank-0 report ('batch' or 'capture'); returns the batch record it added, if any."""
        if message[0] == "capture":
            self.capture_batch, self.capture = message[2], message[3]
            return None
        record = dict(message[3], batch=message[2])
        self.batches.append(record)
        return record

    @property
    def mismatches(self) -> List[str]:
        return [m for b in self.batches for m in b["mismatches"]]

    @property
    def findings(self) -> List[str]:
        return [f for b in self.batches for f in b["findings"]]

    @property
    def passed(self) -> bool:
        return self.failure is None and not self.mismatches and not self.findings

    def checks_fired(self) -> List[str]:
        """The checks that fired, in the order they fire in a run: the byte check at a layer's end,
        then the batch's invariant findings (event replay, overflow verdicts), then a rank failure."""
        fired: List[str] = []
        for b in self.batches:
            if b["mismatches"]:
                fired.append("bytes")
            for finding in b["findings"]:
                fired.append(finding.split(" (")[0] if finding.startswith("invariant") else "contract")
        if self.failure:
            fired.append({"raised": "raised", "contract": "contract"}.get(self.failure_kind or "", "liveness"))
        return list(dict.fromkeys(fired))

    def first_check(self) -> str:
        fired = self.checks_fired()
        return fired[0] if fired else ""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def describe_positions(table: torch.Tensor, alive: Dict[int, bool]) -> List[str]:
    lines = []
    now = time.monotonic_ns()
    for rank in range(table.shape[0]):
        batch, layer, stage, t_ns = (int(table[rank, c]) for c in (adv.COL_BATCH, adv.COL_LAYER, adv.COL_STAGE, adv.COL_TIME_NS))
        since = f", {((now - t_ns) / 1e9):.1f} s ago" if t_ns else ""
        state = "" if alive.get(rank, False) else " (exited)"
        lines.append(f"rank {rank}: batch {batch} layer {layer} in {adv.STAGE_NAMES[stage]}{since}{state}")
    return lines


class Launcher:
    """One launch: the ranks run the given cases in turn (one session); a case whose ranks fail ends
    the launch, and the caller relaunches for the cases after it."""

    def __init__(self, specs: List[RunSpec]) -> None:
        _shm.sweep_stale()
        base = _shm.run_id(os.getpid(), next(_serial))
        self.lock = _shm.RunLock(base)  # held while this launch lives: a sweep judges liveness by it, not by a pid
        port = free_port()
        for case, spec in enumerate(specs):
            spec.run, spec.positions_run = f"{base}-c{case}", base
            spec.init_method = f"tcp://127.0.0.1:{port}"
        self.specs = specs
        self.base = base
        self.cp = specs[0].setting.cp
        self.window_s = max(spec.window_s for spec in specs)
        path = _shm.path_of(base, "positions", 0)
        _shm.create_file(path, self.cp * adv.POSITION_COLUMNS * 8)
        self.positions = _shm.map_file(path, self.cp * adv.POSITION_COLUMNS * 8).view(torch.int64).view(self.cp, adv.POSITION_COLUMNS)
        self.context = multiprocessing.get_context("spawn")
        # The ranks' lifeline: only this process holds the write end, so its death (any signal) is EOF in every rank.
        self.lifeline, self.lifeline_end = self.context.Pipe(duplex=False)
        # The ranks' reports: a pipe per rank (_channel), not a Queue, whose named semaphores a killed
        # launcher left in /dev/shm where no sweep can tell whose they are (issue 34, item 5).
        readers, writers = _channel.pipes(self.context, self.cp)
        self.queue = _channel.Inbox(readers)
        self.outboxes = [_channel.Outbox(w) for w in writers]
        self.processes: List[multiprocessing.Process] = []
        self.stderr: List[_stderr.Tee] = []  # per rank: its stderr, passed through, and its tail for a death's line
        self.outcomes = [Outcome() for _ in specs]
        self.done: List[set] = [set() for _ in specs]
        self.fatal = False
        self.finished: set = set()  # ranks that exited 0 after reporting every case
        self.case = 0  # the case the ranks are in (the lowest not yet done by every rank)

    # What each spawned rank runs (a benchmark swaps in a loop of its own, keeping the watchdog and teardown).
    rank_target = staticmethod(rank_main)

    def start(self) -> None:
        for rank in range(self.cp):
            self.spawn(rank, self.rank_target, (rank, self.specs, self.outboxes[rank]))

    def spawn(self, rank: int, target, args: tuple) -> None:
        """One rank process, tied to this launcher (_lifeline: its own session, a death signal and a
        pipe it watches, a subreaper of what its implementation forks)."""
        stderr_in, stderr_out = self.context.Pipe(duplex=False)
        p = self.context.Process(target=_lifeline.rank_entry, args=(target, self.lifeline, os.getpid(), stderr_out, *args),
                                 name=f"cpkv-conformance-rank{rank}", daemon=True)
        p.start()
        stderr_out.close()  # the rank's alone now: its end (and its descendants') is the pipe's EOF
        self.stderr.append(_stderr.Tee(stderr_in))
        self.processes.append(p)
        for arg in args:  # the rank's ends of its pipes are the rank's alone now (their EOF is its exit)
            if isinstance(arg, (_channel.Inbox, _channel.Outbox)):
                arg.close()

    def run(self) -> List[Outcome]:
        """The outcomes of the cases run: all of them, or up to and including the one that failed."""
        self.case_begun = time.monotonic()
        try:
            self.start()
            self.watch()
        finally:
            self.teardown()
        ran = self.outcomes[: self.case + 1] if self.failed() else self.outcomes
        for outcome in ran:
            outcome.seconds = outcome.seconds or self.case_wall_s()
        return ran

    def case_wall_s(self) -> float:
        """Outcome.seconds, the same on a pass and a failure: the wall time of the case the ranks are in,
        from its start (the launch's, the processes' start included, for a launch's first case; the end
        of the case before it for the others) to now (every rank done, or the failure seen)."""
        now = time.monotonic()
        seconds, self.case_begun = now - self.case_begun, now
        return seconds

    @property
    def outcome(self) -> Outcome:
        return self.outcomes[min(self.case, len(self.outcomes) - 1)]

    def failed(self) -> bool:
        """A failure that ends the launch: a rank raised outside a batch, died or hung."""
        return self.fatal

    def fail(self, kind: str, line: str) -> None:
        self.fatal = True
        self.outcome.failure_kind = kind
        self.outcome.failure = line
        self.outcome.positions = describe_positions(self.positions, {r: p.is_alive() for r, p in enumerate(self.processes)})

    def handle(self, message: tuple) -> None:
        what, case = message[0], message[1]
        outcome = self.outcomes[case]
        if what == "capture":
            outcome.record(message)
        elif what == "capturable":
            outcome.capture_batch = message[2]  # to probe (probe_captures): the last batch every rank composed
        elif what == "batch":
            record = outcome.record(message)
            if record["raised"] and outcome.failure is None:
                # Raised inside a batch and reported through the batch sync (a wait of the
                # implementation's that timed out, the first raiser named): the launch ends here,
                # since a gloo group whose collective timed out is broken, and reusing it failed the
                # next, correct case (issue 35, item 7d); the next case starts fresh processes.
                outcome.failure_kind, outcome.failure = "raised", record["raised"][0]
                self.fatal = True
        elif what == "done":
            self.done[case].add(message[2])
            if len(self.done[case]) == self.cp:
                outcome.seconds = self.case_wall_s()
                if case + 1 < len(self.specs) and not self.fatal:  # a failed case ends the launch: the next is not run here
                    self.case = case + 1
        elif what == "error" and not self.fatal:
            self.failure_reported(message)
        elif what == "raising" and not self.fatal and not _timed_out(message[3]):
            # Sent as a rank raised in compose_layer, before its batch sync: reported now, not when the
            # peers' waits on it time out, and the group torn down (its collectives are out of step).
            # A timeout is left to the batch sync, where the harness's own wait names the rank it
            # waited for (a peer that never returned) when there is one.
            self.failure_reported(message)

    def failure_reported(self, message: tuple) -> None:
        """A rank's failure report: 'error' (rank, kind, line, where, raised_ns) as it ends, or
        'raising' (rank, line, raised_ns) as compose_layer raised. A peer that died without a report is
        what is named (the report is its consequence). A peer that exited has sent all it will send, so
        its pipe is read to the end first: when it reported too, the earlier raise of the two is named,
        whichever pipe was read first (under load both ranks of a case refused in setup and exited before
        the launcher read either: rank 1's exit was taken for a death without a report, issue 35, item 9)."""
        reports = [message]
        dead = self.dying_peer(message[2], reports)
        if self.fatal:
            return  # a peer's earlier message (its batch's raise) was named while its pipe was read
        if dead is not None:
            self.fail("died", self.death_line(dead, self.processes[dead].exitcode))
            return
        first = min(reports, key=lambda m: m[-1])
        if first[0] == "raising":
            self.fail("raised", first[3])
            return
        _, _, rank, kind, line, where, _ = first
        culprit = self.culprit(rank)
        if culprit is not None:
            # A harness wait timed out: the rank to name is the one that never came to it.
            self.fail("hang", f"rank {culprit} {self.where(culprit)}: never returned (rank {rank} timed out waiting for it "
                              f"at {adv.STAGE_NAMES[self.stage(rank)]}: {line})")
        else:
            self.fail(kind, f"rank {rank} {self.where(rank)}: {line}" + (f" (at {where})" if where else ""))

    def all_done(self) -> bool:
        return len(self.done[-1]) == self.cp

    def stage(self, rank: int) -> int:
        return int(self.positions[rank, adv.COL_STAGE])

    def culprit(self, rank: int):
        """For a rank that failed at a harness wait: the peer still inside the implementation that has
        been there longest, or None (the failing rank is itself the one to name)."""
        if self.stage(rank) not in (adv.STAGE_BATCH_SYNC, adv.STAGE_TEARDOWN, adv.STAGE_SETUP):
            return None
        inside = [p for p in range(self.cp) if p != rank and self.stage(p) < self.stage(rank) and self.stage(p) >= adv.STAGE_COMPOSE]
        if not inside:
            return None
        return min(inside, key=lambda p: int(self.positions[p, adv.COL_TIME_NS]))

    def where(self, rank: int) -> str:
        row = self.positions[rank]
        batch, layer, stage = int(row[adv.COL_BATCH]), int(row[adv.COL_LAYER]), int(row[adv.COL_STAGE])
        if batch < 0:
            return f"in {adv.STAGE_NAMES[stage]}"
        return f"batch {batch} layer {layer} in {adv.STAGE_NAMES[stage]}"

    def drain(self, timeout_s: float) -> None:
        try:
            self.handle(self.queue.get(timeout=timeout_s))
            while True:
                self.handle(self.queue.get_nowait())
        except queue_module.Empty:
            pass

    def last_progress_ns(self) -> int:
        return int(self.positions[:, adv.COL_TIME_NS].max())

    def watch(self) -> None:
        window_ns = int(self.watchdog_s() * 1e9)
        started_ns = time.monotonic_ns()
        while not self.all_done() and not self.failed():
            self.drain(POLL_S)
            if self.failed() or self.all_done() or self.check_exits():
                return
            last = max(self.last_progress_ns(), started_ns)
            limit = window_ns if self.last_progress_ns() else int(STARTUP_S_MAX * 1e9)
            if time.monotonic_ns() - last > limit:
                self.fail("hang", self.hang_line())
                return

    def check_exits(self) -> bool:
        """True when the watch is over: a rank died (named, with its exit status or signal) or every
        case is done. A rank that exited 0 after reporting every case is not a failure, however late
        a slower peer's report is (issue 35, item 7a): its own reports are in its pipe before it exits
        (a pipe's send returns once the message is written: _channel), so one drain without waiting reads them."""
        for rank, p in enumerate(self.processes):
            if p.exitcode is None or rank in self.finished:
                continue
            self.drain_now()
            if self.failed():
                return True
            if p.exitcode == 0 and all(rank in done for done in self.done):
                self.finished.add(rank)
                continue
            self.fail("died", self.death_line(rank, p.exitcode))
            return True
        return self.all_done()

    def drain_now(self) -> None:
        """Every report already in the queue, without waiting."""
        try:
            while True:
                self.handle(self.queue.get_nowait())
        except queue_module.Empty:
            pass

    def death_line(self, rank: int, code: int) -> str:
        tail = self.stderr[rank].tail() if rank < len(self.stderr) else ""
        return f"rank {rank} {self.where(rank)}: died ({exit_words(code)}) without a report" + (f"; its stderr ended: {tail}" if tail else "")

    def dying_peer(self, reporter: int, reports: Optional[List[tuple]] = None) -> Optional[int]:
        """A rank other than `reporter` that died or is dying without a report: the cause to name
        before the reporter's consequent error (a gloo "Connection reset by peer" comes from a peer's
        death; issue 35, item 7f). A dying process is flagged PF_EXITING before its sockets close, so
        the peer's error can never be seen before the flag: no wall-clock window is involved. Such a
        peer's pipe is read to its end (rest_of): its other messages are handled, and its failure
        reports go to `reports`; a peer that left one did not die without a report."""
        for rank, p in enumerate(self.processes):
            if rank == reporter or rank in self.finished:
                continue
            if p.exitcode is not None or _exiting(p.pid):
                p.join(DEATH_S_MAX)  # it is exiting: its status comes within the bound
                if p.exitcode is None:
                    continue
                left = self.failure_reports_left_by(rank)
                if reports is not None:
                    reports += left
                if not left and not (p.exitcode == 0 and all(rank in done for done in self.done)):
                    return rank
        return None

    def failure_reports_left_by(self, rank: int) -> List[tuple]:
        """What an exited rank's pipe still holds: its failure reports, returned; the rest, handled."""
        failures = []
        for message in self.queue.rest_of(rank):
            if message[0] == "error" or (message[0] == "raising" and not _timed_out(message[3])):
                failures.append(message)
            else:
                self.handle(message)
        return failures

    def hang_line(self) -> str:
        # The rank that has been where it is longest is the one the others wait on.
        stale = min(range(self.cp), key=lambda r: int(self.positions[r, adv.COL_TIME_NS]))
        return (f"rank {stale} {self.where(stale)}: no rank moved for {self.watchdog_s():.0f} s (liveness: a hang; the "
                f"implementation's waits time out after {self.window_s:.0f} s, the harness's after {harness_timeout_s(self.window_s):.0f} s)")

    def watchdog_s(self) -> float:
        return harness_timeout_s(self.window_s) + WATCHDOG_GRACE_S

    def teardown(self) -> None:
        if self.failed() or not self.all_done():
            for p in self.processes:
                if p.is_alive():
                    _lifeline.kill_descendants(p.pid)  # alive, so not reaped: the pid is still the rank's
                    p.terminate()
        deadline = time.monotonic() + KILL_GRACE_S
        for p in self.processes:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self.processes:
            if p.is_alive():
                p.kill()
                p.join(KILL_GRACE_S)
        if not self.failed():
            self.drain(0.0)
        for p in self.processes:
            _lifeline.kill_group(p.pid)  # what the implementation forked into the rank's group, and nothing else
        self.lifeline.close()
        self.lifeline_end.close()
        for tee in self.stderr:
            tee.close(KILL_GRACE_S)  # every rank and its group are gone: the pipes are at their end
        codes = [p.exitcode for p in self.processes]
        if not self.failed() and any(c != 0 for c in codes):
            self.fail("died", f"ranks exited with {codes}")
        _shm.remove_sim_regions([p.pid for p in self.processes if p.pid])
        for spec in self.specs:
            _shm.remove_run(spec.run)
        _shm.remove_run(self.base)
        self.lock.release()
        self.queue.close()
        left = [path for spec in self.specs for path in _shm.leftovers(spec.run)] + _shm.leftovers(self.base)
        self.outcome.leftovers = left + [f"rank {r} pid {p.pid}" for r, p in enumerate(self.processes) if p.is_alive()]


def launch_cases(specs: List[RunSpec]) -> List[Outcome]:
    """Every case, in as few launches as possible: a case that fails its ranks ends a launch and the
    next launch starts at the case after it. All cases must have the same cp. Then, on CUDA, the
    graph-capture probe of every checked case that passed (probe_captures)."""
    outcomes: List[Outcome] = []
    while len(outcomes) < len(specs):
        outcomes += Launcher(specs[len(outcomes):]).run()
    probe_captures(specs, outcomes)
    return outcomes


def probe_captures(specs: List[RunSpec], outcomes: List[Outcome]) -> None:
    """CUDA: each case whose ranks named a batch to capture ('capturable') gets the capture probe in
    a launch of its own: fresh rank processes, whose sync-counting trace hooks were never switched on
    (_probes.try_capture says why that matters). Their answers land in the case's outcome."""
    pending = [(s, o) for s, o in zip(specs, outcomes) if not s.capture_only and o.capture_batch is not None and not o.capture]
    if not pending:
        return
    probes = [dataclasses.replace(s, capture_only=True, capture_from=o.capture_batch, delays=False) for s, o in pending]
    for (spec, outcome), probed in zip(pending, launch_cases(probes)):
        outcome.capture_batch, outcome.capture = probed.capture_batch, probed.capture
        if not probed.capture:
            outcome.capture = [[f"no: the capture probe's ranks failed: {probed.failure or 'no answer'}"] * spec.layers]
        outcome.leftovers += probed.leftovers


def launch(spec: RunSpec) -> Outcome:
    return launch_cases([spec])[0]


class SessionLauncher(Launcher):
    """A launch whose ranks wait for cases one at a time (a per-rank queue), so that a caller that
    makes cases as it goes (Hypothesis) pays for the processes' start once."""

    def __init__(self, first: RunSpec) -> None:
        super().__init__([first])
        readers, writers = _channel.pipes(self.context, self.cp)
        self.rank_inboxes = [_channel.Inbox([r]) for r in readers]
        self.case_queues = [_channel.Feeder(w) for w in writers]
        self.started = False

    def start(self) -> None:
        for rank in range(self.cp):
            self.spawn(rank, rank_main, (rank, self.rank_inboxes[rank], self.outboxes[rank]))
        self.started = True

    def submit(self, spec: RunSpec) -> None:
        if self.started:
            k = len(self.specs)
            spec.run, spec.positions_run, spec.init_method = f"{self.base}-c{k}", self.base, self.specs[0].init_method
            self.specs.append(spec)
            self.outcomes.append(Outcome())
            self.done.append(set())
            self.case = k
        else:
            self.start()
        for q in self.case_queues:
            q.put(self.specs[-1])

    def run_one(self, spec: RunSpec) -> Outcome:
        self.case_begun = time.monotonic()
        self.submit(spec)
        self.watch()
        outcome = self.outcomes[-1]
        outcome.seconds = outcome.seconds or self.case_wall_s()
        return outcome

    def close(self) -> None:
        if not self.failed():
            for q in self.case_queues:
                q.put(None)
        self.teardown()
        for q in self.case_queues:
            q.close(KILL_GRACE_S)  # the ranks are gone: a send still blocked on one fails at once (EPIPE)


class Session:
    """Cases run one at a time over rank processes that stay up between them (with: closes them).
    A case that ends with a rank that died or hung tears the ranks down; the next case starts new
    ones. Every case of a session must have the same cp; the waits are bounded by the first case's
    window."""

    def __init__(self) -> None:
        self.launcher: Optional[SessionLauncher] = None

    def run(self, spec: RunSpec) -> Outcome:
        if self.launcher is None:
            self.launcher = SessionLauncher(spec)
        elif spec.setting.cp != self.launcher.cp:
            raise InputError("spec", f"a session of cp {self.launcher.cp} cannot run a case of cp {spec.setting.cp} "
                                     "(every case of a session has the session's cp; use another Session)")
        outcome = self.launcher.run_one(spec)
        outcome.capture_batch = None  # a session (a search) runs no capture probe: it would start new ranks per case
        if self.launcher.failed():
            self.close()
        return outcome

    def close(self) -> None:
        if self.launcher is not None:
            self.launcher.close()
            self.launcher = None

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

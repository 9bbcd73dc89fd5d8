"""Conformance ranks die with their launcher, and an implementation's processes die with its rank.

A killed launcher (SIGTERM, SIGKILL, SIGHUP) orphaned its ranks: they ran on as long as the
implementation hung, holding /dev/shm files and the resource tracker's semaphores (issue 34, items 5
and 17). Now each rank, first thing:
- starts a session of its own (os.setsid): the terminal's Ctrl-C reaches the launcher alone, which
  tears the ranks down, and the rank's process group holds whatever the implementation forks;
- asks the kernel for SIGTERM when its parent dies (PR_SET_PDEATHSIG), and watches a pipe whose
  other end only the launcher holds (EOF: the launcher is gone, however it died);
- becomes a subreaper (PR_SET_CHILD_SUBREAPER): a process the implementation detaches (a double
  fork, a `setsid sleep 600`) stays its descendant, so it can be found and killed;
- takes SIGTERM and SIGHUP on a thread of its own (they are blocked everywhere else, so the
  implementation's code cannot swallow them), which kills every descendant and then the group.
A rank that ends normally kills its descendants before it exits (end_rank), and the launcher kills
every live rank's descendants and every rank's process group at its teardown (kill_group).
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from typing import Dict, List

from . import _stderr

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
# Rounds of killing a tree that forks while it is killed; each round ends with the reaping.
KILL_ROUNDS_MAX = 100
ROUND_PAUSE_S = 0.01
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGHUP}


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _parents() -> Dict[int, int]:
    """pid -> parent pid of every process this user can see."""
    table: Dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                table[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return table


def descendants(pid: int) -> List[int]:
    """Every live descendant of pid, children first."""
    parents = _parents()
    found, frontier = [], [pid]
    while frontier:
        children = [p for p, parent in parents.items() if parent in frontier and p not in found]
        found += children
        frontier = children
    return found


def _reap_children() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_descendants(pid: int, reap: bool = False) -> int:
    """SIGKILL every descendant of pid until none is left (bounded rounds); returns how many were killed.
    reap: pid is this process (a subreaper): reap what it inherits as it goes."""
    killed = 0
    for _ in range(KILL_ROUNDS_MAX):
        tree = descendants(pid)
        if not tree:
            break
        for p in tree:
            try:
                os.kill(p, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
        if reap:
            _reap_children()
        time.sleep(ROUND_PAUSE_S)
    if reap:
        _reap_children()
    return killed


def _die() -> None:
    """The launcher asked (SIGTERM) or is gone: every descendant, then this rank's whole group."""
    kill_descendants(os.getpid(), reap=True)
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _watch_signals() -> None:
    signal.sigwait(_STOP_SIGNALS)
    _die()


def _watch_pipe(fd: int) -> None:
    while True:
        try:
            if os.read(fd, 1) == b"":
                break
        except InterruptedError:
            continue
        except OSError:
            break
    _die()


def become_rank(lifeline_fd: int, launcher_pid: int) -> None:
    """What a spawned rank does before anything else (see the module's docstring)."""
    os.setsid()
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)  # before any thread: every later thread inherits it
    _prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    threading.Thread(target=_watch_signals, name="cpkv-rank-signals", daemon=True).start()
    threading.Thread(target=_watch_pipe, args=(lifeline_fd,), name="cpkv-rank-lifeline", daemon=True).start()
    if os.getppid() != launcher_pid:  # the launcher died before the death signal was asked for
        _die()


def rank_entry(target, lifeline, launcher_pid: int, stderr_end, *args) -> None:
    """The spawned process's target: become a rank tied to its launcher, then run target(*args).
    lifeline: the read end of the launcher's pipe (a multiprocessing Connection); stderr_end: the
    write end of the pipe that is the rank's stderr (_stderr: its tail names a death's cause)."""
    _stderr.redirect(stderr_end)
    become_rank(lifeline.fileno(), launcher_pid)
    target(*args)


def end_rank() -> None:
    """A rank's last act before it exits: whatever its implementation started goes with it."""
    kill_descendants(os.getpid(), reap=True)


def kill_group(pid: int) -> None:
    """SIGKILL the process group of rank pid (its own session's group): what the implementation
    forked and left in it, after the rank itself is gone as well as before. The group's id cannot be
    another process's while any member lives."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass

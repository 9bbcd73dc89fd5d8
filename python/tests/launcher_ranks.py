"""Implementations and rank bodies for test_conformance_launcher.py (loaded by path as a user's file
is, or imported by the spawned ranks by module name): ranks that die, fork, hang, or report late.

Every rendezvous with the test goes through files in $CPKV_TEST_DIR (a rank writes `NAME.<rank>`
holding its pid), so the test waits on logical progress, never on a clock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import torch.distributed as dist

from cpkv.conformance.reference import StagingDirect

# A bound only: how long a test rank waits for something the test or the launcher must do.
WAIT_S_MAX = 120.0


def mark(name: str, rank: int) -> None:
    folder = os.environ.get("CPKV_TEST_DIR")
    if folder:
        # Written aside and renamed: a test waiting for the name never reads it empty (seen once,
        # on a fresh clone's suite: `int('')` in _rank_pids).
        path = os.path.join(folder, f"{name}.{rank}")
        with open(path + ".part", "w") as f:
            f.write(str(os.getpid()))
        os.replace(path + ".part", path)


def _reaped(pid: int) -> bool:
    return not os.path.exists(f"/proc/{pid}")


def late_done_drive(specs, rank, reporter) -> None:
    """drive(), except that rank 0's last report ("done") waits until rank 1 has exited and been
    reaped by the launcher (whose exit check then sees a rank that exited 0 while a peer's report
    is still to come: issue 35, item 7a), and then a little longer than that check used to wait."""
    from cpkv.conformance._rank import drive

    folder = os.environ["CPKV_TEST_DIR"]
    mark("rank", rank)
    send = reporter.send

    def late_send(what, *message):
        if what == "done" and rank == 0:
            path = os.path.join(folder, "rank.1")
            deadline = time.monotonic() + WAIT_S_MAX
            while time.monotonic() < deadline and not (os.path.exists(path) and _reaped(int(open(path).read() or 0))):
                time.sleep(0.02)
            time.sleep(2.0)  # past the old exit check's 0.5 s drain; the fixed check waits on no clock
        send(what, *message)

    reporter.send = late_send
    drive(specs, rank, reporter)


def late_done_rank(rank, specs, queue) -> None:
    from cpkv.conformance._rank import rank_main

    rank_main(rank, specs, queue, body=late_done_drive)


class DiesInLayer0(StagingDirect):
    """Rank 0 dies in layer 0 of batch 0 while rank 1 waits for it in a collective of the
    implementation's group: by SIGKILL (as the OOM killer kills) or exit status 3 (mode), the latter
    after two lines on stderr (last_words); or by sys.exit(0) (sys_exit), which is a raise to report."""

    def __init__(self, mode: str = "sigkill", **kwargs) -> None:
        super().__init__(**kwargs)
        self.mode = mode

    def compose_layer(self, ctx, layer):
        if ctx.batch_index == 0 and layer == 0:
            if ctx.rank == 0:
                if self.mode == "sigkill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if self.mode == "sys_exit":  # an engine that ends the process as Python code does
                    sys.exit(0)
                if self.mode == "last_words":  # as a C library writes before it exits
                    os.write(2, b"cpkv-test: some earlier line\ncpkv-test: the last words before exit 3\n\n")
                os._exit(3)
            dist.barrier(group=ctx.group)  # rank 1: its error is the death's consequence
        return super().compose_layer(ctx, layer)


class RaisesWhilePeerWaits(StagingDirect):
    """Rank 1 raises in layer 0 of batch 0 while rank 0 waits for it in a barrier of the
    implementation's group (which can only end by its timeout)."""

    def compose_layer(self, ctx, layer):
        if ctx.batch_index == 0 and layer == 0:
            if ctx.rank == 1:
                raise ValueError("engine bug: raised while a peer waits")
            dist.barrier(group=ctx.group)
        return super().compose_layer(ctx, layer)


def _sleeper(marker: str, detached: bool) -> None:
    # A process of the implementation's own: a python that sleeps, named by `marker` on its command line.
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", marker], start_new_session=detached,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _double_fork(marker: str) -> None:
    # A daemon: its parent exits at once, so it is nobody's child but a subreaper's.
    subprocess.run([sys.executable, "-c", "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', "
                    f"{marker!r}], start_new_session=True)"], check=True)


class Forks(StagingDirect):
    """Starts processes of its own in compose_layer: a child, a detached child (its own session) and
    a double-forked daemon, each sleeping 600 s; then (hang) never returns from its first layer."""

    def __init__(self, marker: str = "", hang: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        # From the environment when run from the command line (which passes no constructor arguments).
        self.marker = marker or os.environ.get("CPKV_TEST_MARKER", "cpkv-test-sleeper")
        self.hang, self.forked = hang or os.environ.get("CPKV_TEST_HANG") == "1", False

    def compose_layer(self, ctx, layer):
        if not self.forked:
            self.forked = True
            _sleeper(self.marker, detached=False)
            _sleeper(self.marker, detached=True)
            _double_fork(self.marker)
            mark("forked", ctx.rank)
        while self.hang:
            time.sleep(0.05)
        return super().compose_layer(ctx, layer)


class Hangs(StagingDirect):
    """Marks that its rank runs compose_layer, then never returns (an unbounded wait of its own)."""

    def compose_layer(self, ctx, layer):
        mark("running", ctx.rank)
        while True:
            time.sleep(0.05)


class RaisesInSetupThenPeerRaises(StagingDirect):
    """Both ranks raise in setup: rank `first` at once; the other only after `first` has exited (a
    consequence, as a peer's "Connection reset by peer" is). Each raise is a report the launcher must
    name over a death: neither rank dies without one."""

    def __init__(self, first: int = 1, **kwargs) -> None:
        super().__init__(**kwargs)
        self.first = first

    def setup(self, ctx) -> None:
        mark("setup", ctx.rank)
        if ctx.rank == self.first:
            raise ValueError("the first raise")
        path = os.path.join(os.environ["CPKV_TEST_DIR"], f"setup.{self.first}")
        deadline = time.monotonic() + WAIT_S_MAX
        while time.monotonic() < deadline and not (os.path.exists(path) and _exited(int(open(path).read() or 0))):
            time.sleep(0.02)
        raise RuntimeError("the consequent raise, after its peer exited")


def _exited(pid: int) -> bool:
    """Gone, or a zombie: it has sent everything it will send."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True

"""Shared memory between the ranks of one conformance run, on one machine.

CPU: a sparse file in /dev/shm per (run, buffer, rank), mapped by every rank with
``torch.from_file(shared=True)``; every rank unlinks its own file as soon as all peers have mapped
it, so a run that is killed afterwards leaves nothing behind (the mappings die with the
processes). Each launch holds a lock file (RunLock), so the files of a run whose launcher died
early are swept by the next run, and a live run's never are. CUDA: the tensor is allocated by the caching allocator and shared
through CUDA IPC (``torch.multiprocessing.reductions.reduce_tensor``), the handles exchanged over
the harness's own process group.
"""

from __future__ import annotations

import fcntl
import glob
import os
from typing import List, Optional

import torch

SHM_DIR = "/dev/shm"
PREFIX = "cpkv-conf."


def run_id(launcher_pid: int, serial: int) -> str:
    return f"{launcher_pid}-{serial}"


def path_of(run: str, name: str, rank: int) -> str:
    return os.path.join(SHM_DIR, f"{PREFIX}{run}.{name}.{rank}")


def create_file(path: str, nbytes: int) -> None:
    """A sparse file of nbytes: pages cost memory only once written."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, max(nbytes, 1))
    finally:
        os.close(fd)


def map_file(path: str, nbytes: int) -> torch.Tensor:
    return torch.from_file(path, shared=True, size=max(nbytes, 1), dtype=torch.uint8)[:nbytes]


def unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def remove_run(run: str) -> List[str]:
    """Remove every file of a run (the launcher's last word after a failure); returns what it removed."""
    removed = []
    for path in glob.glob(os.path.join(SHM_DIR, f"{PREFIX}{run}.*")):
        unlink_quietly(path)
        removed.append(path)
    return removed


def leftovers(run: Optional[str] = None) -> List[str]:
    pattern = f"{PREFIX}{run}.*" if run else f"{PREFIX}*"
    return sorted(glob.glob(os.path.join(SHM_DIR, pattern)))


class RunLock:
    """A launch's liveness, valid across PID namespaces (containers sharing /dev/shm): the file
    cpkv-conf.<run>.lock, held with flock(LOCK_EX) while the launch lives (the kernel drops the lock
    when its process dies, however it died). Made under a temporary name, locked, then renamed into
    place, so a sweep never sees it unlocked while its launch lives (issue 34, item 19)."""

    def __init__(self, run: str) -> None:
        self.path = path_of(run, "lock", 0)[: -len(".0")]
        temporary = os.path.join(SHM_DIR, f".{PREFIX}{run}.lock.new")  # hidden: no sweep's pattern matches it
        self.fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(temporary, self.path)

    def release(self) -> None:
        if self.fd >= 0:
            unlink_quietly(self.path)
            os.close(self.fd)
            self.fd = -1


def _run_of(path: str) -> Optional[str]:
    """The launch a file belongs to: '<pid>-<serial>' of cpkv-conf.<pid>-<serial>[-c<case>].<name>..., or None."""
    parts = os.path.basename(path)[len(PREFIX):].split(".", 1)[0].split("-")
    return "-".join(parts[:2]) if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit() else None


def _run_alive(run: str) -> bool:
    """Whether the launch's lock is held. No lock file: no live launch made the file (a launch
    makes its lock before any other file and removes it last)."""
    try:
        fd = os.open(path_of(run, "lock", 0)[: -len(".0")], os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return True  # cannot tell: keep it
    finally:
        os.close(fd)
    return False


def sweep_stale() -> int:
    """Remove the files of launches that no longer run (killed before their ranks unlinked), judged
    by each launch's lock (RunLock), never by a pid (another PID namespace's pid means nothing here)."""
    removed = 0
    verdicts: dict = {}
    for path in glob.glob(os.path.join(SHM_DIR, f"{PREFIX}*")):
        run = _run_of(path)
        if run is None:
            continue
        if run not in verdicts:
            verdicts[run] = _run_alive(run)
        if not verdicts[run] and not os.path.basename(path).endswith(".lock"):
            unlink_quietly(path)
            removed += 1
    for run, alive in verdicts.items():  # the locks last: a dead launch's lock, once its files are gone
        if not alive:
            unlink_quietly(path_of(run, "lock", 0)[: -len(".0")])
    return removed


def remove_sim_regions(pids: List[int]) -> None:
    """The event checker's World is a cpkv SharedRegion named cpkv.<pid>.<serial>; a rank killed with it
    open cannot remove it, so the launcher does, by the dead rank's pid."""
    for pid in pids:
        for path in glob.glob(os.path.join(SHM_DIR, f"cpkv.{pid}.*")):
            unlink_quietly(path)

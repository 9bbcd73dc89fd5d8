"""Shared memory between the ranks of one conformance run, on one machine.

CPU: a sparse file in /dev/shm per (run, buffer, rank), mapped by every rank with
``torch.from_file(shared=True)``; every rank unlinks its own file as soon as all peers have mapped
it, so a run that is killed afterwards leaves nothing behind (the mappings die with the
processes). Names carry the launching process's pid, so the files of a run whose launcher died
early are swept by the next run. CUDA: the tensor is allocated by the caching allocator and shared
through CUDA IPC (``torch.multiprocessing.reductions.reduce_tensor``), the handles exchanged over
the harness's own process group.
"""

from __future__ import annotations

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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> int:
    """Remove the files of runs whose launcher is dead (a run killed before its ranks unlinked)."""
    removed = 0
    for path in glob.glob(os.path.join(SHM_DIR, f"{PREFIX}*")):
        pid_text = os.path.basename(path)[len(PREFIX):].split("-", 1)[0]
        if pid_text.isdigit() and not _pid_alive(int(pid_text)):
            unlink_quietly(path)
            removed += 1
    return removed


def remove_sim_regions(pids: List[int]) -> None:
    """The event checker's World is a cpkv SharedRegion named cpkv.<pid>.<serial>; a rank killed with it
    open cannot remove it, so the launcher does, by the dead rank's pid."""
    for pid in pids:
        for path in glob.glob(os.path.join(SHM_DIR, f"cpkv.{pid}.*")):
            unlink_quietly(path)

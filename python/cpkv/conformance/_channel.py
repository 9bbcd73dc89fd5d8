"""The launcher's message channels to and from its ranks: plain pipes, one per rank and direction.

multiprocessing's Queue under the spawn context holds three named POSIX semaphores
(/dev/shm/sem.mp-*) per queue. Their names are random, so no sweep can tell whose they are, and only
the resource tracker unlinks them: a launcher killed together with its tracker (SIGKILL to its
process group, a container stopped) left them in /dev/shm for good (issue 34, item 5). A pipe is
a pair of descriptors: it dies with the processes that hold it and leaves no name anywhere.

One writer per pipe, so messages never interleave (a Queue needs its lock because every rank
writes into one pipe). A send is synchronous: once put() returns, the message is in the pipe, so a
rank that exits after its last put() has left every report for the launcher to read.
"""

from __future__ import annotations

import queue as queue_module
import threading
import time
from multiprocessing.connection import Connection, wait
from typing import Any, List, Optional


class Outbox:
    """The writing end of one pipe (picklable to a spawned process), with the Queue calls a rank makes."""

    def __init__(self, end: Connection) -> None:
        self.end = end

    def put(self, message: Any) -> None:
        try:
            self.end.send(message)
        except OSError:  # the launcher is gone (EPIPE): nobody to report to, and the lifeline ends this rank
            pass

    def close(self) -> None:
        self.end.close()

    def join_thread(self) -> None:
        """Nothing to wait for: send() wrote the message before it returned (Queue's feeder thread does not exist)."""


class Feeder:
    """The launcher's writing end of a rank's case pipe: put() never blocks (a thread of this
    process sends, in order), so a rank that stops reading cannot stall the launcher's watch, which
    bounds every wait. A send to a rank that is gone is dropped: the watch names the death."""

    def __init__(self, end: Connection) -> None:
        self.end = end
        self.pending: "queue_module.SimpleQueue[Any]" = queue_module.SimpleQueue()
        self.thread = threading.Thread(target=self._feed, name="cpkv-conformance-feeder", daemon=True)
        self.thread.start()

    def _feed(self) -> None:
        while True:
            message = self.pending.get()
            if message is _CLOSE:
                return
            try:
                self.end.send(message)
            except OSError:
                return

    def put(self, message: Any) -> None:
        self.pending.put(message)

    def close(self, timeout_s: float = 0.0) -> None:
        """Stop the thread after what was put (waiting at most timeout_s), then close the pipe."""
        self.pending.put(_CLOSE)
        self.thread.join(timeout_s)
        if not self.thread.is_alive():
            self.end.close()


_CLOSE = object()


class Inbox:
    """The reading ends of several pipes, read as one queue (get, get_nowait; queue.Empty when none
    is ready). A pipe whose writer is gone (EOF) is dropped once it is drained."""

    def __init__(self, ends: List[Connection]) -> None:
        self.ends = list(ends)
        self.sources: List[Optional[Connection]] = list(ends)  # by writer (a rank); None once at its end

    def get(self, timeout: Optional[float] = None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.ends:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = wait(self.ends, left)
            for end in ready:
                try:
                    return end.recv()
                except (EOFError, OSError):  # its writer is gone and the pipe is drained
                    self._drop(end)
            if not ready:
                break
        if not self.ends and deadline is not None:  # every writer gone: wait out the timeout, as an empty Queue would
            time.sleep(max(0.0, deadline - time.monotonic()))
        raise queue_module.Empty

    def get_nowait(self) -> Any:
        return self.get(0.0)

    def rest_of(self, source: int) -> List[Any]:
        """Every message left in writer `source`'s pipe, without waiting: for a writer that has exited,
        whose pipe holds all it sent (each send was whole before it returned). A pipe whose other end
        a descendant of the writer still holds has no EOF yet, so only poll(0) says what is there."""
        end, messages = self.sources[source], []
        while end is not None and end in self.ends:
            try:
                if not end.poll(0):
                    break
                messages.append(end.recv())
            except (EOFError, OSError):
                self._drop(end)
        return messages

    def _drop(self, end: Connection) -> None:
        self.ends.remove(end)
        self.sources = [None if e is end else e for e in self.sources]
        end.close()

    def close(self) -> None:
        for end in self.ends:
            end.close()
        self.ends = []
        self.sources = []


def pipes(context, count: int):
    """count one-way pipes: (their reading ends, their writing ends)."""
    pairs = [context.Pipe(duplex=False) for _ in range(count)]
    return [r for r, _ in pairs], [w for _, w in pairs]

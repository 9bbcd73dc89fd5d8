"""Each rank's stderr, passed through to the launcher's and its tail kept, so that a rank's death is
reported with what the rank last wrote ("Fatal Python error: Segmentation fault", an assertion of a
C extension, the OOM message of an allocator) instead of "died without a report" alone.

A rank's file descriptor 2 is the writing end of a pipe (redirect, first thing in the rank); a
thread of the launcher copies what arrives to the launcher's own stderr at once (nothing is held
back from a user who watches) and keeps the last TAIL_BYTES_MAX bytes. Every read of the pipe is
made under one lock and without blocking, so once a rank has exited, tail() (which reads what is
left first) holds everything the rank wrote: no wall-clock window is involved.
"""

from __future__ import annotations

import os
import select
import threading
from typing import Optional

TAIL_BYTES_MAX = 4096
READ_BYTES_MAX = 65536
# How long the copying thread waits in select() before it looks again (a bound on one wait, not a
# window anything depends on: tail() reads what is left itself).
SELECT_S = 0.5


def redirect(end) -> None:
    """In the rank: its stderr (fd 2, which sys.stderr and C code write to) becomes the pipe."""
    os.dup2(end.fileno(), 2)
    end.close()


class Tee:
    """The launcher's reading end of one rank's stderr pipe."""

    def __init__(self, end) -> None:
        self.end = end
        self.fd: Optional[int] = end.fileno()
        self.lock = threading.Lock()
        self.kept = bytearray()
        self.thread = threading.Thread(target=self._copy, name="cpkv-conformance-stderr", daemon=True)
        self.thread.start()

    def _read_ready(self) -> bool:
        """Under the lock: read what the pipe holds now (without blocking); False at its end."""
        if self.fd is None:
            return False
        if not select.select([self.fd], [], [], 0)[0]:
            return True
        data = os.read(self.fd, READ_BYTES_MAX)
        if not data:
            self.end.close()
            self.fd = None
            return False
        try:
            os.write(2, data)  # on to the launcher's own stderr, as if the rank had written there
        except OSError:
            pass
        self.kept += data
        del self.kept[:-TAIL_BYTES_MAX]
        return True

    def _copy(self) -> None:
        while True:
            with self.lock:
                fd = self.fd
            if fd is None:
                return
            try:
                select.select([fd], [], [], SELECT_S)
            except (OSError, ValueError):  # closed by close(): the launch is over
                return
            with self.lock:
                if not self._read_ready():
                    return

    def tail(self) -> str:
        """The last non-blank line the rank wrote to stderr, after reading what is left; '' if none."""
        with self.lock:
            while self.fd is not None and select.select([self.fd], [], [], 0)[0] and self._read_ready():
                pass
            lines = [line.strip() for line in self.kept.decode(errors="replace").splitlines() if line.strip()]
        return lines[-1] if lines else ""

    def close(self, timeout_s: float) -> None:
        """After the rank and its descendants are gone: copy what is left, then stop the thread."""
        self.thread.join(timeout_s)
        with self.lock:
            if self.fd is not None:
                self.end.close()
                self.fd = None

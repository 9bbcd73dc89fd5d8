"""The exceptions of cpkv. Both are ValueErrors carrying one line, as the cpkv command prints it."""

from __future__ import annotations

from typing import Optional


class TraceError(ValueError):
    """A trace that cannot be read.

    Attributes: ``file`` (the path as given), ``line`` (1-based; 0 when the file itself cannot be
    opened), ``field`` (the JSON path of the offending field, e.g. ``requests[1].prefix_pages``)
    and ``reason``. ``str(error)`` is the line the cpkv command prints after ``cpkv: error: ``,
    ``file:line: field: reason``.
    """

    def __init__(self, file: str, line: int, field: str, reason: str, message: Optional[str] = None) -> None:
        self.file = file
        self.line = line
        self.field = field
        self.reason = reason
        super().__init__(message if message is not None else f"{file}:{line}: {field}: {reason}")


class InputError(ValueError):
    """Bad input from Python (an invalid setting or batch, an impossible option).

    Attributes: ``field`` (the setting or batch field, or the parameter), ``reason``, and ``where``
    (``batch N`` for a batch given to a writer or a replay, else empty). ``str(error)`` is
    ``[where: ]field: reason``, with the model's own words for setting and batch problems (the
    trace reader prints the same after ``file:line: ``).
    """

    def __init__(self, field: str, reason: str, where: str = "") -> None:
        self.field = field
        self.reason = reason
        self.where = where
        super().__init__(f"{where}: {field}: {reason}" if where else f"{field}: {reason}")


class DenseMismatchError(AssertionError):
    """A dense buffer that differs from the model's expected buffer.

    Attributes: ``rank`` and ``mismatch`` (a cpkv.Mismatch: slot, row, byte, expected, actual,
    wrong_bytes). ``str(error)`` is the simulator's and the GPU backend's mismatch line.
    """

    def __init__(self, rank: int, mismatch: object, line: str) -> None:
        self.rank = rank
        self.mismatch = mismatch
        super().__init__(line)

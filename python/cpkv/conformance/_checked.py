"""The checked run: a torch-backend replay request checked whole by the harness in one call
(harness/src/request.cpp: check_run: the request, then against its trace), as the JSON the harness
builds from it (harness HandedRun::checked): the layers run, the run header of each mode, the
reproducer, the replay JSON's common part and the resolved knobs.

`python3 -m cpkv.conformance` typed alone checks through `check`; handed a run by the cpkv command
(`--request-fd N`, a memory file the command wrote) or by `cpkv.replay(backend="torch")` in process,
it reads that instead and checks nothing again (`from_fd`, `from_handed`).
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from .. import _cpkv
from .._errors import InputError

FORMAT = "cpkv-checked-run v1"  # harness kCheckedRunFormat
FD_BYTES_MAX = 1 << 20  # a checked run is a few kilobytes (an --impl is at most 4096 characters)
KEYS = {"format": str, "arguments": list, "layers": int, "header": dict, "replay_line": str, "replay_json": dict}


@dataclass(frozen=True)
class CheckedRun:
    """What the harness's check of the run returned, as plain data: everything the run prints or
    writes that is the harness's comes from here (nothing here calls back into the harness)."""

    layers: int                 # run per batch
    header: Dict[str, List[str]]  # mode ("conformance/processes", "conformance/torchrun") -> the run header's lines
    replay_line: str            # the reproducer: `cpkv replay TRACE --backend torch --impl ...`
    replay_json: Dict[str, Any]  # `cpkv replay --json`'s common part (trace, seed, layers, mutant)
    import_s_max: Optional[float]
    cpkv_bin: Optional[str]


def check(trace: str, options: Dict[str, Any]) -> CheckedRun:
    """The request (options keyed by their Python spelling) checked whole, in one call to the harness."""
    return _of(_cpkv.check_torch_run(trace, options))


def from_handed(data: Any, argv: List[str], where: str = "--request-fd") -> CheckedRun:
    """A run the harness checked in another front end, for the arguments it was handed with: one whose
    format or command differs from this one's is refused (InputError naming `where`), never run."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InputError(where, f"does not hold a checked run (format {FORMAT}) from the cpkv command")
    for key, kind in KEYS.items():
        if not isinstance(data.get(key), kind):
            raise InputError(where, f"the checked run's '{key}' is missing or not a {kind.__name__}")
    handed = [str(word) for word in data["arguments"][2:]]  # after "-m cpkv.conformance"
    if list(argv[:len(handed)]) != handed:
        raise InputError(where, f"the checked run is of another command ({' '.join(handed)[:200]})")
    return _of(data)


def _of(data: Dict[str, Any]) -> CheckedRun:
    return CheckedRun(layers=int(data["layers"]), header={mode: list(lines) for mode, lines in data["header"].items()},
                      replay_line=data["replay_line"], replay_json=dict(data["replay_json"]), import_s_max=data.get("import_s_max"),
                      cpkv_bin=data.get("cpkv_bin"))


def from_fd(text: str, argv: List[str]) -> CheckedRun:
    """The checked run the cpkv command wrote into a memory file it handed over as file descriptor
    `text`: a descriptor that is not open, not a file, or holds anything else is one InputError."""
    try:
        fd = int(text, 10)
    except ValueError:
        raise InputError("--request-fd", f"'{text}' is not a file descriptor number") from None
    try:
        status = os.fstat(fd)
    except (OSError, OverflowError):
        raise InputError("--request-fd", f"{fd} is not an open file descriptor (the cpkv command hands the checked run on it; "
                                         "typed by hand, leave --request-fd out)") from None
    if not stat.S_ISREG(status.st_mode):
        raise InputError("--request-fd", f"{fd} is not a file the cpkv command wrote (a terminal, pipe or socket is never read)")
    with os.fdopen(fd, "rb", closefd=True) as file:
        raw = file.read(FD_BYTES_MAX + 1)
    try:
        data = json.loads(raw.decode("utf-8")) if len(raw) <= FD_BYTES_MAX else None
    except (UnicodeDecodeError, ValueError):
        data = None
    return from_handed(data, argv)

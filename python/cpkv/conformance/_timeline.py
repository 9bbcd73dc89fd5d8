"""A conformance run's timeline in the Chrome trace event format (JSON object form; opens in
Perfetto and chrome://tracing; docs/event-log.md). One track per rank: a span per compose_layer
call, the implementation's event hooks where it calls them (write, read, arrive and passed as
instants, each arrive-to-passed as a "wait" span), and a mismatch or a raised exception as an
instant at its rank. Time: CLOCK_MONOTONIC in microseconds, the clock the event hooks stamp.

Rank 0 appends each batch's lines at the batch sync (bounded memory: one batch at a time) to a
temporary file beside the target, which the launcher renames over it when the run ends, also when
it failed (the file is whole up to there)."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterable, List, Optional, Union

from .. import _outputs

CLOCK = "wall time: ts is CLOCK_MONOTONIC microseconds (the event hooks' clock)"


def _event(name: str, ph: str, ts_ns: int, tid: int, args: Dict[str, Any], cat: str, **more: Any) -> str:
    event = {"name": name, "cat": cat, "ph": ph, "ts": ts_ns / 1000.0, "pid": 1, "tid": tid, "args": args}
    event.update(more)
    return json.dumps(event, sort_keys=True) + ","


def _instant(name: str, ts_ns: int, tid: int, args: Dict[str, Any], cat: str) -> str:
    return _event(name, "i", ts_ns, tid, args, cat, s="t")


class TimelineFile:
    """The temporary file beside `target`, its head written; close() writes the tail and renames
    (cpkv._outputs: the CLI's output rules; the old file stays whole until the rename)."""

    def __init__(self, target: Union[str, _outputs.Output], cp: int, label: str) -> None:
        self.output = target if isinstance(target, _outputs.Output) else _outputs.check_output("timeline", target)
        self.target = self.output.target
        self.path = _outputs.temporary_beside(self.output, ".json")
        meta = [json.dumps({"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "ts": 0, "args": {"name": label}}) + ","]
        for rank in range(cp):
            meta.append(json.dumps({"name": "thread_name", "ph": "M", "pid": 1, "tid": rank, "ts": 0, "args": {"name": f"rank {rank}"}}) + ",")
        append(self.path, ['{"traceEvents":['] + meta)

    def close(self) -> None:
        tail = json.dumps({"name": "clock", "ph": "M", "pid": 0, "tid": 0, "ts": 0, "args": {"clock": CLOCK}})
        append(self.path, [tail, '],"displayTimeUnit":"ns","otherData":' + json.dumps({"clock": CLOCK}) + "}"])
        _outputs.commit(self.output, self.path)

    def discard(self) -> None:
        _outputs.discard(self.path)


def check_target(target: str) -> str:
    """The target's absolute path, checked by the CLI's output rules (cpkv._outputs), else InputError."""
    return _outputs.check_output("timeline", target).target


def append(path: str, lines: Iterable[str]) -> None:
    """Whole lines, one write (O_APPEND)."""
    data = "".join(line + "\n" for line in lines).encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        _outputs.write_all(fd, data)
    finally:
        os.close(fd)


def _hook_lines(index: int, rank: int, events: List[tuple]) -> List[str]:
    lines: List[str] = []
    arrived: Dict[int, int] = {}
    for ns, what, _, layer, a, b, c in events:
        base = {"batch": index, "layer": layer}
        if what == "write":
            lines.append(_instant("write", ns, rank, dict(base, half=a, slot=b, what="fill" if c else "zero"), "hook"))
        elif what == "read":
            lines.append(_instant("read", ns, rank, dict(base, peer=a, half=b, slot=c), "hook"))
        elif what == "arrive":
            arrived[a] = ns
            lines.append(_instant("arrive", ns, rank, dict(base, phase=a), "hook"))
        elif what == "passed":
            lines.append(_instant("passed", ns, rank, dict(base, phase=a), "hook"))
            if a in arrived:
                begin = arrived.pop(a)
                lines.append(_event("wait", "X", begin, rank, dict(base, phase=a), "wait", dur=max(ns - begin, 0) / 1000.0))
    return lines


def batch_lines(index: int, summaries: List[Dict[str, Any]]) -> List[str]:
    """Every rank's lines of batch `index` from the summaries the batch sync gathered."""
    lines: List[str] = []
    for s in summaries:
        rank = s["rank"]
        for layer, begin, end in s.get("compose_spans", []):
            args = {"batch": index, "layer": layer, "half": layer % 2}
            lines.append(_event("compose_layer", "X", begin, rank, args, "compose", dur=max(end - begin, 0) / 1000.0))
        lines += _hook_lines(index, rank, s["events"])
        at: Optional[list] = s.get("mismatch_at")
        if at and s["mismatches"]:
            lines.append(_instant("mismatch", at[0], rank, {"batch": index, "layer": at[1], "detail": s["mismatches"][0]}, "mismatch"))
        if s["error"]:
            lines.append(_instant("raised", s["error_ns"], rank, {"batch": index, "detail": s["error"]}, "error"))
    return lines

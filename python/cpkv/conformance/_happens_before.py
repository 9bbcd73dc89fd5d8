"""Hazards judged by happens-before, not by this run's timing (invariant 2, PROTOCOL.md section 6).

The state checker (sim/checkers.hpp, fed by _check.EventReplay) judges the one interleaving that
happened: a write into a parity half while a peer is still reading it is seen only when the two
really overlapped. Here, as ThreadSanitizer judges data races, every rank keeps a vector clock;
program order advances it, and synchronization joins it:
- a barrier pass of phase k joins the clocks of every rank's arrival of phase k (a counting barrier
  passes k once every counter reached k);
- a collective (the harness's batch sync; the simulator's collectives and batch barrier) joins all.
A write to staging location (owner, half, slot) and a read of it by another rank are a race when
neither happens before the other: a read of layer l concurrent with the owner's zero or fill of a
later layer (a wrong half zeroed, a single half) or with the fill it was meant to read (no barrier,
an arrival before the fill). The verdict depends only on the order the synchronization imposes, so a
lucky timing (the reader was done before the writer came) still shows it.

Two front ends feed the same Clocks: the conformance harness's merged events per batch
(HappensBefore.judge; the Events hooks, docs/conformance.md) and the simulator's written event log
(judge_event_log; docs/event-log.md).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

# Race lines reported per batch (the first ones; the rest are counted): one hazard repeats on every
# slot and layer, and the first says what is wrong.
RACES_PER_BATCH_MAX = 4
# Race pairs kept per batch for those lines: a racy exchange on a large batch races on every slot of
# every layer, and the first few say what is wrong (memory stays bounded whatever the batch).
RACES_KEPT_MAX = 10_000

Location = Tuple[int, int, int]  # (owner rank, parity half, current index)


@dataclass
class Access:
    rank: int
    epoch: int    # the accessing rank's own clock component at the access
    layer: int
    what: str     # "zero", "fill" or "read"


@dataclass
class Cell:
    """What the analysis remembers of one staging location: its last write and the reads since."""

    write: Optional[Access] = None
    reads: Dict[int, Access] = field(default_factory=dict)


class Clocks:
    """Vector clocks over cp ranks and the staging locations they touch (FastTrack's shape: the last
    write and the reads since it, per location). Memory: one Cell per location touched."""

    def __init__(self, cp: int) -> None:
        self.cp = cp
        self.clock = [[1 if q == r else 0 for q in range(cp)] for r in range(cp)]
        self.arrivals: Dict[tuple, Dict[int, List[int]]] = {}
        self.cells: Dict[Location, Cell] = {}
        self.races: List[Tuple[Access, Access, Location]] = []  # (write, read, location)

    def _tick(self, rank: int) -> int:
        self.clock[rank][rank] += 1
        return self.clock[rank][rank]

    def _before(self, access: Access, rank: int) -> bool:
        """Whether `access` happens before rank's present point."""
        return access.rank == rank or access.epoch <= self.clock[rank][access.rank]

    def arrive(self, rank: int, key: tuple) -> None:
        self._tick(rank)
        self.arrivals.setdefault(key, {})[rank] = list(self.clock[rank])

    def passed(self, rank: int, key: tuple) -> None:
        """The pass joins every arrival of its phase seen so far (an arrival not yet seen gives no order)."""
        for arrived in self.arrivals.get(key, {}).values():
            self._join(rank, arrived)
        self._tick(rank)

    def join_all(self) -> None:
        """A collective every rank takes part in: each leaves it after all of them entered."""
        top = [max(c[q] for c in self.clock) for q in range(self.cp)]
        for rank in range(self.cp):
            self._join(rank, top)
            self._tick(rank)

    def _join(self, rank: int, other: Sequence[int]) -> None:
        mine = self.clock[rank]
        for q in range(self.cp):
            if other[q] > mine[q]:
                mine[q] = other[q]

    def write(self, rank: int, location: Location, layer: int, what: str) -> None:
        access = Access(rank, self._tick(rank), layer, what)
        cell = self.cells.setdefault(location, Cell())
        for read in cell.reads.values():
            if not self._before(read, rank):
                self._race(access, read, location)
        cell.write, cell.reads = access, {}

    def read(self, rank: int, location: Location, layer: int) -> None:
        access = Access(rank, self._tick(rank), layer, "read")
        cell = self.cells.setdefault(location, Cell())
        if cell.write is not None and not self._before(cell.write, rank):
            self._race(cell.write, access, location)
        cell.reads[rank] = access

    def _race(self, write: Access, read: Access, location: Location) -> None:
        if len(self.races) < RACES_KEPT_MAX:
            self.races.append((write, read, location))


def race_lines(batch: int, races: List[Tuple[Access, Access, Location]], limit: int = RACES_PER_BATCH_MAX) -> List[str]:
    """One invariant 2 line per distinct hazard (writer, reader, their layers, the write's kind)."""
    lines, seen = [], set()
    for write, read, (owner, half, slot) in races:
        key = (write.rank, read.rank, write.layer, read.layer, write.what)
        if key in seen:
            continue
        seen.add(key)
        if len(lines) < limit:
            lines.append(f"invariant 2 (parity-half reuse safety): batch {batch}: rank {write.rank}'s {write.what} of its half {half} "
                         f"slot {slot} on layer {write.layer} and rank {read.rank}'s read of it on layer {read.layer} are concurrent "
                         f"(happens-before: no barrier pass or collective orders them, whatever this run's timing)")
    if len(seen) > limit:
        lines.append(f"invariant 2 (parity-half reuse safety): batch {batch}: {len(seen) - limit} more concurrent write/read pairs "
                     f"(happens-before)")
    return lines


# --- the conformance harness: every rank's events of one batch ------------------------------------

def _program_order(summaries: List[dict]) -> Iterable[tuple]:
    """Every rank's events merged by CLOCK_MONOTONIC, each rank's in its own order (a stable merge:
    two events of one rank with the same time stamp keep the order the rank logged them in)."""
    streams = [s["events"] for s in summaries if s["events_used"]]
    return heapq.merge(*streams, key=lambda e: e[0])


class HappensBefore:
    """Rank 0's judge over each batch's merged events (beside _check.EventReplay). The batch sync
    before a batch is a collective, so each batch starts with every earlier access ordered before it."""

    def __init__(self, cp: int) -> None:
        self.cp = cp

    def judge(self, batch: int, summaries: List[dict]) -> List[str]:
        if not any(s["events_used"] for s in summaries):
            return []
        clocks = Clocks(self.cp)
        for _, what, rank, layer, a, b, c in _program_order(summaries):
            if what == "write":
                clocks.write(rank, (rank, a, b), layer, "fill" if c else "zero")
            elif what == "read":
                clocks.read(rank, (a, b, c), layer)
            elif what == "arrive":
                clocks.arrive(rank, ("barrier", a))
            elif what == "passed":
                clocks.passed(rank, ("barrier", a))
        return race_lines(batch, clocks.races)


class Judges:
    """The batch-level event checks of one case: the state checker's replay, then happens-before."""

    def __init__(self, replay, cp: int) -> None:
        self.replay_checker = replay
        self.happens_before = HappensBefore(cp)

    def replay(self, batch: int, summaries: List[dict]) -> List[str]:
        return self.replay_checker.replay(batch, summaries) + self.happens_before.judge(batch, summaries)


# --- the simulator: a scheduled run's event log (docs/event-log.md) ---------------------------------

# Ops that write the rank's own staging at current index x, and the read of a peer's staging (a
# gather whose table index names a staging base): staging_direct and staging_publish.
_STAGING_WRITES = {"zero_own": "zero", "fill": "fill", "publish": "fill"}
_SYNC_OPS = {"arrive": "barrier", "coll_arrive": "collective", "batch_arrive": "batch"}
_PASS_OPS = {"wait": "barrier", "coll_wait": "collective", "batch_wait": "batch"}


class EventLogError(ValueError):
    """A line of an event log that is not `rank op layer x y z`; the message names the line."""


def _parse(line: str, number: int, cp: int) -> Tuple[int, str, int, int, int, int]:
    fields = line.split()
    if len(fields) != 6:
        raise EventLogError(f"event log line {number}: {len(fields)} fields, expected 6 (rank op layer x y z)")
    try:
        rank, layer, x, y, z = int(fields[0]), int(fields[2]), int(fields[3]), int(fields[4]), int(fields[5])
    except ValueError:
        raise EventLogError(f"event log line {number}: {line.strip()!r} is not rank op layer x y z (integers)") from None
    if not 0 <= rank < cp:
        raise EventLogError(f"event log line {number}: rank {rank} is not in 0..{cp - 1}")
    return rank, fields[1], layer, x, y, z


def judge_event_log(lines: Iterable[str], cp: int, halves: int = 2) -> List[str]:
    """Happens-before over a scheduled run's event log of a staging variant: the race lines of each
    batch (a batch is the steps between the ranks' batch_begin steps). halves: the parity halves the
    run used (2; 1 for a log of `--mutant single_half`: the log names the layer, not the half)."""
    clocks, batch, lines_out = Clocks(cp), -1, []
    counts: Dict[Tuple[int, str], int] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        rank, op, layer, x, y, z = _parse(line, number, cp)
        half = layer % 2 if halves == 2 else 0
        if op == "batch_begin" and rank == 0:
            lines_out += race_lines(batch, clocks.races) if batch >= 0 else []
            clocks.races, clocks.cells, batch = [], {}, batch + 1
        if op in _STAGING_WRITES:
            clocks.write(rank, (rank, half, x), layer, _STAGING_WRITES[op])
        elif op == "gather" and z >= cp:
            clocks.read(rank, (z % cp, half, y), layer)  # y: the source's current index
        elif op in _SYNC_OPS:
            counts[(rank, _SYNC_OPS[op])] = counts.get((rank, _SYNC_OPS[op]), 0) + 1
            clocks.arrive(rank, (_SYNC_OPS[op], counts[(rank, _SYNC_OPS[op])]))
        elif op in _PASS_OPS:
            clocks.passed(rank, (_PASS_OPS[op], counts.get((rank, _PASS_OPS[op]), 0)))
    return lines_out + race_lines(max(batch, 0), clocks.races)

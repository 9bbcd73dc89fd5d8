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

Two front ends feed the same clocks, in C++ (sim/happens_before.hpp, one implementation: the
simulator's tests use it too): the conformance harness's merged events per batch (HappensBefore.judge;
the Events hooks, docs/conformance.md) and the simulator's written event log (judge_event_log;
docs/event-log.md).
"""

from __future__ import annotations

import heapq
from typing import Iterable, List

from .. import _cpkv

# --- the conformance harness: every rank's events of one batch ------------------------------------

def _program_order(summaries: List[dict]) -> Iterable[tuple]:
    """Every rank's events merged by CLOCK_MONOTONIC, each rank's in its own order (a stable merge:
    two events of one rank with the same time stamp keep the order the rank logged them in)."""
    streams = [s["events"] for s in summaries if s["events_used"]]
    return heapq.merge(*streams, key=lambda e: e[0])


# The halves of section 12's token rows (sim/happens_before.hpp kHbTokenRowHalf): apart from staging's 0 and 1.
TOKEN_ROW_HALF = 2
# A token row's location is (call * TOKEN_ROW_STRIDE + current row): the collective that sends it (kHbTokenRowStride).
TOKEN_ROW_STRIDE = 1 << 32


class HappensBefore:
    """Rank 0's judge over each batch's merged events (beside _check.EventReplay). The batch sync
    before a batch is a collective, so each batch starts with every earlier access ordered before it."""

    def __init__(self, cp: int) -> None:
        self.cp = cp

    def judge(self, batch: int, summaries: List[dict]) -> List[str]:
        if not any(s["events_used"] for s in summaries):
            return []
        clocks = _cpkv.conformance.HbClocks(self.cp)
        sent: dict = {}  # (call, rank) -> the current rows the rank sent into that collective
        for _, what, rank, layer, a, b, c in _program_order(summaries):
            if what.startswith("collective") or what == "token_write":
                self._token_event(clocks, sent, what, rank, layer, a, b)
            elif what == "write":
                clocks.write(rank, rank, a, b, layer, "fill" if c else "zero")
            elif what == "read":
                clocks.read(rank, a, b, c, layer)
            elif what == "arrive":
                clocks.arrive(rank, "barrier", a)
            elif what == "passed":
                clocks.passed(rank, "barrier", a)
        return clocks.race_lines(batch)

    def _token_event(self, clocks, sent: dict, what: str, rank: int, layer: int, a: int, b: int) -> None:
        """Section 12's events: a token row written into the writer's send rows, a collective entered
        (an arrival) and left (a pass joining every entry, then a read of every peer's sent rows). A
        write belongs to the collective the rank has not yet left (its location is the row of that
        call: each kind's all-gather has send rows of its own), so a write made after the writer
        entered the collective that sends it is concurrent with the peers' reads of it."""
        half = TOKEN_ROW_HALF + layer % 2
        if what == "token_write":
            call = 1 + sent.get(("left", rank), 0)
            clocks.write(rank, rank, half, call * TOKEN_ROW_STRIDE + a, layer, "fill")
        elif what == "collective_enter":
            clocks.arrive(rank, "collective", a)
        elif what == "collective_row":
            sent.setdefault((a, rank), []).append(b)
        elif what == "collective_exit":
            sent[("left", rank)] = a
            clocks.passed(rank, "collective", a)
            for peer in range(self.cp):
                for row in sent.get((a, peer), []) if peer != rank else []:
                    clocks.read(rank, peer, half, a * TOKEN_ROW_STRIDE + row, layer)


class Judges:
    """The batch-level event checks of one case: the state checker's replay, then happens-before."""

    def __init__(self, replay, cp: int) -> None:
        self.replay_checker = replay
        self.happens_before = HappensBefore(cp)

    def replay(self, batch: int, summaries: List[dict]) -> List[str]:
        return self.replay_checker.replay(batch, summaries) + self.happens_before.judge(batch, summaries)


# --- the simulator: a scheduled run's event log (docs/event-log.md) ---------------------------------

class EventLogError(ValueError):
    """A line of an event log that is not `rank op layer x y z`; the message names the line."""


def judge_event_log(lines: Iterable[str], cp: int, halves: int = 2) -> List[str]:
    """Happens-before over a scheduled run's event log of a staging variant: the race lines of each
    batch (a batch is the steps between the ranks' batch_begin steps). halves: the parity halves the
    run used (2; 1 for a log of `--mutant single_half`: the log names the layer, not the half)."""
    try:
        return list(_cpkv.conformance.judge_event_log("\n".join(lines), cp, halves))
    except ValueError as error:
        raise EventLogError(str(error)) from None

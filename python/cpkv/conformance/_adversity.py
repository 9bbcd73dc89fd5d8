"""Seeded adversity for a foreign implementation: delays before and inside a layer.

The knobs are the simulator's own (``cpkv replay`` draws them; ``--swarm`` draws every one from the
seed, sim/src/faults.cpp), so one seed names the same mix on both. Two slow roles rotate over the
ranks per layer or per batch as the simulator rotates them: the slow producer holds before its fill
(at ``ctx.pause_point("before_fill")``, or before the layer when the implementation has no pause
points), the slow reader holds inside its gather (``ctx.pause_point("gather")``). A hold ends when
the window it opens has been seen (a peer finished the layer, or a peer is past a later layer) or at
its bound; jitter is a random delay at every pause point with the knob's probability. On CUDA a
delay is a spin kernel on the rank's stream (torch.cuda._sleep), not a host sleep.
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass
from typing import Callable, Dict, Optional

import torch

from .. import _cpkv

# Longest hold the harness grants one slow role per layer. The simulator's swarm bounds go to 1 s
# because its holds end early in a correct run; a foreign implementation without pause points gives
# the harness nothing to end them on, so a hold this long on every layer of a long trace would make
# a run minutes long. 200 ms still spans a gloo barrier on a loaded two-core machine.
HOLD_US_MAX = 200_000
# Shortest bound of a hold. The simulator's default producer hold (2 ms) is long for a simulated
# rank; a Python rank on a loaded two-core machine needs milliseconds to fill, pass a barrier and
# gather, so a hold shorter than this would close the window before a broken peer walks into it.
# Holds end early in a correct run, so the floor costs a correct run little.
HOLD_US_MIN = 100_000
# How often a hold looks at the peers' positions.
HOLD_POLL_S = 0.0005
# GPU spin kernels: cycles per microsecond (H200 boost clock is about 1.98 GHz; a lower figure
# only shortens delays).
SPIN_CYCLES_PER_US = 1500

# Stages a rank publishes in the positions table (what a hold and the watchdog read).
STAGE_IDLE, STAGE_SETUP, STAGE_COMPOSE, STAGE_FILLED, STAGE_ARRIVED, STAGE_PASSED, STAGE_READING, STAGE_CHECK, \
    STAGE_BATCH_SYNC, STAGE_TEARDOWN, STAGE_DONE = range(11)
STAGE_NAMES = ("idle", "setup", "compose_layer", "filled", "arrived at a barrier", "passed a barrier", "gathering",
               "the harness's byte check", "the harness's batch sync", "teardown", "done")
# Columns of the positions table (one int64 row per rank).
COL_BATCH, COL_LAYER, COL_STAGE, COL_TIME_NS, COL_PID, COL_ARRIVALS, COL_HOLDING = range(7)
POSITION_COLUMNS = 8


def knobs(seed: int, swarm: bool) -> Dict[str, object]:
    """The simulator's fault knobs for this seed: drawn (--swarm) or the fixed defaults."""
    return dict(_cpkv.conformance.swarm_knobs(seed) if swarm else _cpkv.conformance.default_knobs(seed))


def _mix(seed: int, stream: int) -> int:
    # A stream per rank, apart from the content seed: the same seed, the same delays.
    return (seed * 0x9E3779B97F4A7C15 + stream * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) % (1 << 64)


@dataclass
class Adversity:
    """One rank's delays. positions: the (cp, POSITION_COLUMNS) int64 shared table of every rank."""

    knob: Dict[str, object]
    rank: int
    cp: int
    layers: int
    positions: torch.Tensor
    device: torch.device
    enabled: bool
    batch: int = -1
    layer: int = -1
    uses_pause_points: bool = False  # sticky: once the implementation pauses, holds wait for its points
    held_producer: bool = False
    held_reader: bool = False

    def __post_init__(self) -> None:
        self.rng = random.Random(_mix(int(self.knob["seed"]), 0x1000 + self.rank))

    def slow_rank(self, role: str, batch: int, layer: int) -> int:
        producer = int(self.knob["slow_rank"])
        rotation = self.knob["slow_rotation"]
        if rotation == "per_layer":
            producer += max(batch, 0) * self.layers + layer
        elif rotation == "per_batch":
            producer += max(batch, 0)
        rank = producer if role == "producer" else producer + int(self.knob["slow_reader_offset"])
        return rank % self.cp

    def enter_layer(self, batch: int, layer: int) -> None:
        """Before compose_layer: an implementation without pause points still meets a late producer."""
        self.batch, self.layer = batch, layer
        self.held_producer = self.held_reader = False
        if self.enabled and not self.uses_pause_points and self.is_slow("producer"):
            # No pause point seen yet: the producer enters the layer late (its before_fill hold, if it
            # has one, still comes).
            self.hold(self.bound_us("slow_producer_delay_us"), lambda: self.peer_finished_layer() or self.peers_all_arrived())

    def is_slow(self, role: str) -> bool:
        return self.cp > 1 and self.slow_rank(role, self.batch, self.layer) == self.rank

    def pause(self, name: str) -> None:
        """ctx.pause_point(name): a hold for the slow role this point opens, else jitter."""
        self.uses_pause_points = True
        if not self.enabled:
            return
        # Inside a collective (events.collective) the slow producer is held as before its fill: its
        # peers wait in the collective for it, and a write it makes after entering comes late.
        if name in ("before_fill", "collective") and self.is_slow("producer") and not self.held_producer:
            return self.hold_producer()
        if name == "gather" and self.is_slow("reader") and not self.held_reader:
            return self.hold_reader()
        probability = {"before_fill": "write_delay_probability", "collective": "write_delay_probability", "gather": "gather_delay_probability"}.get(
            name, "flag_write_delay_probability")
        if self.rng.random() < float(self.knob[probability]):
            self.delay_us(self.rng.randint(1, max(1, int(self.knob["delay_us_max"]))))

    def hold_producer(self) -> None:
        # Until a peer has finished this layer (it did not wait for this rank's fill) or every peer is
        # at a barrier that cannot open without this rank.
        self.held_producer = True
        self.hold(self.bound_us("slow_producer_delay_us"), lambda: self.peer_finished_layer() or self.peers_all_arrived())

    def hold_reader(self) -> None:
        # Until a peer is past a later layer's fill (it rewrote a half this rank may still read).
        # A peer in a hold of its own (the slow producer, waiting for this rank to walk into its
        # window) ends this one: two holds waiting on each other would close both windows.
        self.held_reader = True
        self.hold(self.bound_us("slow_reader_delay_us"), lambda: self.peer_past_later_fill() or self.peer_holding())

    def bound_us(self, knob: str) -> int:
        return max(HOLD_US_MIN, min(int(self.knob[knob]), HOLD_US_MAX))

    def hold(self, bound_us: int, ended: Callable[[], bool]) -> None:
        if self.device.type == "cuda":
            return self.delay_us(bound_us)  # the stream cannot poll the host's table: a fixed spin
        start = time.monotonic()
        deadline = start + bound_us / 1e6
        self.positions[self.rank][COL_HOLDING] = 1
        try:
            while time.monotonic() < deadline and not ended():
                time.sleep(HOLD_POLL_S)
        finally:
            self.positions[self.rank][COL_HOLDING] = 0

    def delay_us(self, us: int) -> None:
        if self.device.type == "cuda":
            torch.cuda._sleep(int(us * SPIN_CYCLES_PER_US))
        else:
            time.sleep(us / 1e6)

    def _peers(self):
        return [p for p in range(self.cp) if p != self.rank]

    def _where(self, p: int):
        row = self.positions[p]
        return int(row[COL_BATCH]), int(row[COL_LAYER]), int(row[COL_STAGE])

    def peer_finished_layer(self) -> bool:
        for p in self._peers():
            batch, layer, stage = self._where(p)
            if (batch, layer) > (self.batch, self.layer) or ((batch, layer) == (self.batch, self.layer) and stage >= STAGE_CHECK):
                return True
        return False

    def peers_all_arrived(self) -> bool:
        """Every peer waits at a barrier that cannot open without this rank: it has arrived more times
        than this rank (arrivals come from ctx.events.arrive). A peer that arrived at a barrier this
        rank has arrived at too (arrive_before_fill) is not held back by it: the hold goes on."""
        mine = int(self.positions[self.rank][COL_ARRIVALS])
        for p in self._peers():
            batch, layer, stage = self._where(p)
            if (batch, layer) != (self.batch, self.layer) or stage != STAGE_ARRIVED:
                return False
            if int(self.positions[p][COL_ARRIVALS]) <= mine:
                return False
        return True

    def peer_holding(self) -> bool:
        return any(int(self.positions[p][COL_HOLDING]) for p in self._peers())

    def peer_past_later_fill(self) -> bool:
        for p in self._peers():
            batch, layer, stage = self._where(p)
            if batch > self.batch or (batch == self.batch and layer > self.layer and stage >= STAGE_FILLED):
                return True
        return False


def describe(knob: Dict[str, object], swarm: bool, cp: Optional[int] = None) -> str:
    """The knobs in one line. With cp, the slow roles are named as the ranks they fall on (a drawn
    slow_rank of 5 is rank 1 at cp 2: Adversity.slow_rank takes it modulo cp), so the line never names
    a rank the run does not have."""
    text = str(knob["describe"])
    if cp:
        producer, offset = int(knob["slow_rank"]) % cp, int(knob["slow_reader_offset"]) % cp
        text = re.sub(r"rank -?\d+ reader \+-?\d+", f"rank {producer} reader +{offset}", text, count=1)
    return f"{'swarm knobs' if swarm else 'fault knobs'}: {text} (the harness bounds each hold to [{HOLD_US_MIN}, {HOLD_US_MAX}] us)"



def delays_line(seed: int, swarm: bool, cp: int, delays: bool) -> str:
    """The run header's line of the injected delays: their knobs (describe), or that they are off."""
    return describe(knobs(seed, swarm), swarm, cp) if delays else "delays: off"

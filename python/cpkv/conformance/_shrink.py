"""Shrinking a caught bug to a small case, and writing it as a trace with a one-line reproducer.

Greedy delta debugging over the batches (not Hypothesis: each candidate is a real multi-process run,
and a session runs a whole round of candidates over the same rank processes, so a round costs one
process start plus a fraction of a second per candidate). Each round tries, in order: a shorter run
of consecutive batches, a batch without one of its requests, a request with a shorter extend or no
prefix, fewer layers; it keeps the smallest candidate that is still caught by the same first check,
and stops when no candidate of a round is, or after ROUNDS_MAX rounds.
"""

from __future__ import annotations

import copy
import os
from typing import List, Optional, Tuple

from .. import _cpkv
from ._launch import Outcome, launch_cases
from ._impl_spec import spec_reproducer
from ._rank import RunSpec

# Rounds of candidates; each is one session. Enough to take a 5-batch case to one or two small batches.
ROUNDS_MAX = 6
# Candidates per round (the cheapest reductions first).
CANDIDATES_MAX = 24


def size(spec: RunSpec) -> Tuple[int, int, int, int]:
    """(batches, requests, current pages, layers): what "smaller" means, compared in this order."""
    pages = sum(_cpkv.layout_batch(spec.setting, b).current_pages_total for b in spec.batches)
    return (len(spec.batches), sum(len(b) for b in spec.batches), pages, spec.layers)


def _with(spec: RunSpec, batches: List[_cpkv.Batch], layers: Optional[int] = None) -> RunSpec:
    out = copy.copy(spec)
    out.batches = batches
    out.layers = layers if layers is not None else spec.layers
    return out


def _valid(spec: RunSpec) -> bool:
    try:
        for batch in spec.batches:
            _cpkv.validate(spec.setting, batch)
    except ValueError:
        return False
    return bool(spec.batches)


def _request_variants(request: _cpkv.Request, page_size: int) -> List[_cpkv.Request]:
    variants = []
    if request.extend_len > 1:
        variants.append(_cpkv.Request(request.prefix_len, max(1, request.extend_len // 2), list(request.prefix_pages)))
    if request.prefix_len > 0:
        variants.append(_cpkv.Request(0, request.extend_len, []))
        keep = len(request.prefix_pages) // 2
        variants.append(_cpkv.Request(keep * page_size, request.extend_len, list(request.prefix_pages[:keep])))
    return variants


def candidates(spec: RunSpec) -> List[RunSpec]:
    out: List[RunSpec] = []
    n = len(spec.batches)
    for length in range(1, n):
        for first in range(0, n - length + 1):
            out.append(_with(spec, spec.batches[first:first + length]))
    for b, batch in enumerate(spec.batches):
        requests = list(batch.requests)
        for r in range(len(requests)):
            if len(requests) > 1:
                out.append(_with(spec, spec.batches[:b] + [_cpkv.Batch(requests[:r] + requests[r + 1:])] + spec.batches[b + 1:]))
            for variant in _request_variants(requests[r], spec.setting.page_size):
                changed = requests[:r] + [variant] + requests[r + 1:]
                out.append(_with(spec, spec.batches[:b] + [_cpkv.Batch(changed)] + spec.batches[b + 1:]))
    if spec.layers > 2:
        out.append(_with(spec, spec.batches, layers=2))
    return [c for c in out if _valid(c) and size(c) < size(spec)][:CANDIDATES_MAX]


def shrink(spec: RunSpec, first_check: str) -> Tuple[RunSpec, Outcome, int]:
    """The smallest case found that still fails first with `first_check`; its outcome; rounds run."""
    best, best_outcome = spec, None
    for rounds in range(1, ROUNDS_MAX + 1):
        tries = candidates(best)
        if not tries:
            return best, best_outcome, rounds - 1
        outcomes = launch_cases([copy.copy(c) for c in tries])
        caught = [(size(c), i) for i, (c, o) in enumerate(zip(tries, outcomes)) if not o.passed and o.first_check() == first_check]
        if not caught:
            return best, best_outcome, rounds
        _, index = min(caught)
        best, best_outcome = tries[index], outcomes[index]
    return best, best_outcome, ROUNDS_MAX


def write_trace(spec: RunSpec, path: str, what: str) -> str:
    writer = _cpkv.TraceWriter(path, spec.setting, {"kind": "conformance-counterexample", "description": what})
    for batch in spec.batches:
        writer.add_batch(batch)
    writer.close()
    return path


def reproducer(spec: RunSpec, trace: str) -> str:
    """The shrunk case's command: the one builder (_impl_spec.spec_reproducer)."""
    return spec_reproducer(spec, trace)


def counterexample_path(directory: str, spec: RunSpec) -> str:
    os.makedirs(directory, exist_ok=True)
    impl = spec.impl.rpartition(":")[2] or "impl"
    return os.path.join(directory, f"counterexample-{impl}-{spec.mutant or 'nomutant'}-seed{spec.seed}.jsonl")

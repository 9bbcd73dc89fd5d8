"""python3 -m cpkv.conformance.mutation_table TRACE [--seed S] [--window W] [--impl NAME ...] [--out DIR]

The mutation table of docs/conformance.md, from a real run: every planted bug of each reference
implementation run over the trace's batches (plus the batches tests/test_conformance.py adds for
cp 2: the same slot count with other prefix pages, and a batch whose rank-local overflow verdict
differs), whether it was caught, which check fired first, and the case shrunk to the smallest that
still fails first with that check, written as a trace with its one-line reproducer.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from typing import List

from .. import _cpkv
from . import case
from ._launch import launch_cases
from ._shrink import counterexample_path, reproducer, shrink, size, write_trace
from .reference import ALLGATHER_MUTANTS, MUTANTS

IMPLS = {"staging_direct": "cpkv.conformance.reference:StagingDirect", "v2": "cpkv.conformance.reference:V2",
         "allgather_zigzag": "cpkv.conformance.reference:AllGatherZigzag", "allgather_continuous": "cpkv.conformance.reference:AllGatherContinuous"}
# The planted bugs of each implementation (section 12's exchanges have their own: no staging, no barrier).
BUGS = {"staging_direct": MUTANTS, "v2": MUTANTS, "allgather_zigzag": ALLGATHER_MUTANTS, "allgather_continuous": ALLGATHER_MUTANTS}


def batches_for(setting: _cpkv.Setting, batches: List[_cpkv.Batch]) -> List[_cpkv.Batch]:
    extra = []
    if setting.cp == 2 and setting.pool_pages >= 8 and setting.page_size == 4:
        extra = [_cpkv.Batch([_cpkv.Request(8, 6, [7, 1]), _cpkv.Request(0, 9, [])]),
                 _cpkv.Batch([_cpkv.Request(0, 20, []), _cpkv.Request(0, 4, [])])]
    return batches[:1] + extra[:1] + batches[1:] + extra[1:]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m cpkv.conformance.mutation_table")
    p.add_argument("trace")
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--window", type=float, default=3.0)
    p.add_argument("--impl", action="append", choices=sorted(IMPLS))
    p.add_argument("--mutant", action="append", choices=sorted({**MUTANTS, **ALLGATHER_MUTANTS}), help="only these planted bugs (default: every one)")
    p.add_argument("--out", default="conformance-counterexamples")
    a = p.parse_args(argv)
    reader = _cpkv.read_trace(a.trace)
    setting, batches = reader.setting, batches_for(reader.setting, list(reader))
    print(f"mutation table: {a.trace} (+ the cp 2 extra batches) | seed {a.seed} | window {a.window} s | "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    print("| implementation | bug | caught | checks fired (first first) | size before (batches, requests, pages, layers) | shrunk to | "
          "first line of the shrunk case | reproducer |")
    print("|---|---|---|---|---|---|---|---|")
    for name in a.impl or sorted(IMPLS):
        specs = [case(IMPLS[name], setting, batches, seed=a.seed, mutant=m, window_s=a.window,
                      ipc_fail_rank=1 if m == "unagreed_capability" else -1) for m in BUGS[name] if not a.mutant or m in a.mutant]
        if not specs:
            continue
        for spec, outcome in zip(specs, launch_cases([s for s in specs])):
            row(name, spec, outcome, a.out)
    return 0


def row(name: str, spec, outcome, out_dir: str) -> None:
    fired = outcome.checks_fired()
    if outcome.passed:
        print(f"| {name} | {spec.mutant} | no | - | {size(spec)} | - | - | - |", flush=True)
        return
    before = size(spec)
    small, small_outcome, rounds = shrink(spec, fired[0])
    shown = small_outcome or outcome
    first = next(iter(shown.mismatches + shown.findings + [shown.failure or ""]))
    trace = write_trace(small, counterexample_path(out_dir, small), f"{name} {spec.mutant}: {fired[0]}")
    print(f"| {name} | {spec.mutant} | yes | {', '.join(fired)} | {before} | {size(small)} ({rounds} rounds) | {first[:200]} | "
          f"`{reproducer(small, trace)}` |", flush=True)


if __name__ == "__main__":
    sys.exit(main())

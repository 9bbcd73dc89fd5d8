"""python3 -m cpkv.conformance TRACE --impl module:Class --ranks N [--device cpu|cuda] [--seed S] [--swarm]
[--layers L] [--mutant NAME] [--time [--cpkv-bin PATH]] [--json F]

Runs an implementation over a trace under the conformance harness and prints a table like
`cpkv replay`'s, with a one-line reproducer on failure. Exit 0: every check passed; 1: a check
failed (a wrong byte, an invariant, a rank that raised, hung or died, a broken contract); 2: bad
input (the trace, the options, an --impl that does not import). Under torchrun (WORLD_SIZE set)
each process is one rank, the rendezvous is env://, and rank 0 prints.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from dataclasses import replace
from typing import List, Optional

from .. import _cpkv
from .._errors import InputError, TraceError
from . import _adversity as adv
from . import _impl_spec
from . import _report
from . import _shm
from . import _timeline
from . import run_with_timeline
from . import _timing
from ._context import ContractError
from ._launch import Outcome, launch
from ._rank import Reporter, RunSpec, drive, load_impl
from .reference import MUTANTS

PROG = "python3 -m cpkv.conformance"
REQUIRED_METHODS = ("setup", "compose_layer", "end_batch", "teardown")


def parse(argv: List[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description="Run an exchange implementation under cpkv's conformance harness.")
    p.add_argument("trace", help="a batch trace (format v1)")
    p.add_argument("--impl", required=True, help="module:Class or path/to/file.py:Class, optionally with constructor arguments: "
                   "'module:Class(k=v, ...)' (each value a Python literal)")
    p.add_argument("--impl-arg", action="append", metavar="NAME=VALUE", help="a constructor argument of the implementation (VALUE "
                   "a Python literal, read with ast.literal_eval; repeatable)")
    p.add_argument("--ranks", type=int, help="ranks to spawn (the trace's cp; omit under torchrun)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--seed", type=int, default=1, help="content and delay seed (printed; every random choice comes from it)")
    p.add_argument("--swarm", action="store_true", help="draw every delay knob from --seed, as `cpkv replay --swarm` does")
    p.add_argument("--layers", type=int, help="layers to run (default: the trace's)")
    p.add_argument("--batch", type=int, help="run only this batch of the trace")
    p.add_argument("--mutant", choices=sorted(MUTANTS), help="plant a bug in a reference implementation (cpkv.conformance.reference)")
    p.add_argument("--no-delays", action="store_true", help="no injected delays")
    p.add_argument("--ipc-fail-rank", type=int, default=-1, help="this rank's IPC capability probe fails")
    p.add_argument("--window", type=float, default=20.0, help="seconds before a wait or a silent rank is reported (default 20)")
    p.add_argument("--time", action="store_true",
                   help="checks, delays and event hooks off; each layer's compose time measured (median and p90), beside the "
                        "layer's link limit and (CUDA, one rank per GPU) cpkv's built-in staging_direct")
    p.add_argument("--cpkv-bin", metavar="PATH", help="the `cpkv` binary --time runs for the built-in staging_direct "
                   "(default $CPKV_BIN, else cpkv on PATH)")
    p.add_argument("--require-attention", action="store_true",
                   help='fail an implementation whose compose_layer returns no "attention" plan (docs/attention.md)')
    p.add_argument("--attention-output", action="store_true",
                   help="run cpkv.attention.reference over each rank's buffer and plan, compared bit for bit with the single device")
    p.add_argument("--json", metavar="F", help="write the result as JSON to F (`cpkv replay --json`'s schema)")
    p.add_argument("--timeline", metavar="F", help="write a timeline to F (Chrome trace event format: Perfetto, chrome://tracing; docs/event-log.md)")
    return p.parse_args(argv)


def reproducer(a: argparse.Namespace) -> str:
    """The command line that reproduces this run, whole: constructor arguments, --window, and the
    environment variables the implementation's source names (_impl_spec)."""
    impl = _impl_spec.format_impl(a.impl, getattr(a, "impl_kwargs", {}))
    parts = [*PROG.split(), a.trace, "--impl", impl, "--ranks", str(a.ranks), "--device", a.device, "--seed", str(a.seed)]
    for flag, value in (("--layers", a.layers), ("--batch", a.batch), ("--mutant", a.mutant)):
        if value is not None:
            parts += [flag, str(value)]
    if a.ipc_fail_rank >= 0:
        parts += ["--ipc-fail-rank", str(a.ipc_fail_rank)]
    parts += ["--swarm"] if a.swarm else []
    parts += ["--no-delays"] if a.no_delays else []
    parts += ["--time"] if a.time else []
    parts += ["--require-attention"] if a.require_attention else []
    parts += ["--attention-output"] if a.attention_output else []
    parts += ["--window", f"{a.window:g}"] if a.window != 20.0 else []
    return _impl_spec.with_environment(" ".join(shlex.quote(p) for p in parts), _impl_spec.environment_read(a.impl))


def header(a: argparse.Namespace, setting: _cpkv.Setting, batches: int, layers: int) -> List[str]:
    knob = adv.knobs(a.seed, a.swarm)
    impl = _impl_spec.format_impl(a.impl, getattr(a, "impl_kwargs", {}))
    return [f"cpkv conformance: {a.trace} | cp {setting.cp} page {setting.page_size} | {batches} batches | {layers} of "
            f"{setting.layer_count} layers | impl {impl} | mutant {a.mutant or 'none'} | device {a.device} | seed {a.seed}",
            "delays: off" if a.no_delays or a.time else adv.describe(knob, a.swarm, setting.cp)]


def failure_lines(o: Outcome, limit: int = 8) -> List[str]:
    lines = (o.mismatches + o.findings)[:limit]
    if o.failure:
        lines.append(o.failure)
        lines += [f"  {p}" for p in o.positions]
    return lines


def check_impl(a: argparse.Namespace) -> None:
    """The class imports and has the four methods: checked before any rank starts (exit 2)."""
    cls = load_impl(a.impl)
    missing = [m for m in REQUIRED_METHODS if not callable(getattr(cls, m, None))]
    if missing:
        raise ContractError(f"--impl {a.impl}: {cls.__name__} has no {', '.join(missing)}")
    if a.mutant and cls.__module__ != "cpkv.conformance.reference":
        raise ContractError(f"--mutant {a.mutant}: planted bugs exist only in cpkv.conformance.reference, not {a.impl}")


def spec_of(a: argparse.Namespace, setting: _cpkv.Setting, batches: List[_cpkv.Batch]) -> RunSpec:
    if a.layers is not None and not 1 <= a.layers <= setting.layer_count:
        raise InputError("--layers", f"{a.layers} is not in 1..{setting.layer_count} (the trace's layers)")
    if a.batch is not None:
        if not 0 <= a.batch < len(batches):
            raise InputError("--batch", f"{a.batch} is not in {a.trace} ({len(batches)} batches)")
        batches = [batches[a.batch]]
    layers = a.layers or setting.layer_count
    return RunSpec(impl=a.impl, setting=setting, batches=batches, layers=layers, seed=a.seed, device=a.device, swarm=a.swarm,
                   delays=not (a.no_delays or a.time), mutant=a.mutant, window_s=a.window, ipc_fail_rank=a.ipc_fail_rank,
                   timing=a.time, require_attention=a.require_attention, attention_output=a.attention_output,
                   impl_kwargs=dict(getattr(a, "impl_kwargs", {})))


def run_torchrun(spec: RunSpec) -> Optional[Outcome]:
    """One rank of a torchrun launch. Rank 0 returns the outcome it gathered; the others None."""
    rank = int(os.environ["RANK"])
    spec.init_method = "env://"
    spec.run = "torchrun-" + "".join(ch for ch in os.environ.get("TORCHELASTIC_RUN_ID", os.environ.get("MASTER_PORT", "0")) if ch.isalnum())
    reporter = Reporter(None)
    outcome = Outcome()
    started = time.monotonic()
    # On CUDA the capture probe runs first, before this process switches the sync-counting hooks on.
    probe = [replace(spec, capture_only=True, run=spec.run + "-capture")] if spec.device == "cuda" and not spec.timing else []
    try:
        drive(probe + [spec], rank, reporter)
    except Exception as error:  # this rank's failure, one line; torchrun ends the others
        outcome.failure, outcome.failure_kind = f"rank {rank}: {type(error).__name__}: {error}", "raised"
    for message in reporter.messages:
        if message[0] in ("batch", "capture"):
            outcome.record(message)
    for case in probe + [spec]:
        _shm.remove_run(case.run)
    outcome.seconds = time.monotonic() - started
    return outcome if rank == 0 or outcome.failure else None


def main(argv: Optional[List[str]] = None) -> int:
    a = parse(sys.argv[1:] if argv is None else argv)
    try:
        a.impl, a.impl_kwargs = _impl_spec.resolve(a.impl, a.impl_arg)
        check_impl(a)
        reader = _cpkv.read_trace(a.trace)
        batches = list(reader)
        setting = reader.setting
        torchrun = "WORLD_SIZE" in os.environ and "RANK" in os.environ
        ranks = int(os.environ["WORLD_SIZE"]) if torchrun else a.ranks
        if ranks != setting.cp:
            raise InputError("--ranks", f"{ranks} ranks for a trace of cp = {setting.cp}")
        a.ranks = ranks
        spec = spec_of(a, setting, batches)
        if a.timeline:
            _timeline.check_target(a.timeline)
    except (InputError, TraceError, ContractError) as error:
        print(f"cpkv conformance: error: {error}", file=sys.stderr)
        return 2
    quiet = torchrun and int(os.environ["RANK"]) != 0
    if not quiet:
        print("\n".join(header(a, setting, len(spec.batches), spec.layers)), flush=True)
    if a.timeline and torchrun:
        print("cpkv conformance: error: --timeline: not under torchrun (rank 0 alone would write it)", file=sys.stderr)
        return 2
    if torchrun:
        outcome = run_torchrun(spec)
    else:
        outcome = run_with_timeline(spec, a.timeline, launch) if a.timeline else launch(spec)
    if outcome is None:
        return 0
    if a.time and a.device == "cuda":
        timed = [a.batch] if a.batch is not None else [b["batch"] for b in outcome.batches]
        outcome.builtin = _timing.builtin_staging_direct(a.trace, spec.layers, timed, setting.cp, _timing.find_cpkv(a.cpkv_bin))
    print("\n".join(_report.table(spec, outcome)))
    if not outcome.passed:
        print("\n".join(failure_lines(outcome)))
        print(f"replay: {reproducer(a)}")
    if outcome.leftovers:
        print(f"cpkv conformance: left behind: {', '.join(outcome.leftovers)}", file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            mode = "torchrun" if torchrun else "processes"
            json.dump(_report.replay_json(spec, outcome, a.trace, mode, reproducer(a)), f, indent=2, sort_keys=True)
    if outcome.failure_kind == "contract" and outcome.failure and outcome.failure.split(": ", 1)[-1].startswith("--"):
        return 2
    return 0 if outcome.passed else 1


if __name__ == "__main__":
    sys.exit(main())

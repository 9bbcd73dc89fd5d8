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
import math
import os
import signal
import sys
import time
from dataclasses import replace
from typing import List, Optional

from .. import _cpkv, _outputs
from .._errors import InputError, TraceError
from . import _adversity as adv
from . import _impl_spec
from . import _impl_loader
from . import _report
from . import _shm
from . import run_with_timeline
from . import _timing
from ._context import ContractError
from ._launch import Outcome, launch
from ._rank import Reporter, RunSpec, drive
from .reference import ALLGATHER_MUTANTS, MUTANTS

PROG = "python3 -m cpkv.conformance"
# --window: a wait's bound in seconds. Above an hour a wait is no bound (and gloo's timedelta overflows near 1e300).
WINDOW_S_MAX = 3600.0
WINDOW_S_DEFAULT = 20.0
SEED_MAX = (1 << 64) - 1  # seeds are the model's uint64


class _Parser(argparse.ArgumentParser):
    """argparse's usage dump for a bad value replaced by one line and exit 2 (issue 34, item 15);
    in process (cpkv.replay(backend="torch")), an InputError instead."""

    in_process = False

    def error(self, message: str):  # type: ignore[override]
        if self.in_process:
            raise InputError("options", message)
        print(f"cpkv conformance: error: {message} (see {PROG} --help)", file=sys.stderr)
        sys.exit(2)


def resolve_knobs(a: argparse.Namespace) -> None:
    """The knobs the environment may set, resolved at the command line's edge (the only place the
    package reads CPKV_*): the option, else the variable, else the default; a.knobs keeps each with
    what chose it, for the header and the reproducer."""
    a.knobs = []
    for flag, attr, variable, default in (("--import-s-max", "import_s_max", "CPKV_IMPORT_S_MAX", _impl_loader.IMPORT_S_MAX),
                                          ("--cpkv-bin", "cpkv_bin", "CPKV_BIN", None)):
        origin = flag
        if getattr(a, attr) is None:
            text = os.environ.get(variable, "")
            origin = variable if text else "default"
            setattr(a, attr, text or default)
        if attr == "import_s_max" and isinstance(a.import_s_max, str):
            try:
                a.import_s_max = float(a.import_s_max)
            except ValueError:
                raise InputError(flag, f"{variable}='{a.import_s_max}' is not a number of seconds") from None
        a.knobs.append((flag, getattr(a, attr), origin))


def parse(argv: List[str], in_process: bool = False) -> argparse.Namespace:
    p = _Parser(prog=PROG, description="Run an exchange implementation under cpkv's conformance harness.")
    p.in_process = in_process
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
    p.add_argument("--mutant", choices=sorted({**MUTANTS, **ALLGATHER_MUTANTS}), help="plant a bug in a reference implementation (cpkv.conformance.reference)")
    p.add_argument("--no-delays", action="store_true", help="no injected delays")
    # The names `cpkv replay` gives these options; --ipc-fail-rank and --window (seconds) are the old
    # spellings, still taken (docs/conformance.md).
    p.add_argument("--ipc-missing-rank", "--ipc-fail-rank", dest="ipc_fail_rank", type=int, default=-1,
                   help="this rank's IPC capability probe fails (old spelling: --ipc-fail-rank)")
    p.add_argument("--wait-ms-max", metavar="MS", type=float,
                   help="milliseconds before a wait or a silent rank is reported (default 20000)")
    p.add_argument("--window", metavar="SECONDS", type=float, help="the same bound in seconds (the old spelling of --wait-ms-max)")
    p.add_argument("--time", action="store_true",
                   help="checks, delays and event hooks off; each layer's compose time measured (median and p90), beside the "
                        "layer's link limit and (CUDA, one rank per GPU) cpkv's built-in staging_direct")
    # The environment's knobs are read here, at the command line's edge, and nowhere below it: the
    # run gets them as options, and the reproducer writes every non-default one as a flag.
    p.add_argument("--cpkv-bin", metavar="PATH",
                   help="the `cpkv` binary --time runs for the built-in staging_direct (default $CPKV_BIN, else the build's, else "
                        "cpkv on PATH)")
    p.add_argument("--import-s-max", metavar="S", type=float,
                   help=f"the bound on importing --impl in its probe child, in seconds (default $CPKV_IMPORT_S_MAX, else "
                        f"{_impl_loader.IMPORT_S_MAX:.0f})")
    p.add_argument("--require-attention", action="store_true",
                   help='fail an implementation whose compose_layer returns no "attention" plan (docs/attention.md)')
    p.add_argument("--attention-output", action="store_true",
                   help="run cpkv.attention.reference over each rank's buffer and plan, compared bit for bit with the single device")
    p.add_argument("--json", metavar="F", help="write the result as JSON to F (`cpkv replay --json`'s schema)")
    p.add_argument("--timeline", metavar="F", help="write a timeline to F (Chrome trace event format: Perfetto, chrome://tracing; docs/event-log.md)")
    return p.parse_args(argv)


def reproducer(a: argparse.Namespace, spec: RunSpec) -> str:
    """The command line that reproduces this run, whole (_impl_spec.spec_reproducer, the one builder)."""
    return _impl_spec.spec_reproducer(spec, a.trace, batch=a.batch, knobs=getattr(a, "knobs", ()))


def header(a: argparse.Namespace, setting: _cpkv.Setting, batches: int, layers: int) -> List[str]:
    knob = adv.knobs(a.seed, a.swarm)
    impl = _impl_spec.format_impl(a.impl, getattr(a, "impl_kwargs", {}))
    return [f"cpkv conformance: {a.trace} | cp {setting.cp} page {setting.page_size} | {batches} batches | {layers} of "
            f"{setting.layer_count} layers | impl {impl} | mutant {a.mutant or 'none'} | device {a.device} | seed {a.seed}",
            "delays: off" if a.no_delays or a.time else adv.describe(knob, a.swarm, setting.cp),
            "knobs: " + " | ".join(f"{flag} {'none' if value is None else format(value, 'g') if isinstance(value, float) else value} ({origin})"
                                   for flag, value, origin in getattr(a, "knobs", []))]


def failure_lines(o: Outcome, limit: int = 8) -> List[str]:
    lines = (o.mismatches + o.findings)[:limit]
    if o.failure:
        lines.append(o.failure)
        lines += [f"  {p}" for p in o.positions]
    return lines


def check_impl(a: argparse.Namespace) -> None:
    """The class imports and has the four methods, tried in a bounded child process before any rank
    starts (exit 2): an import that exits, hangs or is interrupted cannot end or stall the launcher."""
    _impl_loader.probe_impl(a.impl, a.mutant, a.import_s_max)


def check_options(a: argparse.Namespace) -> None:
    """Every number in range before any rank starts (issue 34, item 15)."""
    if a.wait_ms_max is not None and a.window is not None:
        raise InputError("--window", "give --wait-ms-max or its old spelling --window (seconds), not both")
    if a.wait_ms_max is not None:
        if not math.isfinite(a.wait_ms_max) or not 0 < a.wait_ms_max <= WINDOW_S_MAX * 1e3:
            raise InputError("--wait-ms-max", f"{a.wait_ms_max:g} is not a number of milliseconds in (0, {WINDOW_S_MAX * 1e3:.0f}]")
        a.window = a.wait_ms_max / 1e3
    elif a.window is None:
        a.window = WINDOW_S_DEFAULT
    if not math.isfinite(a.window) or not 0 < a.window <= WINDOW_S_MAX:
        raise InputError("--window", f"{a.window} is not a number of seconds in (0, {WINDOW_S_MAX:.0f}]")
    if not math.isfinite(a.import_s_max) or not 0 < a.import_s_max <= 3600:
        raise InputError("--import-s-max", f"{a.import_s_max:g} is not a number of seconds in (0, 3600]")
    if not 0 <= a.seed <= SEED_MAX:
        raise InputError("--seed", f"{a.seed} is not in 0..2^64-1")
    if a.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise InputError("--device", "cuda: no CUDA device is visible to torch (run with --device cpu)")


def ranks_of(a: argparse.Namespace, setting: _cpkv.Setting, torchrun: bool) -> int:
    if torchrun:
        text = os.environ["WORLD_SIZE"]
        if not text.strip().isdigit():
            raise InputError("WORLD_SIZE", f"'{text}' is not a number of ranks")
        ranks = int(text)
    elif a.ranks is None:
        raise InputError("--ranks", f"required: the ranks to spawn (this trace's cp is {setting.cp})")
    else:
        ranks = a.ranks
    if ranks != setting.cp:
        raise InputError("--ranks", f"{ranks} ranks for a trace of cp = {setting.cp}")
    if not -1 <= a.ipc_fail_rank < ranks:
        raise InputError("--ipc-missing-rank", f"{a.ipc_fail_rank} is not a rank of {ranks} (0..{ranks - 1}, or -1 for none)")
    return ranks


def check_outputs(a: argparse.Namespace) -> List[Optional[_outputs.Output]]:
    """--json and --timeline checked as the cpkv command checks its outputs, before any rank starts:
    never the trace, never each other, never a pipe, folder, device or /proc file."""
    outs = [_outputs.check_output("--json", a.json) if a.json else None,
            _outputs.check_output("--timeline", a.timeline) if a.timeline else None]
    _outputs.refuse_same_files([("trace", a.trace)], outs)
    return outs


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


def prepare(a: argparse.Namespace):
    """Everything checked before any rank starts: the spec, the outputs, and whether this is torchrun."""
    check_options(a)
    _outputs.check_input_file("trace", a.trace)
    a.impl, a.impl_kwargs = _impl_spec.resolve(a.impl, a.impl_arg)
    outs = check_outputs(a)
    torchrun = "WORLD_SIZE" in os.environ and "RANK" in os.environ
    if a.timeline and torchrun:
        raise InputError("--timeline", "not under torchrun (rank 0 alone would write it)")
    reader = _cpkv.read_trace(a.trace)
    batches = list(reader)
    setting = reader.setting
    if not batches:
        raise InputError("trace", f"{a.trace} holds no batch (only its header)")
    a.ranks = ranks_of(a, setting, torchrun)
    spec = spec_of(a, setting, batches)
    check_impl(a)
    return spec, setting, outs, torchrun


class _Stopped(BaseException):
    """SIGTERM or SIGHUP to the launcher: unwinds like Ctrl-C, so the teardown stops every rank."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stop(signum: int, _frame) -> None:
    raise _Stopped(signum)


def main(argv: Optional[List[str]] = None) -> int:
    """Ctrl-C: one line and exit 130, every rank stopped (the launcher's teardown runs on the way out);
    SIGTERM and SIGHUP the same, exit 128 + the signal (issue 34, item 18), once command_line() has
    installed their handlers (a caller of main() in-process keeps its own)."""
    try:
        return run_main(argv)
    except KeyboardInterrupt:
        print("cpkv conformance: interrupted (every rank stopped)", file=sys.stderr)
        return 130
    except _Stopped as stopped:
        print(f"cpkv conformance: stopped by {signal.Signals(stopped.signum).name} (every rank stopped)", file=sys.stderr)
        return 128 + stopped.signum


def run_prepared(a: argparse.Namespace, spec: RunSpec, setting: _cpkv.Setting, outs: List[Optional[_outputs.Output]],
                 torchrun: bool) -> Optional[Outcome]:
    """The run of a prepared command: every rank launched (or this one under torchrun), the timeline
    written, and under --time on CUDA the built-in staging_direct timed on the same batches."""
    if torchrun:
        outcome = run_torchrun(spec)
    else:
        outcome = run_with_timeline(spec, outs[1], launch) if outs[1] else launch(spec)
    if outcome is not None and a.time and a.device == "cuda":
        timed = [a.batch] if a.batch is not None else [b["batch"] for b in outcome.batches]
        outcome.builtin = _timing.builtin_staging_direct(a.trace, spec.layers, timed, setting.cp, _timing.find_cpkv(a.cpkv_bin))
    return outcome


def replay(argv: List[str]) -> dict:
    """The torch backend's run in process (cpkv.replay(path, backend="torch", impl=...), through the
    request check in C++, whose handoff gives these arguments): the same checks and run as the
    command, nothing printed; returns the report `--json` writes (and writes it there too, where
    given). Bad input raises InputError or TraceError, as every backend's replay() does."""
    a = parse(argv, in_process=True)
    try:
        resolve_knobs(a)
        spec, setting, outs, torchrun = prepare(a)
    except ContractError as error:
        raise InputError("impl", str(error)) from None
    if torchrun:
        raise InputError("backend", "torch: not in process under torchrun (run python3 -m cpkv.conformance in each rank)")
    outcome = run_prepared(a, spec, setting, outs, torchrun)
    report = _report.replay_json(spec, outcome, a.trace, "processes", reproducer(a, spec))
    if outs[0] is not None:
        _outputs.write_output(outs[0], json.dumps(report, indent=2, sort_keys=True).encode())
    return report


def run_main(argv: Optional[List[str]]) -> int:
    a = parse(sys.argv[1:] if argv is None else argv)
    try:
        resolve_knobs(a)
        spec, setting, outs, torchrun = prepare(a)
    except (InputError, TraceError, ContractError) as error:
        print(f"cpkv conformance: error: {error}", file=sys.stderr)
        return 2
    quiet = torchrun and int(os.environ["RANK"]) != 0
    if not quiet:
        print("\n".join(header(a, setting, len(spec.batches), spec.layers)), flush=True)
    outcome = run_prepared(a, spec, setting, outs, torchrun)
    if outcome is None:
        return 0
    print("\n".join(_report.table(spec, outcome)))
    if not outcome.passed:
        print("\n".join(failure_lines(outcome)))
        print(f"replay: {reproducer(a, spec)}")
    if outcome.leftovers:
        print(f"cpkv conformance: left behind: {', '.join(outcome.leftovers)}", file=sys.stderr)
    if outs[0] is not None:
        mode = "torchrun" if torchrun else "processes"
        text = json.dumps(_report.replay_json(spec, outcome, a.trace, mode, reproducer(a, spec)), indent=2, sort_keys=True)
        try:
            _outputs.write_output(outs[0], text.encode())
        except _outputs.OutputWriteError as error:
            print(f"cpkv conformance: error: {error}", file=sys.stderr)
            return 1
    if outcome.failure_kind == "contract" and outcome.failure and outcome.failure.split(": ", 1)[-1].startswith("--"):
        return 2
    return 0 if outcome.passed else 1


def command_line() -> int:
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _stop)
    return main()


if __name__ == "__main__":
    sys.exit(command_line())

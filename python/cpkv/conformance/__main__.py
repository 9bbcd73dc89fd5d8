"""python3 -m cpkv.conformance TRACE --impl module:Class --ranks N [--device cpu|cuda] [--seed S] [--swarm]
[--layers L] [--mutant NAME] [--time [--cpkv-bin PATH]] [--json F]

Runs an implementation over a trace under the conformance harness and prints a table like
`cpkv replay`'s, with a one-line reproducer on failure. It is a spelling of `cpkv replay TRACE
--backend torch`: the options are that replay request's, checked whole by the harness in one call
(check_run: the request, then against the trace), and the header, the reproducer and the JSON's common
part are the harness's. Handed a run by `cpkv replay --backend torch` (--request-fd, a file
descriptor the command wrote its checked run into), it reads that and checks nothing again. Exit 0: every check passed; 1: a check
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
from . import _checked
from . import _impl_spec
from . import _impl_loader
from . import _report
from . import _shm
from . import run_with_timeline
from . import _timing
from ._context import ContractError
from ._launch import Outcome, launch
from ._rank import Reporter, RunSpec, drive, end_groups
from .reference import ALLGATHER_MUTANTS, MUTANTS

PROG = "python3 -m cpkv.conformance"
WINDOW_S_DEFAULT = 20.0  # the wait bound where --wait-ms-max is not given
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


def parse(argv: List[str], in_process: bool = False) -> argparse.Namespace:
    """The command's syntax only: every value is checked by the one replay request's check
    (harness/src/request.cpp: check_run, through _cpkv.check_torch_run), as `cpkv replay
    --backend torch` checks the same options (and hands the checked run over: --request-fd)."""
    p = _Parser(prog=PROG, description="Run an exchange implementation under cpkv's conformance harness.")
    p.in_process = in_process
    p.add_argument("trace", help="a batch trace (format v1)")
    p.add_argument("--impl", required=True, help="module:Class or path/to/file.py:Class, optionally with constructor arguments: "
                   "'module:Class(k=v, ...)' (each value a Python literal)")
    p.add_argument("--impl-arg", action="append", metavar="NAME=VALUE", help="a constructor argument of the implementation (VALUE "
                   "a Python literal, read with ast.literal_eval; repeatable)")
    p.add_argument("--ranks", help="ranks to spawn (the trace's cp; omit under torchrun)")
    p.add_argument("--device", default="cpu", help="cpu (gloo; the default) or cuda (NCCL, CUDA IPC)")
    p.add_argument("--seed", default="1", help="content and delay seed (printed; every random choice comes from it)")
    p.add_argument("--swarm", action="store_true", help="draw every delay knob from --seed, as `cpkv replay --swarm` does")
    p.add_argument("--layers", default="4", help="layers to run: a number (at most the trace's) or 'all'; default 4, at most the trace's, "
                   "as every backend's (cpkv replay's)")
    p.add_argument("--batch", help="run only this batch of the trace")
    p.add_argument("--mutant", choices=sorted({**MUTANTS, **ALLGATHER_MUTANTS}), help="plant a bug in a reference implementation (cpkv.conformance.reference)")
    p.add_argument("--no-delays", action="store_true", help="no injected delays")
    # The names `cpkv replay` gives these options; --ipc-fail-rank and --window (seconds) are the old
    # spellings, still taken (docs/conformance.md).
    p.add_argument("--ipc-missing-rank", "--ipc-fail-rank", dest="ipc_missing_rank", help="this rank's IPC capability probe fails "
                   "(old spelling: --ipc-fail-rank)")
    p.add_argument("--wait-ms-max", metavar="MS", help="milliseconds before a wait or a silent rank is reported (default 20000)")
    p.add_argument("--window", metavar="SECONDS", help="the same bound in seconds (the old spelling of --wait-ms-max)")
    p.add_argument("--time", action="store_true",
                   help="checks, delays and event hooks off; each layer's compose time measured (median and p90), beside the "
                        "layer's link limit and (CUDA, one rank per GPU) cpkv's built-in staging_direct")
    # Knobs the environment may also set: the request check reads CPKV_BIN and CPKV_IMPORT_S_MAX
    # where these are not given, prints each in the header and writes a non-default one as a flag.
    p.add_argument("--cpkv-bin", metavar="PATH",
                   help="the `cpkv` binary --time runs for the built-in staging_direct (default $CPKV_BIN, else the build's, else "
                        "cpkv on PATH)")
    p.add_argument("--import-s-max", metavar="S", help=f"the bound on importing --impl in its probe child, in seconds (default "
                   f"$CPKV_IMPORT_S_MAX, else {_impl_loader.IMPORT_S_MAX:.0f})")
    p.add_argument("--require-attention", action="store_true",
                   help='fail an implementation whose compose_layer returns no "attention" plan (docs/attention.md)')
    p.add_argument("--attention-output", action="store_true",
                   help="run cpkv.attention.reference over each rank's buffer and plan, compared bit for bit with the single device")
    p.add_argument("--json", metavar="F", help="write the result as JSON to F (`cpkv replay --json`'s schema)")
    p.add_argument("--timeline", metavar="F", help="write a timeline to F (Chrome trace event format: Perfetto, chrome://tracing; docs/event-log.md)")
    p.add_argument("--request-fd", metavar="N", help="the run as the cpkv command checked it, on this inherited file descriptor "
                   "(`cpkv replay --backend torch` passes it; typed by hand, leave it out)")
    a = p.parse_args(argv)
    a.argv = list(argv)  # a handed run's command must be this one (_checked.from_handed)
    return a


def _whole(flag: str, text: Optional[str], low: int = -(1 << 63), high: int = (1 << 63) - 1) -> Optional[int]:
    """A whole number as the command spells it (its range is the request check's; the seed's, the
    model's uint64, is the parse's, as the cpkv command's)."""
    if text is None:
        return None
    try:
        value = int(text, 10)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise InputError(flag, f"'{text}' is not a whole number" + (f" in {low}..{high}" if flag == "--seed" else ""))
    return value


def _wait_ms(a: argparse.Namespace) -> Optional[int]:
    """--wait-ms-max, or its old spelling --window in seconds, as the request's milliseconds."""
    if a.wait_ms_max is not None and a.window is not None:
        raise InputError("--window", "give --wait-ms-max or its old spelling --window (seconds), not both")
    if a.window is None:
        return _whole("--wait-ms-max", a.wait_ms_max)
    try:
        seconds = float(a.window)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or abs(seconds) > 1e15:  # beyond that not a millisecond count the request holds
        raise InputError("--window", f"'{a.window}' is not a number of seconds")
    return round(seconds * 1e3)


def _seconds(flag: str, text: Optional[str]) -> Optional[float]:
    try:
        return None if text is None else float(text)
    except ValueError:
        raise InputError(flag, f"'{text}' is not a number of seconds") from None


def request_options(a: argparse.Namespace, ranks: int) -> dict:
    """The command's options as the torch backend's replay request (its fields' names)."""
    return {"impl": _impl_spec.format_impl(a.impl, a.impl_kwargs), "device": a.device, "ranks": ranks,
            "seed": _whole("--seed", a.seed, 0, SEED_MAX), "layers": None if a.layers == "all" else _whole("--layers", a.layers),
            "batch": _whole("--batch", a.batch), "mutant": a.mutant or "none", "swarm": a.swarm, "wait_ms_max": _wait_ms(a),
            "ipc_missing_rank": _whole("--ipc-missing-rank", a.ipc_missing_rank), "timeline": a.timeline, "no_delays": a.no_delays,
            "time": a.time, "require_attention": a.require_attention, "attention_output": a.attention_output,
            "import_s_max": _seconds("--import-s-max", a.import_s_max), "cpkv_bin": a.cpkv_bin}


def reproducer(checked: _checked.CheckedRun, spec: RunSpec) -> str:
    """The command line that reproduces this run, whole: the request's line from the harness
    (`cpkv replay TRACE --backend torch --impl ...`), after the environment its implementation names."""
    return _impl_spec.with_environment(checked.replay_line, _impl_spec.environment_read(spec.impl))


def header(checked: _checked.CheckedRun, spec: RunSpec, mode: str) -> List[str]:
    """The harness's run header (`cpkv replay`'s lines), then the injected delays (the harness's own)."""
    return checked.header[f"conformance/{mode}"] + [adv.delays_line(spec.seed, spec.swarm, spec.setting.cp, spec.delays)]


def failure_lines(o: Outcome, limit: int = 8) -> List[str]:
    lines = (o.mismatches + o.findings)[:limit]
    if o.failure:
        lines.append(o.failure)
        lines += [f"  {p}" for p in o.positions]
    return lines


def check_impl(a: argparse.Namespace, checked: _checked.CheckedRun) -> None:
    """The class imports and has the four methods, tried in a bounded child process before any rank
    starts (exit 2): an import that exits, hangs or is interrupted cannot end or stall the launcher."""
    _impl_loader.probe_impl(a.impl, a.mutant, checked.import_s_max or _impl_loader.IMPORT_S_MAX)


def check_device(a: argparse.Namespace) -> None:
    """A CUDA run needs a device torch sees (the request check knows the word, not the machine)."""
    if a.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise InputError("--device", "cuda: no CUDA device is visible to torch (run with --device cpu)")


def ranks_of(a: argparse.Namespace, torchrun: bool) -> int:
    """The ranks to spawn: torchrun's world, else --ranks (required: the command spawns them); the
    request check compares them with the trace's cp."""
    if torchrun:
        text = os.environ["WORLD_SIZE"]
        if not text.strip().isdigit():
            raise InputError("WORLD_SIZE", f"'{text}' is not a number of ranks")
        return int(text)
    if a.ranks is None:
        raise InputError("--ranks", f"required: the ranks to spawn (this trace's cp is {_cpkv.read_trace(a.trace).setting.cp})")
    return _whole("--ranks", a.ranks)


def check_outputs(a: argparse.Namespace) -> List[Optional[_outputs.Output]]:
    """--json and --timeline checked as the cpkv command checks its outputs, before any rank starts:
    never the trace, never each other, never a pipe, folder, device or /proc file."""
    outs = [_outputs.check_output("--json", a.json) if a.json else None,
            _outputs.check_output("--timeline", a.timeline) if a.timeline else None]
    _outputs.refuse_same_files([("trace", a.trace)], outs)
    return outs


def spec_of(a: argparse.Namespace, checked: _checked.CheckedRun, setting: _cpkv.Setting, batches: List[_cpkv.Batch]) -> RunSpec:
    """The run of the checked request (its layers as every backend runs them: at most the trace's)."""
    if a.batch is not None:
        batches = [batches[int(a.batch)]]  # present: the request check saw it in the trace
    wait_ms = _wait_ms(a)
    return RunSpec(impl=a.impl, setting=setting, batches=batches, layers=checked.layers, seed=int(a.seed),
                   device=a.device, swarm=a.swarm, delays=not (a.no_delays or a.time), mutant=a.mutant,
                   window_s=WINDOW_S_DEFAULT if wait_ms is None else wait_ms / 1e3,
                   ipc_fail_rank=-1 if a.ipc_missing_rank is None else int(a.ipc_missing_rank),
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
    finally:
        # The groups go before the interpreter does, as a spawned rank's do (_rank.rank_main): left to
        # the exit, gloo's threads were destroyed still joinable and the rank aborted ("terminate called
        # without an active exception", exit -6) after a run that passed (a fresh-clone run, 01:40 UTC).
        end_groups()
    for message in reporter.messages:
        if message[0] in ("batch", "capture"):
            outcome.record(message)
    for case in probe + [spec]:
        _shm.remove_run(case.run)
    outcome.seconds = time.monotonic() - started
    return outcome if rank == 0 or outcome.failure else None


def checked_run(a: argparse.Namespace, torchrun: bool, handed: Optional[dict]) -> _checked.CheckedRun:
    """The run as the harness checked it: handed over (in process, or by the cpkv command on
    --request-fd), else checked here, in one call (the request, then against the trace)."""
    if handed is not None:
        return _checked.from_handed(handed, a.argv, "checked")
    if a.request_fd is not None:
        return _checked.from_fd(a.request_fd, a.argv)
    return _checked.check(a.trace, request_options(a, ranks_of(a, torchrun)))


def prepare(a: argparse.Namespace, handed: Optional[dict] = None):
    """Everything checked before any rank starts, options first (the one request check, then against
    the trace, or the run a front end checked and handed over), then the outputs and the
    implementation: the checked run, the spec, the trace's setting, the outputs, and whether this is
    torchrun."""
    torchrun = "WORLD_SIZE" in os.environ and "RANK" in os.environ
    a.impl, a.impl_kwargs = _impl_spec.resolve(a.impl, a.impl_arg)
    _outputs.check_input_file("trace", a.trace)
    checked = checked_run(a, torchrun, handed)
    outs = check_outputs(a)
    if a.timeline and torchrun:
        raise InputError("--timeline", "not under torchrun (rank 0 alone would write it)")
    check_device(a)
    reader = _cpkv.read_trace(a.trace)
    batches = list(reader)
    if not batches:
        raise InputError("trace", f"{a.trace} holds no batch (only its header)")
    spec = spec_of(a, checked, reader.setting, batches)
    check_impl(a, checked)
    return checked, spec, reader.setting, outs, torchrun


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


def run_prepared(a: argparse.Namespace, checked: _checked.CheckedRun, spec: RunSpec, outs: List[Optional[_outputs.Output]],
                 torchrun: bool) -> Optional[Outcome]:
    """The run of a prepared command: every rank launched (or this one under torchrun), the timeline
    written, and under --time on CUDA the built-in staging_direct timed on the same batches."""
    if torchrun:
        outcome = run_torchrun(spec)
    else:
        outcome = run_with_timeline(spec, outs[1], launch) if outs[1] else launch(spec)
    if outcome is not None and a.time and a.device == "cuda":
        timed = [int(a.batch)] if a.batch is not None else [b["batch"] for b in outcome.batches]
        outcome.builtin = _timing.builtin_staging_direct(a.trace, spec.layers, timed, spec.setting.cp, _timing.find_cpkv(checked.cpkv_bin))
    return outcome


def replay(argv: List[str], handed: Optional[dict] = None) -> dict:
    """The torch backend's run in process (cpkv.replay(path, backend="torch", impl=...), checked whole
    by the request check in C++, which hands these arguments and the checked run over): the same run
    as the command, nothing printed; returns the report `--json` writes (and writes it there too,
    where given). Bad input raises InputError or TraceError, as every backend's replay() does."""
    a = parse(argv, in_process=True)
    try:
        checked, spec, _, outs, torchrun = prepare(a, handed)
    except ContractError as error:
        raise InputError("impl", str(error)) from None
    if torchrun:
        raise InputError("backend", "torch: not in process under torchrun (run python3 -m cpkv.conformance in each rank)")
    outcome = run_prepared(a, checked, spec, outs, torchrun)
    report = _report.replay_json(checked, spec, outcome, "processes", reproducer(checked, spec))
    if outs[0] is not None:
        _outputs.write_output(outs[0], json.dumps(report, indent=2, sort_keys=True).encode())
    return report


def report_run(a: argparse.Namespace, checked: _checked.CheckedRun, spec: RunSpec, outcome: Outcome, outs: List[Optional[_outputs.Output]],
               mode: str) -> int:
    """The table, a failure's lines and its reproducer, the --json file; the exit status."""
    line = reproducer(checked, spec)
    print("\n".join(_report.table(spec, outcome)))
    if not outcome.passed:
        print("\n".join(failure_lines(outcome)))
        print(f"replay: {line}")
    if outcome.leftovers:
        print(f"cpkv conformance: left behind: {', '.join(outcome.leftovers)}", file=sys.stderr)
    if outs[0] is not None:
        text = json.dumps(_report.replay_json(checked, spec, outcome, mode, line), indent=2, sort_keys=True)
        try:
            _outputs.write_output(outs[0], text.encode())
        except _outputs.OutputWriteError as error:
            print(f"cpkv conformance: error: {error}", file=sys.stderr)
            return 1
    if outcome.failure_kind == "contract" and outcome.failure and outcome.failure.split(": ", 1)[-1].startswith("--"):
        return 2
    return 0 if outcome.passed else 1


def run_main(argv: Optional[List[str]]) -> int:
    a = parse(sys.argv[1:] if argv is None else argv)
    try:
        checked, spec, _, outs, torchrun = prepare(a)
    except (InputError, TraceError, ContractError) as error:
        print(f"cpkv conformance: error: {error}", file=sys.stderr)
        return 2
    mode = "torchrun" if torchrun else "processes"
    if not (torchrun and int(os.environ["RANK"]) != 0):
        print("\n".join(header(checked, spec, mode)), flush=True)
    outcome = run_prepared(a, checked, spec, outs, torchrun)
    if outcome is None:
        return 0
    return report_run(a, checked, spec, outcome, outs, mode)


def command_line() -> int:
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _stop)
    return main()


if __name__ == "__main__":
    sys.exit(command_line())

"""cpkv.conformance: run an engine's own exchange implementation (PyTorch) under cpkv's harness.

An implementation is a class with ``setup(ctx)``, ``compose_layer(ctx, layer) -> {kind: dense}``,
``end_batch(ctx)`` and ``teardown(ctx)`` (docs/conformance.md is the contract). The harness spawns
one process per rank (gloo on CPU, NCCL and CUDA IPC on GPU), hands every rank a Context (the
setting, the batch, the layout and plans from the C++ model, its pool slab prefilled with the
specification's content and every peer's slab mapped, this layer's current rows), checks every dense
byte of every layer against the plain oracle, replays the implementation's optional events into the
simulator's state checker, and bounds every wait::

    from cpkv import conformance
    outcome = conformance.run("my_engine.exchange:MyExchange", setting, batches, seed=7)
    assert outcome.passed, outcome.report()

``python3 -m cpkv.conformance TRACE --impl module:Class --ranks N`` is the same from a shell, and
``cpkv.replay(TRACE, backend="torch", impl="module:Class")`` the same through the one replay request
(returning the report ``--json`` writes); ``cpkv replay TRACE --backend torch --impl module:Class``
hands the request to the first.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterable, List, Optional, Union

from .. import _cpkv, _outputs
from . import _timeline
from ._context import Context, ContractError, Events, SharedBuffer, StagingOverflow
from ._launch import Outcome, Session, launch, launch_cases
from ._rank import RunSpec

__all__ = ["run", "run_trace", "Context", "Events", "SharedBuffer", "StagingOverflow", "ContractError", "Outcome", "RunSpec",
           "layers_for", "run_cases", "case", "Session"]

DEFAULT_WINDOW_S = 20.0


def layers_for(setting: _cpkv.Setting, layers: Optional[int]) -> int:
    if layers is None:
        return setting.layer_count
    if not 1 <= layers <= setting.layer_count:
        raise _cpkv_input_error("layers", f"{layers} is not in 1..{setting.layer_count} (the setting's layers)")
    return layers


def _cpkv_input_error(field: str, reason: str) -> ValueError:
    from .._errors import InputError

    return InputError(field, reason)


def _impl_name(impl: Union[str, type]) -> str:
    if isinstance(impl, str):
        return impl
    return f"{impl.__module__}:{impl.__qualname__}"


def run(impl: Union[str, type], setting: _cpkv.Setting, batches: Iterable[_cpkv.Batch], *, seed: int = 1, device: str = "cpu",
        layers: Optional[int] = None, swarm: bool = False, delays: bool = True, mutant: Optional[str] = None,
        window_s: float = DEFAULT_WINDOW_S, ipc_fail_rank: int = -1, impl_kwargs: Optional[Dict[str, Any]] = None,
        timing: bool = False, timeline: Optional[Union[str, "os.PathLike[str]"]] = None, require_attention: bool = False,
        attention_output: bool = False) -> Outcome:
    """Run `impl` (a 'module:Class' string, or an importable class) over the batches, one spawned
    process per rank; returns the Outcome (passed, mismatches, findings, failure, positions).
    timing: --time (checks, delays and event hooks off; each layer's compose time in the records).
    timeline: write the run's timeline (Chrome trace events, one track per rank) to this file.
    require_attention: every layer must return an "attention" plan; attention_output: run
    cpkv.attention.reference over each rank's plan against the single device (docs/attention.md)."""
    output = None if timeline is None else _outputs.check_output("timeline", timeline)  # before any rank starts
    spec = case(impl, setting, batches, seed=seed, device=device, layers=layers, swarm=swarm, delays=delays, mutant=mutant,
                window_s=window_s, ipc_fail_rank=ipc_fail_rank, impl_kwargs=impl_kwargs, timing=timing,
                require_attention=require_attention, attention_output=attention_output)
    if output is None:
        return launch(spec)
    return run_with_timeline(spec, output, launch)


def run_with_timeline(spec: RunSpec, timeline: Union[str, "os.PathLike[str]", _outputs.Output], launcher) -> Any:
    """launcher(spec) with its timeline appended to a temporary file beside `timeline`, renamed over
    it when the run ends (also when it failed; a run that raised leaves no file)."""
    label = f"conformance {spec.impl}" + (f" mutant {spec.mutant}" if spec.mutant else "")
    output = timeline if isinstance(timeline, _outputs.Output) else _outputs.check_output("timeline", timeline)
    file = _timeline.TimelineFile(output, spec.setting.cp, label)
    spec.timeline = file.path
    try:
        outcome = launcher(spec)
    except BaseException:
        file.discard()
        raise
    file.close()
    return outcome


def case(impl: Union[str, type], setting: _cpkv.Setting, batches: Iterable[_cpkv.Batch], *, seed: int = 1, device: str = "cpu",
         layers: Optional[int] = None, swarm: bool = False, delays: bool = True, mutant: Optional[str] = None,
         window_s: float = DEFAULT_WINDOW_S, ipc_fail_rank: int = -1, impl_kwargs: Optional[Dict[str, Any]] = None,
         timing: bool = False, require_attention: bool = False, attention_output: bool = False) -> RunSpec:
    """One case, checked, for run_cases (the arguments are run()'s)."""
    batches = list(batches)
    if not batches:
        raise _cpkv_input_error("batches", "no batch given")
    for batch in batches:
        _cpkv.validate(setting, batch)
    if device not in ("cpu", "cuda"):
        raise _cpkv_input_error("device", f"'{device}' is not cpu or cuda")
    return RunSpec(impl=_impl_name(impl), setting=setting, batches=batches, layers=layers_for(setting, layers), seed=seed, device=device,
                   swarm=swarm, delays=delays and not timing, mutant=mutant, window_s=window_s, ipc_fail_rank=ipc_fail_rank,
                   impl_kwargs=dict(impl_kwargs or {}), timing=timing, require_attention=require_attention,
                   attention_output=attention_output)


def run_cases(cases: List[RunSpec]) -> List[Outcome]:
    """Several cases of the same cp in one session: the rank processes start once and run every case
    in turn (a case whose ranks fail is torn down and the next case starts fresh processes)."""
    if len({c.setting.cp for c in cases}) > 1:
        raise _cpkv_input_error("cases", "every case of a session must have the same cp")
    return launch_cases(cases)


def replay_command(argv: List[str], checked: Optional[dict] = None) -> dict:
    """`python3 -m cpkv.conformance ARGV` in process, nothing printed: the report `--json` writes.
    The torch backend's handoff (cpkv.replay(path, backend="torch", impl=...)) runs through it,
    with the run its request check checked whole (`checked`), so nothing is checked again."""
    from .__main__ import replay

    return replay(argv, checked)


def run_trace(path: str, impl: Union[str, type], *, batch: Optional[int] = None, **options: Any) -> Outcome:
    """run() over a trace file's setting and batches (or only batch `batch`). A timeline that is the
    trace itself is refused (InputError) before anything is read or run, as is a trace that is not a
    regular file (a pipe would block the read)."""
    _outputs.check_input_file("trace", path)
    if options.get("timeline") is not None:
        _outputs.refuse_same_files([("trace", path)], [_outputs.check_output("timeline", options["timeline"])])
    reader = _cpkv.read_trace(path)
    batches = list(reader)
    if batch is not None:
        if not 0 <= batch < len(batches):
            raise _cpkv_input_error("batch", f"{batch} is not in {path} ({len(batches)} batches)")
        batches = [batches[batch]]
    return run(impl, reader.setting, batches, **options)

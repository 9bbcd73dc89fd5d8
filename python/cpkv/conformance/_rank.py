"""One rank of a conformance run: the loop that drives an implementation and checks every layer.

The same function runs in a process spawned by the launcher (torch.multiprocessing, messages to the
launcher over a queue) and in a process started by torchrun (env:// rendezvous; rank 0 prints). The
rank's harness keeps its own gloo process group apart from the implementation's, so that a
harness collective can never be matched against one of the implementation's.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np
import torch
import torch.distributed as dist

from .. import _cpkv
from . import _adversity as adv
from . import _check
from . import _guards
from . import _happens_before
from . import _lifeline
from . import _probes
from . import _shm
from . import _timeline
from . import _timing
from ._context import Context, ContractError, StagingOverflow
from ._impl_loader import load_impl  # noqa: F401  (the rank's loader; __main__ and tests import it from here)
from ._probes import _first_line


@dataclass
class RunSpec:
    """Everything a rank needs, picklable (Setting and Batch pickle through the bindings)."""

    impl: str                      # "module:Class" or "path/to/file.py:Class"
    setting: _cpkv.Setting
    batches: List[_cpkv.Batch]
    layers: int
    seed: int
    device: str                    # "cpu" or "cuda"
    swarm: bool = False
    delays: bool = True
    mutant: Optional[str] = None
    window_s: float = 20.0         # a wait or a silent rank is reported after this long
    ipc_fail_rank: int = -1        # this rank's capability probe fails
    run: str = ""                  # shared-memory run id of this case's buffers
    positions_run: str = ""        # shared-memory run id of the positions table (one per launch)
    init_method: str = "env://"
    oversubscribe: bool = True     # cuda: ranks share GPUs when there are fewer GPUs than ranks
    impl_kwargs: Dict[str, Any] = field(default_factory=dict)
    timing: bool = False           # --time: checks, delays and events off; each layer's compose time measured
    timeline: str = ""             # a file rank 0 appends each batch's timeline lines to (_timeline.py); "" none
    link_limit: bool = True        # --time: each layer's link limit timed after it (_timing.link_limit_s)
    capture_only: bool = False     # CUDA: only the graph-capture probe, from batch capture_from on (run_capture_case)
    capture_from: int = 0
    require_attention: bool = False  # --require-attention: every composed layer must return an "attention" plan
    attention_output: bool = False  # --attention-output: cpkv.attention.reference over each rank's plan vs the single device


class Reporter:
    """Where a rank's messages go: the launcher's queue, or (torchrun) rank 0's stdout."""

    def __init__(self, queue) -> None:
        self.queue = queue
        self.messages: List[tuple] = []
        self.case = 0

    def send(self, what: str, *message) -> None:
        message = (what, self.case) + message
        if self.queue is not None:
            self.queue.put(message)
        else:
            self.messages.append(message)


def make_impl(spec: RunSpec):
    cls = load_impl(spec.impl)
    kwargs = dict(spec.impl_kwargs)
    if spec.mutant:
        kwargs["mutant"] = spec.mutant
    try:
        return cls(**kwargs)
    except TypeError as error:
        raise ContractError(f"--impl {spec.impl}: {cls.__name__}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())}): {error}") from None


def _device_for(spec: RunSpec, rank: int) -> torch.device:
    if spec.device != "cuda":
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if count == 0:
        raise ContractError("--device cuda: no CUDA device is visible")
    local = int(os.environ.get("LOCAL_RANK", rank))
    device = torch.device("cuda", local % count)
    torch.cuda.set_device(device)
    return device


def _positions(spec: RunSpec, rank: int, hgroup) -> torch.Tensor:
    """The shared positions table: the launcher made it (spawn), or rank 0 makes it (torchrun)."""
    path = _shm.path_of(spec.positions_run or spec.run, "positions", 0)
    nbytes = spec.setting.cp * adv.POSITION_COLUMNS * 8
    if rank == 0 and not os.path.exists(path):
        _shm.create_file(path, nbytes)
    dist.barrier(group=hgroup)
    table = _shm.map_file(path, nbytes).view(torch.int64).view(spec.setting.cp, adv.POSITION_COLUMNS)
    table[rank, adv.COL_PID] = os.getpid()
    dist.barrier(group=hgroup)  # every rank (and the launcher, if any) mapped it: the name can go
    if rank == 0:
        _shm.unlink_quietly(path)
    return table


def _touched_pages(batches: List[_cpkv.Batch]) -> List[int]:
    pages = set()
    for batch in batches:
        for request in batch.requests:
            pages.update(request.prefix_pages)
    return sorted(pages)


def _map_pools(ctx: Context, spec: RunSpec) -> None:
    """Every kind's pool slab, prefilled at each page's storage owner (sections 1 and 8)."""
    s = spec.setting
    pages = _touched_pages(spec.batches)
    for kind in ctx.kinds:
        shape = (spec.layers, s.pool_pages_per_rank(), s.page_size, ctx.row_bytes[kind])
        nbytes = int(np.prod(shape))
        host = torch.zeros(shape, dtype=torch.uint8) if ctx.device.type == "cuda" else None
        buffer = ctx._alloc_cpu_pool(f"pool-{kind}", nbytes) if host is None else ctx.alloc_shared(f"pool-{kind}", nbytes)
        target = host if host is not None else buffer.local.view(shape)
        _cpkv.conformance.populate_pool(target.numpy(), s, spec.seed, kind, ctx.rank, spec.layers, pages)
        if host is not None:
            buffer.local.view(shape).copy_(host.to(ctx.device))
            torch.cuda.synchronize(ctx.device)
        dist.barrier(group=ctx._hgroup)  # every slab is filled before any rank's first gather
        ctx.pool[kind] = [peer.view(shape) for peer in buffer.peers]


# The rendezvous (every rank's interpreter started and torch imported) on a loaded machine: far longer
# than any wait of a running exchange, so it gets a bound of its own.
RENDEZVOUS_S_MAX = 120.0


def _store(spec: RunSpec, rank: int):
    """The rendezvous store: tcp://host:port from the launcher, or torchrun's MASTER_ADDR/PORT (env://)."""
    if spec.init_method.startswith("tcp://"):
        host, port = spec.init_method[len("tcp://"):].rsplit(":", 1)
    else:
        host, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
        if os.environ.get("TORCHELASTIC_RUN_ID"):
            port = str(int(port) + 1)  # torchrun's agent holds MASTER_PORT's store; ours is beside it
    return dist.TCPStore(host, int(port), spec.setting.cp, rank == 0, timeout=datetime.timedelta(seconds=RENDEZVOUS_S_MAX))


def harness_timeout_s(window_s: float) -> float:
    return 2 * window_s + 5.0


def init_groups(spec: RunSpec, rank: int):
    """Once per process: the device, the implementation's group (the default group: gloo on CPU, NCCL
    on CUDA), the harness's own gloo group, and the positions table."""
    timeout = datetime.timedelta(seconds=spec.window_s)
    device = _device_for(spec, rank)
    # NCCL refuses two ranks on one GPU, so oversubscribed ranks use gloo (which takes CUDA tensors too).
    one_gpu_each = device.type == "cuda" and spec.setting.cp <= torch.cuda.device_count()
    backend = "nccl" if one_gpu_each else "gloo"
    dist.init_process_group(backend, store=_store(spec, rank), rank=rank, world_size=spec.setting.cp, timeout=timeout)
    # The harness's own waits outlast the implementation's: a rank that refused a batch waits at the
    # batch sync while a peer runs into its own barrier's timeout, and must still be there when it comes.
    hgroup = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=harness_timeout_s(spec.window_s)))
    return device, hgroup, _positions(spec, rank, hgroup)


def setup_rank(spec: RunSpec, rank: int, device: torch.device, hgroup, positions: torch.Tensor) -> Context:
    """Once per case: the Context with its pools mapped and prefilled."""
    knob = adv.knobs(spec.seed, spec.swarm)
    adversity = adv.Adversity(knob, rank, spec.setting.cp, spec.layers, positions, device, spec.delays and not spec.timing)
    ctx = Context(rank=rank, setting=spec.setting, layers=spec.layers, seed=spec.seed, device=device, group=dist.group.WORLD,
                  harness_group=hgroup, run=spec.run, positions=positions, adversity=adversity,
                  ipc_capable=rank != spec.ipc_fail_rank, timeout_s=spec.window_s,
                  dense_rows_max=max(_cpkv.layout_batch(spec.setting, b).slot_count for b in spec.batches) * spec.setting.page_size)
    ctx._publish(adv.STAGE_SETUP, arrivals=0)  # a new case's barrier phases start again (before the pools' barriers)
    _map_pools(ctx, spec)
    ctx._pool_guard = None if spec.timing or spec.capture_only else _guards.PoolGuard(ctx)
    return ctx


@dataclass
class LayerResult:
    mismatch: Optional[str] = None
    explained: Optional[str] = None


def _where_in_impl(error: BaseException) -> str:
    """file:line of the innermost frame outside the harness, so the line points at the user's code."""
    here = os.path.dirname(os.path.abspath(__file__))
    frames = traceback.extract_tb(error.__traceback__)
    for frame in reversed(frames):
        if not os.path.abspath(frame.filename).startswith(here) or "reference" in frame.filename:
            return f"{frame.filename}:{frame.lineno}"
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"


class BatchOutcome:
    def __init__(self) -> None:
        self.refused_at: Optional[int] = None
        self.wrote_before_refusal = False
        self.mismatches: List[str] = []
        self.contract: Optional[str] = None
        self.error: Optional[str] = None
        self.error_ns = 0  # when it raised: the first to raise is the one to name, the rest time out after it
        self.mismatch_kinds = 0  # the dense buffers (layer, kind) with a wrong byte (the lines: the first layer's)
        self.compose_s: List[float] = []
        self.host_syncs: List[Optional[int]] = []  # per layer: host synchronizations (CUDA; None elsewhere)
        self.compose_spans: List[tuple] = []  # per layer: (layer, begin ns, end ns) of compose_layer, CLOCK_MONOTONIC
        self.mismatch_at: Optional[tuple] = None  # (ns, layer) of the first mismatching layer's check
        self.limit_s: List[float] = []  # --time, per layer: the same bytes copied plainly (_timing.link_limit_s)
        self.attention: List[str] = []  # invariant 9 on this rank: the first wrong layer's line (plan, then output)
        self.attention_wrong_layers = 0  # layers whose plan (or output) was wrong
        self.plans: Dict[int, list] = {}  # per layer: the plan returned, as (n, 5) rows (the coverage check's input)

    def summary(self, ctx: Context) -> dict:
        return {"rank": ctx.rank, "refused_at": self.refused_at, "mismatches": self.mismatches, "contract": self.contract, "error": self.error, "error_ns": self.error_ns,
                "wrote_before_refusal": self.wrote_before_refusal, "events": ctx.events.log, "events_used": ctx.events.used,
                "compose_s": self.compose_s, "limit_s": self.limit_s, "host_syncs": self.host_syncs, "mismatch_kinds": self.mismatch_kinds,
                "arrivals": sum(1 for e in ctx.events.log if e[1] == "arrive"),
                "compose_spans": self.compose_spans, "mismatch_at": self.mismatch_at, "attention": self.attention,
                "attention_wrong_layers": self.attention_wrong_layers, "plans": self.plans}


def run_batch(ctx: Context, impl, spec: RunSpec, index: int, batch: _cpkv.Batch, oracle) -> BatchOutcome:
    outcome = BatchOutcome()
    ctx._previous_batch = ctx.batch  # a stale row of it is explained as such (_check._explained)
    ctx._begin_batch(index, batch)
    ctx.events.log = []
    timer = _probes.LayerTimer(ctx.device)
    if not spec.timing:
        _guards.poison_tails(ctx)
    for layer in range(spec.layers):
        ctx._begin_layer(layer)
        ctx._adversity.enter_layer(index, layer)
        try:
            with _probes.SyncCounter(ctx.device, enabled=not spec.timing) as syncs:
                timer.start()
                begin_ns = time.monotonic_ns()
                out = impl.compose_layer(ctx, layer)
            outcome.compose_s.append(timer.stop())  # on CUDA: after the rank's stream is done
            outcome.compose_spans.append((layer, begin_ns, time.monotonic_ns()))
            if spec.timing and spec.link_limit:
                outcome.limit_s.append(_link_limit(ctx, layer, timer))
            outcome.host_syncs.append(syncs.count)
        except StagingOverflow:
            outcome.refused_at = layer
            outcome.wrote_before_refusal = any(e[1] in ("write", "arrive") for e in ctx.events.log)
            break
        except Exception as error:  # reported after the batch sync, with every rank's events checked
            outcome.error_ns = time.monotonic_ns()
            outcome.error = f"rank {ctx.rank} batch {index} layer {layer} raised in compose_layer: {_first_line(error)} (at {_where_in_impl(error)})"
            return outcome
        if not spec.timing:
            check_one_layer(ctx, oracle, index, layer, out, outcome, spec)
    impl.end_batch(ctx)
    if ctx._pool_guard is not None:
        outcome.contract = outcome.contract or ctx._pool_guard.check(ctx, index)
    return outcome


def _link_limit(ctx: Context, layer: int, timer) -> float:
    """The layer's link limit, with every rank out of the layer before and none in the next during it."""
    dist.barrier(group=ctx._hgroup)
    seconds = _timing.link_limit_s(ctx, layer, timer)
    dist.barrier(group=ctx._hgroup)
    return seconds


def check_one_layer(ctx: Context, oracle, index: int, layer: int, out, outcome: BatchOutcome, spec: Optional[RunSpec] = None) -> None:
    ctx.events._add("layer_end")
    ctx._publish(adv.STAGE_CHECK)
    try:
        found = _check.check_layer(ctx, oracle, layer, out)
        past = _guards.tail_written(ctx, layer)
        if past:
            raise ContractError(past)
    except ContractError as error:
        outcome.contract = outcome.contract or f"rank {ctx.rank} batch {index} layer {layer}: {error}"
        found = []
    outcome.mismatch_kinds += len(found)
    if found and not outcome.mismatches:
        outcome.mismatches = found
        outcome.mismatch_at = (time.monotonic_ns(), layer)
    try:
        check_attention(ctx, oracle, layer, out, outcome, spec, bytes_right=not found)
    except ContractError as error:
        outcome.contract = outcome.contract or f"rank {ctx.rank} batch {index} layer {layer}: {error}"


def check_attention(ctx: Context, oracle, layer: int, out, outcome: BatchOutcome, spec: Optional[RunSpec], bytes_right: bool) -> None:
    """Invariant 9 on this layer: the plan compose_layer returned (if any) against the model's
    checker, and with --attention-output (where the layer's bytes are right: wrong bytes are already
    invariant 6) the reference attention over it against the single device."""
    plan = _check.attention_plan(out)
    if plan is None:
        if spec is not None and spec.require_attention:
            raise ContractError('--require-attention: compose_layer returned no "attention" plan (PROTOCOL.md section 11)')
        return
    outcome.plans[layer] = [tuple(row) for row in plan.tolist()]
    lines = [_check.plan_line(ctx, layer, plan)]
    if spec is not None and spec.attention_output and bytes_right:
        dense = _check.outputs(ctx, layer, out)[ctx.kinds_on(layer)[0]]
        lines.append(_check.attention_output_line(ctx, oracle, layer, dense, plan))
    lines = [line for line in lines if line]
    if lines:
        outcome.attention_wrong_layers += 1
        outcome.attention = outcome.attention or lines  # the first wrong layer's lines: the plan's, the output's


def _batch_sync(ctx: Context, spec: RunSpec, index: int, outcome: BatchOutcome, replay, reporter: Reporter) -> List[bool]:
    """Every rank's summary to every rank; rank 0 runs the batch-level checks and reports.
    Returns [stop, every rank composed every layer]."""
    ctx._publish(adv.STAGE_BATCH_SYNC)
    summaries: List[Any] = [None] * ctx.cp
    dist.all_gather_object(summaries, outcome.summary(ctx), group=ctx._hgroup)
    verdict = [False, False]
    if ctx.rank == 0:
        declared = None if ctx.no_staging else ctx.declared_staging_slots or ctx.staging_slots  # None: no staging (section 12)
        findings = [s["contract"] for s in summaries if s["contract"]]
        raised = [s["error"] for s in sorted(summaries, key=lambda s: s["error_ns"]) if s["error"]]
        findings += _check.overflow_findings(index, summaries, ctx.layout.current_pages_total, declared)
        findings += replay.replay(index, summaries)
        coverage = _check.coverage_findings(index, ctx.batch, summaries)
        findings += [line for s in summaries for line in s["attention"]] + coverage
        mismatches = [line for s in summaries for line in s["mismatches"]]
        record = {"mismatches": mismatches, "findings": findings, "raised": raised,
                  "refused": [s["refused_at"] is not None for s in summaries],
                  "current_pages_total": ctx.layout.current_pages_total, "declared_staging_slots": declared,
                  "events": sum(len(s["events"]) for s in summaries), "attention_coverage": coverage}
        for key in ("compose_s", "limit_s", "host_syncs", "mismatch_kinds", "arrivals", "attention_wrong_layers"):
            record[key] = [s[key] for s in summaries]  # one entry per rank
        reporter.send("batch", index, record)
        if spec.timeline:
            _timeline.append(spec.timeline, _timeline.batch_lines(index, summaries))
        verdict = [bool(findings or mismatches or raised), all(len(s["compose_s"]) == spec.layers for s in summaries)]
    dist.broadcast_object_list(verdict, src=0, group=ctx._hgroup)
    return verdict


def _warm_up(ctx: Context, impl, spec: RunSpec) -> Optional[int]:
    """The first batch from capture_from on that the implementation composes (every layer, eagerly,
    unchecked): its index, or None when it refuses every one."""
    for index in range(spec.capture_from, len(spec.batches)):
        ctx._begin_batch(index, spec.batches[index])
        try:
            for layer in range(spec.layers):
                ctx._begin_layer(layer)
                impl.compose_layer(ctx, layer)
        except StagingOverflow:
            continue
        impl.end_batch(ctx)
        torch.cuda.synchronize(ctx.device)
        return index
    return None


def run_capture_case(spec: RunSpec, rank: int, groups, reporter: Reporter) -> None:
    """CUDA: whether each layer of one batch can be captured into a CUDA graph, in rank processes
    whose sync-counting trace hooks were never switched on (see _probes.try_capture): set up, run the
    batch once (the warm-up a capture needs), then capture each layer (events and delays off); rank 0
    reports every rank's answer. A warm-up that raises is that rank's answer for every layer."""
    started = time.monotonic()
    ctx = setup_rank(spec, rank, *groups)
    impl = make_impl(spec)
    impl.setup(ctx)
    ctx.events.enabled, ctx._adversity.enabled = False, False
    index: Optional[int] = None
    try:
        index = _warm_up(ctx, impl, spec)
        verdicts = _probes.capture_layers(ctx, impl, spec.layers) if index is not None else []
    except Exception as error:  # the warm-up itself failed: nothing was captured
        verdicts = [f"no: the warm-up run raised {_first_line(error)} (at {_where_in_impl(error)})"] * spec.layers
    everyone: List[Any] = [None] * ctx.cp
    dist.all_gather_object(everyone, (index, verdicts), group=ctx._hgroup)
    if rank == 0:
        reporter.send("capture", next((i for i, _ in everyone if i is not None), None), [v for _, v in everyone])
    ctx._publish(adv.STAGE_TEARDOWN)
    impl.teardown(ctx)
    dist.barrier(group=ctx._hgroup)
    ctx._publish(adv.STAGE_DONE)
    reporter.send("done", rank, time.monotonic() - started)


def _event_judges(spec: RunSpec):
    """Rank 0's batch-level event checks: the state checker's replay, then happens-before."""
    return _happens_before.Judges(_check.EventReplay(spec.setting, spec.layers, spec.batches), spec.setting.cp)


def run_case(spec: RunSpec, rank: int, groups, reporter: Reporter) -> None:
    started = time.monotonic()
    ctx = setup_rank(spec, rank, *groups)
    impl = make_impl(spec)
    impl.setup(ctx)
    ctx.events.enabled = not spec.timing
    replay = _event_judges(spec) if rank == 0 else None
    stop, composed = False, None
    for index, batch in enumerate(spec.batches):
        oracle = _cpkv.conformance.ByteOracle(spec.setting, batch)
        outcome = run_batch(ctx, impl, spec, index, batch, oracle)
        if outcome.error:  # the launcher names it now, not when the peers' waits on this rank time out
            reporter.send("raising", rank, outcome.error, outcome.error_ns)
        stop, everyone_composed = _batch_sync(ctx, spec, index, outcome, replay, reporter)
        composed = (index, batch) if everyone_composed else composed
        if stop:
            break
    if ctx.device.type == "cuda" and not spec.timing and not stop and composed is not None and rank == 0:
        reporter.send("capturable", composed[0])  # the launcher probes it in fresh ranks (run_capture_case)
    ctx._publish(adv.STAGE_TEARDOWN)
    impl.teardown(ctx)
    dist.barrier(group=ctx._hgroup)  # every rank is out of the case before its memory goes
    ctx._publish(adv.STAGE_DONE)
    reporter.send("done", rank, time.monotonic() - started)


# A session's rank waits this long for its next case before it gives up (the launcher went away
# without closing the session).
SESSION_IDLE_S_MAX = 600.0


def drive(cases, rank: int, reporter: Reporter) -> None:
    """Every case in turn over one set of process groups (a session: the processes start once).
    cases: a list, or a queue the launcher feeds (a persistent session; None ends it)."""
    source = iter(cases) if isinstance(cases, list) else iter(lambda: cases.get(timeout=SESSION_IDLE_S_MAX), None)
    groups = None
    for case, spec in enumerate(source):
        groups = groups or init_groups(spec, rank)
        reporter.case = case
        (run_capture_case if spec.capture_only else run_case)(spec, rank, groups, reporter)


def end_groups() -> None:
    """Every process group of this rank destroyed (the implementation's and the harness's), where
    any was made: a group left to the interpreter's exit can abort it (gloo's threads)."""
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:
            pass


def rank_main(rank: int, specs, queue, body=None) -> None:
    """The entry of a spawned rank: exit 0 when it ran to the end, 1 when the implementation (or a
    peer) failed, 2 when the input is bad; the failure goes to the launcher as one located line.
    body: what the rank runs (default drive; bench/conformance_overhead.py passes its own loop)."""
    reporter = Reporter(queue)
    code = 0
    try:
        (body or drive)(specs, rank, reporter)
    except ContractError as error:
        reporter.send("error", rank, "contract", str(error), "", time.monotonic_ns())
        code = 2 if str(error).startswith("--") else 1
    except BaseException as error:  # the implementation raised, called sys.exit, or a wait timed out: named, located
        # Each failure report carries when it was raised: of two ranks that reported, the first is named
        # (the launcher: a peer's raise after the first rank exited is its consequence).
        reporter.send("error", rank, "raised", _first_line(error), _where_in_impl(error), time.monotonic_ns())
        code = 1
    finally:
        end_groups()
    sys.stdout.flush()
    if queue is not None:
        queue.close()
        queue.join_thread()  # the reports are in the pipe before the process goes (a pipe's send is synchronous)
    _lifeline.end_rank()  # what the implementation started (at import, in compose_layer, detached) goes with the rank
    os._exit(code)  # no atexit handler may wait on a peer that is gone

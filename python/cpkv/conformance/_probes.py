"""What the harness measures about a layer besides its bytes: host synchronizations, CUDA-graph
capturability and the compose time.

Host synchronizations (CUDA only) are counted with PyTorch's GPU trace hooks
(``torch.cuda._gpu_trace``: device, stream and event synchronization callbacks, fired from c10's own
synchronizing calls). On PyTorch 2.11 / CUDA 13 (one H200, 2026-12-02) they fire once for each of
``torch.cuda.synchronize()``, ``Stream.synchronize()``, ``Event.synchronize()``, ``.item()``,
``.cpu()``, ``.tolist()``, ``int(t)``, ``nonzero()``, boolean-mask indexing and a pageable host-to-device
copy, and never for a kernel launch; torch's sync debug mode, used before, missed the first and the
third and warned twice for ``.item()``. The hooks are private API: where a torch lacks them the
count is "n/a". Once switched on they stay on in the process (torch has no switch back), so a
``--time`` run never switches them on, and the CUDA-graph capture probe runs in rank processes of
its own that never switch them on (_rank.run_capture_case).
"""

from __future__ import annotations

import contextlib
import time
from typing import List, Optional

import torch

# While a capture attempt's peers may be waiting at the implementation's own barrier for a rank whose
# capture already failed, their waits are bounded by this instead of the run's window.
CAPTURE_WAIT_S = 2.0


class _Hooks:
    """The process's GPU trace hooks: counting only between start() and stop()."""

    installed = False
    available: Optional[bool] = None
    counting = False
    count = 0

    @classmethod
    def install(cls) -> bool:
        if cls.available is None:
            try:
                import torch.cuda._gpu_trace as trace

                for register in (trace.register_callback_for_device_synchronization, trace.register_callback_for_stream_synchronization,
                                 trace.register_callback_for_event_synchronization):
                    register(cls._seen)
                torch._C._activate_gpu_trace()
                cls.available = True
            except (ImportError, AttributeError):
                cls.available = False
        return bool(cls.available)

    @classmethod
    def _seen(cls, *_ignored) -> None:
        if cls.counting:
            cls.count += 1


class SyncCounter:
    """`with SyncCounter(device) as c: ...` then c.count: the host synchronizations inside, or None
    (not CUDA, or a torch without the trace hooks)."""

    def __init__(self, device: torch.device, enabled: bool = True) -> None:
        self.on = enabled and device.type == "cuda" and _Hooks.install()
        self.count: Optional[int] = None

    def __enter__(self) -> "SyncCounter":
        if self.on:
            _Hooks.count, _Hooks.counting = 0, True
        return self

    def __exit__(self, *exc) -> None:
        if self.on:
            _Hooks.counting = False
            self.count = _Hooks.count


@contextlib.contextmanager
def uncounted():
    """Synchronizations the harness makes inside a layer on the implementation's behalf (an event
    hook's copy of its slots) are not counted against it."""
    counting, _Hooks.counting = _Hooks.counting, False
    try:
        yield
    finally:
        _Hooks.counting = counting


class LayerTimer:
    """A layer's compose time: CUDA events on the rank's stream (CUDA), perf_counter (CPU). stop()
    waits for the stream on CUDA, as the harness does before it checks the layer."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.begin, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        if self.cuda:
            self.begin.record(torch.cuda.current_stream(self.device))
        self.started = time.perf_counter()

    def stop(self) -> float:
        """Seconds."""
        if not self.cuda:
            return time.perf_counter() - self.started
        self.end.record(torch.cuda.current_stream(self.device))
        self.end.synchronize()
        return self.begin.elapsed_time(self.end) / 1e3


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def try_capture(ctx, impl, layer: int) -> str:
    """'yes', or 'no: <the first line of the first exception>': compose_layer of `layer` captured
    into a CUDA graph on a side stream (after a warm-up run of the batch; the graph is not replayed).
    The reason is compose_layer's own exception when it raised, else capture_end's. Only in a process
    whose trace hooks were never switched on (run_capture_case): once on, torch calls them from every
    allocation and synchronization, inside the capture too, and a hook that runs while the capture's
    exception is pending fails ('cuda trace hook execution failed', seen on the H200) and can take
    the implementation's reason with it."""
    if _Hooks.available:
        return "no: not probed (the sync-counting trace hooks are on in this process)"
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream(ctx.device)
    side.wait_stream(torch.cuda.current_stream(ctx.device))
    torch.cuda.synchronize(ctx.device)
    reason: Optional[BaseException] = None
    with torch.cuda.stream(side):
        graph.capture_begin()
        try:
            impl.compose_layer(ctx, layer)
        except Exception as error:  # whatever the implementation raised first is the answer
            reason = error
        finally:
            try:
                graph.capture_end()  # ends the capture even when it was invalidated
            except Exception as error:
                reason = reason or error
    torch.cuda.synchronize(ctx.device)
    return "yes" if reason is None else f"no: {_first_line(reason)}"


def capture_layers(ctx, impl, layers: int) -> List[str]:
    """try_capture for every layer of the batch the ctx holds, the implementation's waits bounded
    by CAPTURE_WAIT_S meanwhile."""
    window_s = ctx.timeout_s
    ctx.timeout_s = min(window_s, CAPTURE_WAIT_S)
    try:
        verdicts = []
        for layer in range(layers):
            ctx._begin_layer(layer)
            ctx._warm(layer)  # the harness's helpers copy from the host once; the capture finds them made
            verdicts.append(try_capture(ctx, impl, layer))
        return verdicts
    finally:
        ctx.timeout_s = window_s


def summarize_capture(per_rank: List[List[str]]) -> List[str]:
    """Per layer: 'yes' when every rank captured it, else the first rank's 'no: ...' (named)."""
    out = []
    for layer in range(max((len(r) for r in per_rank), default=0)):
        noes = [(rank, v[layer]) for rank, v in enumerate(per_rank) if layer < len(v) and v[layer] != "yes"]
        out.append("yes" if not noes else f"{noes[0][1]} (rank {noes[0][0]})")
    return out


def percentile(values: List[float], fraction: float) -> float:
    """The nearest-rank percentile (fraction in (0, 1]) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, int(-(-fraction * len(ordered) // 1)))
    return ordered[min(rank, len(ordered)) - 1]

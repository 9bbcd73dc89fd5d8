"""The harness's checks: every dense byte of every layer against the plain oracle, where the tensor
lives, and the batch-level checks over every rank's summary (overflow verdicts, the simulator's
state checker replayed over the implementation's events).

A wrong byte is located (rank, batch, layer, kind, slot, row, byte: the simulator's mismatch line)
and explained: the C++ side searches the batch's rows of every layer for the one the wrong bytes
are (another token's row, another layer's, zeros, staging poison).
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional

import numpy as np
import torch
import torch.utils.dlpack

from .. import _cpkv
from .. import attention as _attention
from . import _probes
from ._context import Context, ContractError


def finding_line(invariant: int, detail: str, rank: int = -1, batch: int = -1, layer: int = -1) -> str:
    """A finding of these checks in the one shape every front end prints (harness violation_line):
    'invariant 3 (overflow determinism): rank 1 batch 0: detail'."""
    return _cpkv.violation_line(invariant, rank=rank, batch=batch, layer=layer, detail=detail)


def _foreign_array(value) -> bool:
    return hasattr(value, "__dlpack__") or hasattr(value, "__cuda_array_interface__") or hasattr(value, "__array_interface__")


def _as_dense(ctx: Context, kind: str, tensor) -> torch.Tensor:
    """The output of one kind as (rows, row_bytes) uint8 where it lives; ContractError if it is not one."""
    rows, row_bytes = ctx.dense_rows(), ctx.row_bytes[kind]
    if not isinstance(tensor, torch.Tensor):
        if _foreign_array(tensor):
            tensor = torch.as_tensor(tensor) if not hasattr(tensor, "__dlpack__") else torch.utils.dlpack.from_dlpack(tensor)
        else:
            raise ContractError(f"kind {kind}: compose_layer returned {type(tensor).__name__}, expected a torch.uint8 tensor")
    if tensor.dtype != torch.uint8:
        raise ContractError(f"kind {kind}: dtype {tensor.dtype}, expected torch.uint8 ({rows}, {row_bytes})")
    if tensor.numel() != rows * row_bytes:
        raise ContractError(f"kind {kind}: shape {tuple(tensor.shape)} ({tensor.numel()} bytes), expected ({rows}, {row_bytes}) = "
                            f"{rows * row_bytes} bytes")
    if tensor.device != ctx.device:
        raise ContractError(f"kind {kind}: on {tensor.device}, expected {ctx.device}")
    return tensor.reshape(rows, row_bytes)


def outputs(ctx: Context, layer: int, out) -> Dict[str, torch.Tensor]:
    """The dense buffers of the layer's kinds as (rows, row_bytes) uint8; ContractError if one is missing or wrong."""
    if not isinstance(out, Mapping):
        raise ContractError(f"compose_layer returned {type(out).__name__}, expected a dict of kind name -> dense tensor")
    wanted = ctx.kinds_on(layer)
    missing = [k for k in wanted if k not in out]
    if missing:
        raise ContractError(f"compose_layer returned no dense buffer of {', '.join(missing)} (layer {layer} has {', '.join(wanted)})")
    return {kind: _as_dense(ctx, kind, out[kind]) for kind in wanted}


def mismatch_line(rank: int, batch: int, layer: int, kind: str, slot: int, row: int, byte: int, expected: int, actual: int,
                  wrong: int) -> str:
    """The simulator's line (model::Mismatch::describe) for a difference found on the device (a GPU
    tensor's first wrong byte, found without copying the buffer to the host)."""
    found = _cpkv.Mismatch(wrong_bytes=wrong, slot=slot, row=row, byte=byte, expected=expected, actual=actual)
    return found.describe(rank, layer, kind, batch)


def _check_cpu(ctx: Context, oracle, layer: int, kind: str, dense: torch.Tensor) -> Optional[str]:
    found = oracle.check(dense.contiguous().numpy(), ctx.setting, ctx.seed, layer, kind)
    if found is None:
        return None
    line = found.describe(ctx.rank, layer, kind, ctx.batch_index)
    return _explained(ctx, layer, kind, line, found.slot, found.row, found.byte, dense[found.slot * ctx.setting.page_size + found.row])


def _check_cuda(ctx: Context, oracle, layer: int, kind: str, dense: torch.Tensor, expected_cache: dict) -> Optional[str]:
    key = (ctx.batch_index, layer, kind)
    if key not in expected_cache:
        expected_cache.clear()
        expected_cache[key] = torch.from_numpy(oracle.dense(ctx.setting, ctx.seed, layer, kind)).to(ctx.device)
    expected = expected_cache[key]
    wrong = dense != expected
    wrong_count = int(wrong.sum())
    if wrong_count == 0:
        return None
    first = int(wrong.reshape(-1).nonzero()[0])
    row_bytes = ctx.row_bytes[kind]
    flat_row, byte = divmod(first, row_bytes)
    slot, row = divmod(flat_row, ctx.setting.page_size)
    actual_row = dense[flat_row].cpu()
    line = mismatch_line(ctx.rank, ctx.batch_index, layer, kind, slot, row, byte, int(expected[flat_row, byte]), int(actual_row[byte]),
                         wrong_count)
    return _explained(ctx, layer, kind, line, slot, row, byte, actual_row)


def _explained(ctx: Context, layer: int, kind: str, line: str, slot: int, row: int, byte: int, actual_row: torch.Tensor) -> str:
    why = _cpkv.conformance.explain_row(ctx.setting, ctx.batch, ctx.seed, layer, kind, slot, row, byte,
                                        bytes(actual_row.cpu().contiguous().numpy().tobytes()),
                                        previous=getattr(ctx, "_previous_batch", None), batch_index=ctx.batch_index)
    return f"{line}; the wrong row is {why}"


def check_layer(ctx: Context, oracle, layer: int, out, expected_cache: Optional[dict] = None) -> List[str]:
    """Every dense byte of the layer's outputs against the oracle: one located line per wrong kind,
    saying, where the implementation checked its current rows first (ctx.check_current), whether the
    gather or the dense assembly was wrong."""
    lines = []
    for kind, dense in outputs(ctx, layer, out).items():
        if ctx.device.type == "cuda":
            line = _check_cuda(ctx, oracle, layer, kind, dense, expected_cache if expected_cache is not None else {})
        else:
            line = _check_cpu(ctx, oracle, layer, kind, dense)
        line = _with_current_rows(ctx, layer, kind, line)
        if line:
            lines.append(line)
    return lines


# --- the check before the dense assembly (ctx.check_current, section 12's exchanges) ---------------

def current_rows_line(ctx: Context, kind: str, rows) -> Optional[str]:
    """ctx.check_current: the current rows in the batch's token order against the specification's;
    None when right, else the first wrong row, located (token, the rank and all-gather row it comes
    from) and explained."""
    tokens = ctx._token_map()
    total, row_bytes = tokens.request.size, ctx.row_bytes[kind]
    if not isinstance(rows, torch.Tensor) or rows.dtype != torch.uint8 or rows.numel() != total * row_bytes:
        what = f"{rows.dtype} {tuple(rows.shape)}" if isinstance(rows, torch.Tensor) else type(rows).__name__
        raise ContractError(f"ctx.check_current({kind!r}): {what}, expected torch.uint8 ({total}, {row_bytes}): the batch's current rows in token order")
    with _probes.uncounted():  # the harness's own copy, not the implementation's synchronization
        actual = rows.detach().reshape(total, row_bytes).cpu()
    expected = torch.empty((total, row_bytes), dtype=torch.uint8)
    _cpkv.conformance.fill_current_rows(expected.numpy(), ctx.setting, ctx.seed, ctx.layer, kind, tokens.request.tolist(), tokens.token.tolist())
    wrong_rows = (actual != expected).any(dim=1).nonzero().reshape(-1)
    if wrong_rows.numel() == 0:
        return None
    i = int(wrong_rows[0])
    byte = int((actual[i] != expected[i]).nonzero()[0])
    request, token = int(tokens.request[i]), int(tokens.token[i])
    owner = next(k for k, mine in enumerate(tokens.per_rank) if i in mine["order"])
    position = int(np.nonzero(tokens.per_rank[owner]["order"] == i)[0][0])
    slot, row = divmod(int(tokens.dense_row[i]), ctx.setting.page_size)
    why = _explained(ctx, ctx.layer, kind, "", slot, row, byte, actual[i])[len("; the wrong row is "):]
    return (f"current row {i} in token order (request {request} token {token}, rank {owner}'s all-gather row {position}) byte {byte}: "
            f"expected 0x{int(expected[i, byte]):02x} got 0x{int(actual[i, byte]):02x} ({wrong_rows.numel()} wrong rows of {total}); "
            f"the wrong row is {why}")


def _with_current_rows(ctx: Context, layer: int, kind: str, line: Optional[str]) -> Optional[str]:
    if (layer, kind) not in ctx._current_checks:
        return line
    before = ctx._current_checks[(layer, kind)]
    if before is None:
        return None if line is None else (f"{line}; the current rows in token order were right before the dense assembly "
                                          f"(ctx.check_current), so the assembly is wrong")
    if line is None:
        return (f"current rows: rank {ctx.rank} batch {ctx.batch_index} layer {layer} kind {kind}: wrong before the dense assembly "
                f"(ctx.check_current), though the dense buffer is right: {before}")
    return f"{line}; the current rows in token order were already wrong before the dense assembly, so the gather is wrong: {before}"


# --- the attention plan (invariant 9, PROTOCOL.md section 11) --------------------------------------

PLAN_FORM = "an int64 tensor (n, 5) [request, q_base, q_len, kv_len, k_base] or a list of cpkv.RaggedSegment"


def attention_plan(out) -> Optional[np.ndarray]:
    """compose_layer's "attention" value as an (n, 5) int64 host array (a CUDA tensor is copied to
    the host), None when it returned none; ContractError (one line) when it is not a plan."""
    if not isinstance(out, Mapping) or "attention" not in out:
        return None
    value = out["attention"]
    if not isinstance(value, (torch.Tensor, list, tuple)) and _foreign_array(value):
        value = torch.as_tensor(value) if not hasattr(value, "__dlpack__") else torch.utils.dlpack.from_dlpack(value)
    if isinstance(value, torch.Tensor):
        if value.dtype != torch.int64 or value.dim() != 2 or value.shape[1] != 5:
            raise ContractError(f"attention: dtype {value.dtype} shape {tuple(value.shape)}, expected {PLAN_FORM}")
        with _probes.uncounted():  # the harness's copy, not the implementation's synchronization
            return value.detach().cpu().numpy().copy()
    if isinstance(value, (list, tuple)):
        bad = next((i for i, s in enumerate(value) if not isinstance(s, _cpkv.RaggedSegment)), None)
        if bad is not None:
            raise ContractError(f"attention: item {bad} is a {type(value[bad]).__name__}, expected {PLAN_FORM}")
        return _attention.as_array(list(value))
    raise ContractError(f"attention: compose_layer returned {type(value).__name__}, expected {PLAN_FORM}")


def plan_line(ctx: Context, layer: int, plan: np.ndarray) -> Optional[str]:
    """Invariant 9 on this rank and layer: the model's checker's line, located, or None."""
    found = _cpkv.check_attention_plan(ctx.setting, ctx.batch, ctx.rank, plan, ctx.query_split)
    return None if found is None else finding_line(9, found.detail(), rank=ctx.rank, batch=ctx.batch_index, layer=layer)


def coverage_findings(index: int, batch: _cpkv.Batch, summaries: List[dict]) -> List[str]:
    """Invariant 9 over the group, on the first layer on which every rank returned a plan and some
    current token is a query on no rank or on two."""
    layers = set.intersection(*(set(s["plans"]) for s in summaries)) if summaries else set()
    for layer in sorted(layers):
        plans = [np.asarray(s["plans"][layer], dtype=np.int64).reshape(-1, 5) for s in summaries]
        found = _cpkv.check_attention_coverage(batch, plans)
        if found is not None:
            finding, rank = found
            return [finding_line(9, finding.detail(), rank=rank, batch=index, layer=layer)]
    return []


def attention_output_line(ctx: Context, oracle, layer: int, dense: torch.Tensor, plan: np.ndarray) -> Optional[str]:
    """--attention-output: cpkv.attention.reference over this rank's composed buffer (the layer's
    first kind: the main KV, what attention reads) with its plan, against the single-device result
    of the whole batch over the oracle's buffer (cpkv.attention.output_difference). None when every
    query's row is equal bit for bit."""
    kind = ctx.kinds_on(layer)[0]
    expected = torch.from_numpy(oracle.dense(ctx.setting, ctx.seed, layer, kind)).to(ctx.device).reshape(dense.shape)
    with _probes.uncounted():  # the harness's own work, not the implementation's synchronization
        found = _attention.output_difference(ctx.setting, ctx.batch, dense, expected, plan)
    if found is None:
        return None
    return finding_line(9, f"attention output (kind {kind}): {found}", rank=ctx.rank, batch=ctx.batch_index, layer=layer)


# --- the batch-level checks, on rank 0 over every rank's summary -----------------------------------

def overflow_findings(batch: int, summaries: List[dict], current_pages_total: int, declared: Optional[int]) -> List[str]:
    """Invariant 3: an overflowing batch is refused by every rank on its first layer before any write or
    wait; a batch that fits is refused by none. declared None: the implementation has no staging
    (ctx.declare_staging(None), section 12), so nothing overflows and a refusal is the finding."""
    if declared is None:
        return [finding_line(3, "refused the batch, but it declared no staging (ctx.declare_staging(None)): overflow does not apply to an "
                             "exchange without staging (PROTOCOL.md section 12)", rank=s["rank"], batch=batch)
                for s in summaries if s["refused_at"] is not None]
    overflow = current_pages_total > declared
    verdict = _cpkv.overflow_verdict(current_pages_total, declared).describe()
    lines = []
    for s in summaries:
        if overflow and s["refused_at"] != 0:
            what = "composed every layer" if s["refused_at"] is None else f"refused only at layer {s['refused_at']}"
            lines.append(finding_line(3, f"{what}, but the batch overflows the declared staging ({verdict})", rank=s["rank"], batch=batch))
        elif not overflow and s["refused_at"] is not None:
            lines.append(finding_line(3, f"refused a batch that fits ({verdict})", rank=s["rank"], batch=batch))
        elif overflow and s["wrote_before_refusal"]:
            lines.append(finding_line(3, f"wrote staging or arrived at a barrier before refusing ({verdict})", rank=s["rank"], batch=batch))
    return lines


class EventReplay:
    """The simulator's state checker (sim/checkers.hpp) over the merged events of every rank."""

    def __init__(self, setting: _cpkv.Setting, layers: int, batches: List[_cpkv.Batch]) -> None:
        layouts = [_cpkv.layout_batch(setting, b) for b in batches]
        slot_max = max(1, max(l.slot_count for l in layouts))
        current_max = max(1, max(l.current_pages_total for l in layouts), _cpkv.staging_capacity(setting).staging_slots)
        self.checker = _cpkv.conformance.EventChecker(setting, layers, slot_max, current_max)
        self.reported = 0

    def replay(self, batch: int, summaries: List[dict]) -> List[str]:
        if not any(s["events_used"] for s in summaries):
            return []
        self.checker.begin_batch(batch)
        events = sorted(e for s in summaries for e in s["events"])
        for _, what, rank, layer, a, b, c in events:
            self._dispatch(what, rank, layer, a, b, c)
        lines = self.checker.violations()[self.reported:]
        self.reported += len(lines)
        return lines + _arrival_counts(batch, summaries) + _collective_agreement(batch, summaries)

    def _dispatch(self, what: str, rank: int, layer: int, a: int, b: int, c: int) -> None:
        if what == "layer_begin":
            self.checker.layer_begin(rank, layer)
        elif what == "layer_end":
            self.checker.layer_end(rank, layer)
        elif what == "write":
            self.checker.write(rank, layer, a, b, bool(c))
        elif what == "read":
            self.checker.read(rank, layer, a, b, c)
        elif what == "token_write":
            self.checker.token_write(rank, layer, a)
        elif what == "arrive":
            self.checker.arrive(rank, layer)
        elif what == "passed":
            self.checker.passed(rank, layer, a)


def _collective_agreement(batch: int, summaries: List[dict]) -> List[str]:
    """Invariant 7 over events.collective: every rank enters the same collectives in the same order
    (a rank that issues another one, or one more, leaves the group mismatched: section 7)."""
    issued = {s["rank"]: [(e[3], e[5]) for e in s["events"] if e[1] == "collective_enter"] for s in summaries if s["events_used"]}
    if not any(issued.values()):
        return []
    first = min(issued)
    for rank, calls in sorted(issued.items()):
        for call, (mine, theirs) in enumerate(zip(issued[first], calls), start=1):
            if mine != theirs:
                return [finding_line(7, f"collective {call}: rank {first} entered it on layer {mine[0]}, rank {rank} entered another "
                                        f"(layer {theirs[0]}, a different name) there", batch=batch)]
        if len(calls) != len(issued[first]):
            return [finding_line(7, f"rank {first} entered {len(issued[first])} collectives, rank {rank} {len(calls)}", batch=batch)]
    return []


def _arrival_counts(batch: int, summaries: List[dict]) -> List[str]:
    # Quiescence at the end of the batch: every rank arrived at as many barriers (sim on_quiescence).
    counts = {s["rank"]: sum(1 for e in s["events"] if e[1] == "arrive") for s in summaries if s["events_used"]}
    if len(set(counts.values())) <= 1:
        return []
    first = min(counts)
    for rank, count in sorted(counts.items()):
        if count != counts[first]:
            return [finding_line(4, f"barriers not drained at the batch's end: rank {first} arrived at {counts[first]} barriers, rank {rank} "
                                    f"at {count}", batch=batch)]
    return []

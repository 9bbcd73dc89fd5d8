"""cpkv.plan: the batch-logical plan of every batch, as `cpkv plan --json FILE` writes it.

Every number comes from the C++ model (layout_batch, staging_capacity, overflow_verdict,
batch_bytes_pulled); this module only arranges them in the command's JSON shape, and the
test suite checks the two agree on every sample trace.
"""

from __future__ import annotations

import os as _os
from typing import Any, Dict, List, Optional, Union

from . import _cpkv
from ._errors import InputError, TraceError


def _rank_bytes(rank: int, row: Optional[List[int]], layout=None, batch=None) -> Dict[str, Any]:
    """One rank's entry: its row by holder (its own entry is local, the others are pulled) and its
    attention plan (PROTOCOL.md section 11: the model's ragged index plan in the neutral form)."""
    if row is None:
        return {"rank": rank, "bytes_pulled_from": None, "local_bytes": None, "peer_bytes": None, "attention": None}
    segments = _cpkv.ragged_index_plan(layout, batch, rank).attention_segments()
    attention = [{"request": s.request, "q_base": s.q_base, "q_len": s.q_len, "kv_len": s.kv_len, "k_base": s.k_base} for s in segments]
    return {"rank": rank, "bytes_pulled_from": row, "local_bytes": row[rank], "peer_bytes": sum(row) - row[rank],
            "attention": attention}


def plan_batch(setting: _cpkv.Setting, batch: _cpkv.Batch, *, index: int = 0, rank: Optional[int] = None,
               variant: str = "staging_direct") -> Dict[str, Any]:
    """The plan of one batch as a dict: current_pages_total, slot_count, staging slots and source, the
    overflow verdict, the writers of each request's current pages, and per rank (or only `rank`) the
    bytes it reads from each rank over all layers (`bytes_pulled_from`, its own entry local),
    `local_bytes` (that entry), `peer_bytes` (the rest) and `attention` (its attention plan's
    segments); None for a rejected batch, which moves nothing.
    """
    if variant not in _cpkv.VARIANTS:
        raise InputError("variant", f"unknown variant '{variant}'")
    if rank is not None and not 0 <= rank < setting.cp:
        raise InputError("rank", f"{rank} is not a rank of the trace's cp = {setting.cp} group")
    layout = _cpkv.layout_batch(setting, batch)
    capacity = _cpkv.staging_capacity(setting)
    verdict = _cpkv.overflow_verdict(layout.current_pages_total, capacity.staging_slots)
    writers: List[List[int]] = [[] for _ in batch.requests]
    for page in layout.current:
        writers[page.request].append(page.writer)
    matrix = None if verdict.overflow else _cpkv.batch_bytes_pulled(setting, layout, variant)
    ranks = range(setting.cp) if rank is None else [rank]
    return {
        "batch": index,
        "requests": len(batch.requests),
        "current_pages_total": layout.current_pages_total,
        "slot_count": layout.slot_count,
        "staging_slots": capacity.staging_slots,
        "staging_source": capacity.source,
        "verdict": "overflow" if verdict.overflow else "ok",
        "verdict_detail": verdict.describe(),
        "writers": writers,
        "variant": variant,
        "layers": setting.layer_count,
        "ranks": [_rank_bytes(r, None if matrix is None else matrix[r], layout, batch) for r in ranks],
    }


def plan(path: Union[str, bytes, "_os.PathLike[str]"], *, batch: Optional[int] = None, rank: Optional[int] = None, variant: str = "staging_direct") -> List[Dict[str, Any]]:
    """The plan of every batch of a trace (or only `batch`), one dict per batch, equal to the objects
    `cpkv plan PATH --json FILE [--batch B] [--rank R] [--variant V]` writes to FILE (one a line).

    The whole trace is validated first, so a bad line anywhere raises cpkv.TraceError before any
    result; an impossible batch, rank or variant raises cpkv.InputError with the command's reason.
    """
    if variant not in _cpkv.VARIANTS:
        raise InputError("variant", f"unknown variant '{variant}'")
    for name, value in (("batch", batch), ("rank", rank)):
        if value is not None and value < 0:
            raise InputError(name, f"{value} is negative")
    with _cpkv._SpooledInput(path) as spooled:  # a pipe is copied once: it is read twice below
        try:
            return _plan_file(spooled.path, _os.fsdecode(path), batch, rank, variant)
        except TraceError as error:
            if error.file != _os.fsdecode(spooled.path):
                raise
            raise TraceError(_os.fsdecode(path), error.line, error.field, error.reason) from None


def _plan_file(read_path: bytes, name: str, batch: Optional[int], rank: Optional[int], variant: str) -> List[Dict[str, Any]]:
    reader = _cpkv.read_trace(read_path)
    batches = sum(1 for _ in reader)
    if rank is not None and rank >= reader.setting.cp:
        raise InputError("rank", f"{rank} is not a rank of the trace's cp = {reader.setting.cp} group")
    if batch is not None and batch >= batches:
        raise InputError("batch", f"{batch} is not in {name} ({batches} batches)")
    reader = _cpkv.read_trace(read_path)  # the second pass streams again: one batch in memory at a time
    out = []
    for index, each in enumerate(reader):
        if batch is None or index == batch:
            out.append(plan_batch(reader.setting, each, index=index, rank=rank, variant=variant))
    return out

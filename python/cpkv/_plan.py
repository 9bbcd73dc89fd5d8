"""cpkv.plan: the batch-logical plan of every batch, as `cpkv plan --json FILE` writes it.

Every number comes from the C++ model (layout_batch, staging_capacity, overflow_verdict,
batch_bytes_pulled, and for section 12's token-split variants token_split_plan); this module only
arranges them in the command's JSON shape, and the test suite checks the two agree on every
sample trace.
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
    attention = _segments(_cpkv.ragged_index_plan(layout, batch, rank).attention_segments())
    return {"rank": rank, "bytes_pulled_from": row, "local_bytes": row[rank], "peer_bytes": sum(row) - row[rank],
            "attention": attention}


def _segments(segments) -> List[Dict[str, int]]:
    return [{"request": s.request, "q_base": s.q_base, "q_len": s.q_len, "kv_len": s.kv_len, "k_base": s.k_base} for s in segments]


def _token_split_batch(setting: _cpkv.Setting, batch: _cpkv.Batch, layout, index: int, ranks, variant: str) -> Dict[str, Any]:
    """A token-split variant's batch (PROTOCOL.md section 12): no staging and no verdict; per rank its
    tokens as runs, the padded all-gather's bytes, the prefix pulls by owner, the model's row of bytes
    and the token split's attention plan."""
    t = _cpkv.token_split_plan(setting, layout, batch, variant)
    matrix = _cpkv.batch_bytes_pulled(setting, layout, variant)
    out = []
    for k in ranks:
        r, row = t.ranks[k], matrix[k]
        out.append({"rank": k, "tokens": [{"request": x.request, "first": x.first, "count": x.count, "step": x.step} for x in r.tokens],
                    "token_count": r.token_count, "padding_rows": r.padding_rows, "allgather_bytes": r.allgather_bytes,
                    "allgather_peer_bytes": r.allgather_peer_bytes, "prefix_pages_from": r.prefix_pages_from,
                    "prefix_bytes_from": r.prefix_bytes_from, "bytes_pulled_from": row, "local_bytes": row[k],
                    "peer_bytes": sum(row) - row[k], "attention": _segments(r.attention)})
    return {"batch": index, "requests": len(batch.requests), "current_pages_total": layout.current_pages_total,
            "slot_count": layout.slot_count, "staging_slots": None, "staging_source": None, "verdict": "no_staging",
            "verdict_detail": t.no_staging_detail, "writers": None, "variant": variant, "layers": setting.layer_count,
            "token_split": t.split, "tokens_total": t.tokens_total, "max_rank_tokens": t.max_rank_tokens,
            "allgather_rows": t.allgather_rows, "padding_rows": t.padding_rows, "allgathers": t.allgathers, "ranks": out}


def plan_batch(setting: _cpkv.Setting, batch: _cpkv.Batch, *, index: int = 0, rank: Optional[int] = None,
               variant: str = "staging_direct") -> Dict[str, Any]:
    """The plan of one batch as a dict: current_pages_total, slot_count, staging slots and source, the
    overflow verdict, the writers of each request's current pages, and per rank (or only `rank`) the
    bytes it reads from each rank over all layers (`bytes_pulled_from`, its own entry local),
    `local_bytes` (that entry), `peer_bytes` (the rest) and `attention` (its attention plan's
    segments); None for a rejected batch, which moves nothing.

    Under a token-split all-gather variant (``allgather_zigzag``, ``allgather_continuous``: PROTOCOL.md
    section 12) there is no staging: ``staging_slots``, ``staging_source`` and ``writers`` are None and
    ``verdict`` is ``"no_staging"``; the batch adds ``token_split``, ``tokens_total``,
    ``max_rank_tokens``, ``allgather_rows``, ``padding_rows`` and ``allgathers``, and each rank its
    ``tokens`` (runs of extend offsets in send order: request, first, count, step), ``token_count``,
    ``padding_rows``, ``allgather_bytes``, ``allgather_peer_bytes``, ``prefix_pages_from`` and
    ``prefix_bytes_from``, beside its row of bytes and the token split's ``attention``.
    """
    if variant not in _cpkv.VARIANTS:
        raise InputError("variant", f"unknown variant '{variant}'")
    if rank is not None and not 0 <= rank < setting.cp:
        raise InputError("rank", f"{rank} is not a rank of the trace's cp = {setting.cp} group")
    layout = _cpkv.layout_batch(setting, batch)
    ranks = range(setting.cp) if rank is None else [rank]
    if variant in _cpkv.TOKEN_SPLIT_VARIANTS:
        return _token_split_batch(setting, batch, layout, index, ranks, variant)
    capacity = _cpkv.staging_capacity(setting)
    verdict = _cpkv.overflow_verdict(layout.current_pages_total, capacity.staging_slots)
    writers: List[List[int]] = [[] for _ in batch.requests]
    for page in layout.current:
        writers[page.request].append(page.writer)
    matrix = None if verdict.overflow else _cpkv.batch_bytes_pulled(setting, layout, variant)
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

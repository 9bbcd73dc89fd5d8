"""cpkv.plan: the batch-logical plan of every batch, as `cpkv plan --json FILE` writes it.

Each batch's object is the command's own (harness::plan_json through the bindings: one builder of
the shape); this module only checks the options and reads the trace as the command does, and the
test suite checks the two agree on every sample trace.
"""

from __future__ import annotations

import os as _os
from typing import Any, Dict, List, Optional, Union

from . import _cpkv
from ._errors import InputError, TraceError


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
    return _cpkv.plan_json(setting, batch, index, rank, variant)


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

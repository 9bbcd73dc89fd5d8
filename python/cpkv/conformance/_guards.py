"""Writes outside the implementation's buffers: the memory the harness owns that an exchange may
read but never write, checked where it lives.

- The pool (PROTOCOL.md section 1: prefilled at each page's storage owner; the exchange reads it):
  each rank keeps a copy of its own slab of every kind from after the prefill and compares after
  every batch, so a write into any rank's slab (its own or a peer's, through the mapping) is named
  by the slab's owner, with the layer.
- The dense output buffers past this batch's rows (``ctx.dense_out`` hands out the first
  ``dense_rows()`` rows of a larger allocation): the rest is the poison byte at each batch's start
  and after each layer, so a kernel that runs past its rows is caught although every byte it was
  asked for is right.

Off with --time (nothing but the implementation is timed).
"""

from __future__ import annotations

from typing import Dict, List, Optional

import torch

from .. import _cpkv

POISON = _cpkv.conformance.POISON_BYTE


class PoolGuard:
    """A copy of this rank's pool slabs, taken once after the prefill (the slabs are compared with
    it after every batch: exact, and one pass over the memory)."""

    def __init__(self, ctx) -> None:
        self.saved: Dict[str, torch.Tensor] = {kind: ctx.pool[kind][ctx.rank].clone() for kind in ctx.kinds}

    def check(self, ctx, batch: int) -> Optional[str]:
        for kind, saved in self.saved.items():
            slab = ctx.pool[kind][ctx.rank]
            if torch.equal(slab, saved):
                continue
            changed = (slab != saved).reshape(slab.shape[0], -1).any(dim=1).nonzero().reshape(-1)
            layer = int(changed[0])
            saved.copy_(slab)  # one report per write
            return (f"rank {ctx.rank} batch {batch}: wrote outside its buffers: rank {ctx.rank}'s pool slab of {kind} changed "
                    f"on layer {layer} (the pool is read-only to the exchange: PROTOCOL.md section 1; any rank may "
                    f"have written it through its mapping)")
        return None


def poison_tails(ctx) -> None:
    """Every dense output buffer past this batch's rows: the poison byte."""
    for full in ctx._dense_out.values():
        full[ctx.dense_rows():].fill_(POISON)


def tail_written(ctx, layer: int) -> Optional[str]:
    """The first dense output buffer whose rows past this batch's were written, as one line."""
    rows = ctx.dense_rows()
    for kind, full in ctx._dense_out.items():
        tail = full[rows:]
        wrong = tail != POISON
        if bool(wrong.any()):
            first = int(wrong.reshape(-1).nonzero()[0])
            return (f"wrote outside its buffers: dense buffer of {kind} row {rows + first // tail.shape[1]} written past the "
                    f"batch's {rows} rows (ctx.dense_out hands out the first dense_rows() rows)")
    return None

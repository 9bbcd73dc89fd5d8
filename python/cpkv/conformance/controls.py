"""Controls for the harness's CUDA-graph capture probe: an exchange whose layers must read
"capturable" (PrecomputedGather) and the same exchange with one host synchronization per layer,
which must read "not capturable" with the synchronization's own error (SyncEachLayer).

A correct exchange at cp > 1 needs a wait on its peers' fills inside the layer: a device-side
barrier kernel in an engine, which plain torch ops do not have (the references wait on host flags,
and call torch.nonzero, so they are not capturable). At cp 1 there is no peer to wait for, so these
controls are cp 1 only: the prefix pages are gathered from the rank's own pool and the current rows
go straight into their dense slots (PROTOCOL.md section 5 with one rank: staging_direct's table has
2 entries, the pool and the rank's own current pages). Every index is made once per batch, in the
batch's first composed layer; after that compose_layer is device copies only (index_fill_,
index_select, index_copy_): no host synchronization, nothing the capture forbids.
"""

from __future__ import annotations

from typing import Dict, Optional

import torch

from ._context import Context


class PrecomputedGather:
    """cp 1 staging_direct with its indices precomputed per batch: capturable on CUDA."""

    sync_each_layer = False

    def __init__(self) -> None:
        self._batch: Optional[object] = None
        self._index: Dict[str, torch.Tensor] = {}

    def setup(self, ctx: Context) -> None:
        if ctx.cp != 1:
            raise ValueError(f"{type(self).__name__} is a cp 1 control (a capturable wait on peers needs a device-side barrier); "
                             f"this run has cp {ctx.cp}")
        ctx.declare_staging(ctx.staging_slots)

    def _indices(self, ctx: Context) -> Dict[str, torch.Tensor]:
        """Anchored on the batch object (section 5): the pool slots, their source pages, the current
        slots and the current rows' dense rows, on the device."""
        if self._batch is not ctx.batch:
            plan = ctx.plan().cpu()  # once per batch (a host copy: not in a captured layer)
            pool = torch.nonzero(plan[:, 0] == 0).reshape(-1)
            current = torch.nonzero(plan[:, 0] == 1).reshape(-1)
            self._index = {"pool_slots": pool.to(ctx.device), "pool_pages": plan[pool, 1].to(ctx.device),
                           "current_slots": current.to(ctx.device), "dest_row": ctx.page_inverse("dense")["dest_row"]}
            self._batch = ctx.batch
        return self._index

    def compose_layer(self, ctx: Context, layer: int) -> Dict[str, torch.Tensor]:
        if layer == 0 and ctx.layout.current_pages_total > ctx.staging_slots:
            raise ctx.StagingOverflow(f"batch {ctx.batch_index}: {ctx.layout.current_pages_total} current pages > "
                                      f"{ctx.staging_slots} staging slots")
        index = self._indices(ctx)
        out = {}
        for kind in ctx.kinds_on(layer):
            dense = ctx.dense_out(kind)
            paged = dense.view(-1, ctx.setting.page_size, ctx.row_bytes[kind])
            paged.index_fill_(0, index["current_slots"], 0)  # the unwritten tail of a current page is zero
            paged.index_copy_(0, index["pool_slots"], ctx.pool[kind][0][layer].index_select(0, index["pool_pages"]))
            dense.index_copy_(0, index["dest_row"], ctx.rows(kind))
            if self.sync_each_layer:
                dense[:1, :1].sum().item()  # the negative control: a host synchronization, as reading a count back makes
            out[kind] = dense
        return out

    def end_batch(self, ctx: Context) -> None:
        pass

    def teardown(self, ctx: Context) -> None:
        pass


class SyncEachLayer(PrecomputedGather):
    """PrecomputedGather plus one .item() per kind and layer: correct, and not capturable."""

    sync_each_layer = True

"""Misbehaving implementations for the harness's own tests (loaded by path, as a user's file is)."""

import time

import torch

from cpkv.conformance.reference import StagingDirect


class RaisesOnLayer1(StagingDirect):
    """A correct exchange that raises on layer 1 of batch 0 on rank 1."""

    def compose_layer(self, ctx, layer):
        if ctx.rank == 1 and ctx.batch_index == 0 and layer == 1:
            raise ValueError("engine bug: page table lookup failed")
        return super().compose_layer(ctx, layer)


class WrongDtype(StagingDirect):
    """Returns its dense buffers viewed as int32."""

    def compose_layer(self, ctx, layer):
        return {k: v.view(torch.int32) for k, v in super().compose_layer(ctx, layer).items()}


class NeverReturns(StagingDirect):
    """Rank 0 never returns from its first layer (a wait of its own with no bound)."""

    def compose_layer(self, ctx, layer):
        while ctx.rank == 0:
            time.sleep(0.05)
        return super().compose_layer(ctx, layer)


class NumpyOutputs(StagingDirect):
    """A correct exchange that hands back its dense buffers as NumPy arrays (the array interface)."""

    def compose_layer(self, ctx, layer):
        return {k: v.cpu().numpy() for k, v in super().compose_layer(ctx, layer).items()}


class WritesPastDense(StagingDirect):
    """Correct bytes, but on layer 1 it writes one page more than the batch's dense rows (a kernel
    sized by the wrong slot count), into the memory past the buffer it was handed."""

    def compose_layer(self, ctx, layer):
        out = super().compose_layer(ctx, layer)
        if layer == 1:
            for kind, dense in out.items():
                past = torch.as_strided(dense, (dense.shape[0] + ctx.setting.page_size, dense.shape[1]), (dense.shape[1], 1))
                past[dense.shape[0]:] = 0x11
        return out


class WritesIntoPeerPool(StagingDirect):
    """Correct bytes, but rank 1 writes into rank 0's pool slab through its mapping, on the last
    local page (one no batch of tiny.jsonl reads, so no dense byte shows it)."""

    def compose_layer(self, ctx, layer):
        out = super().compose_layer(ctx, layer)
        if ctx.rank == 1 and ctx.batch_index == 0 and layer == 0:
            ctx.pool["kv_fp8"][0][1][-1] = 0x22
        return out


class _OnlyDlpack:
    """A foreign array that speaks DLPack and nothing else (no __array_interface__, not a tensor)."""

    def __init__(self, tensor):
        self._tensor = tensor

    def __dlpack__(self, stream=None):
        return self._tensor.__dlpack__()

    def __dlpack_device__(self):
        return self._tensor.__dlpack_device__()


class _OnlyCudaArrayInterface:
    """A foreign CUDA array that exposes only __cuda_array_interface__ (as CuPy or Numba arrays do)."""

    def __init__(self, tensor):
        self._tensor = tensor
        self.__cuda_array_interface__ = tensor.__cuda_array_interface__


class DlpackOutputs(StagingDirect):
    """A correct exchange that hands back its dense buffers as DLPack-only objects."""

    def compose_layer(self, ctx, layer):
        return {k: _OnlyDlpack(v) for k, v in super().compose_layer(ctx, layer).items()}


class CudaArrayInterfaceOutputs(StagingDirect):
    """A correct exchange that hands back its CUDA dense buffers through __cuda_array_interface__ only."""

    def compose_layer(self, ctx, layer):
        return {k: _OnlyCudaArrayInterface(v) for k, v in super().compose_layer(ctx, layer).items()}

"""Writes outside the implementation's buffers: the memory the harness owns that an exchange may
read but never write, checked where it lives.

- The pool (PROTOCOL.md section 1: prefilled at each page's storage owner; the exchange reads it):
  each rank keeps a hash of every pool page of its own slab (per kind, layer and local page) from
  after the prefill and compares after every batch, so a write into any rank's slab (its own or a
  peer's, through the mapping) is named by the slab's owner, with the layer and the page. The hash,
  not a copy: a CPU pool is a sparse file (a trace's pool of 65536 pages is tens of GB per rank, of
  which a batch touches a few pages), and a copy made it dense. On CPU only the pages that hold
  memory are hashed (mincore(2) on the shared mapping: a page no process wrote or read is a hole,
  zero by definition); a hole that becomes memory is hashed when it appears (zeros: a read; anything
  else: a write). Memory kept: 8 bytes per page touched, plus one chunk while hashing.
- The dense output buffers past this batch's rows (``ctx.dense_out`` hands out the first
  ``dense_rows()`` rows of a larger allocation): the rest is the poison byte at each batch's start
  and after each layer, so a kernel that runs past its rows is caught although every byte it was
  asked for is right.

Off with --time (nothing but the implementation is timed).
"""

from __future__ import annotations

import ctypes
import mmap
from typing import Dict, List, Optional

import numpy as np
import torch

from .. import _cpkv

POISON = _cpkv.conformance.POISON_BYTE
# Bytes hashed at a time (the int64 temporary is 8 times this): bounded whatever the slab's size.
HASH_CHUNK_BYTES = 1 << 22
# OS pages asked of mincore(2) at a time (one byte of answer each).
MINCORE_PAGES_MAX = 1 << 18
_OS_PAGE = mmap.PAGESIZE


def _weights(page_bytes: int, device: torch.device) -> torch.Tensor:
    """Odd int64 weights per byte of a page (fixed: the same pages hash the same in every rank): a
    change of any one byte changes the weighted sum modulo 2**64."""
    generator = torch.Generator().manual_seed(0x63706B76)
    w = torch.randint(-(1 << 62), 1 << 62, (page_bytes,), dtype=torch.int64, generator=generator)
    return (w | 1).to(device)


def hash_pages(pages: torch.Tensor, index: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """int64 hash of each page pages[index[i]] (pages: (n, page_bytes) uint8), a chunk at a time."""
    page_bytes = pages.shape[1]
    step = max(1, HASH_CHUNK_BYTES // page_bytes)
    out = torch.empty(index.numel(), dtype=torch.int64, device=pages.device)
    for first in range(0, index.numel(), step):
        chunk = pages[index[first:first + step].to(pages.device)].to(torch.int64)
        out[first:first + step] = (chunk * weights).sum(dim=1)
    return out


def resident_pages(slab: torch.Tensor) -> torch.Tensor:
    """CPU: the pool pages (flat indices of slab's (layers * pages, page_bytes) view) that hold
    memory, from mincore(2) over the shared mapping (a page any process touched is in the file's
    page cache; a hole is not), asked MINCORE_PAGES_MAX OS pages at a time."""
    page_bytes = slab[0, 0].numel()
    nbytes, start = slab.numel(), slab.data_ptr()
    base = start - start % _OS_PAGE
    libc = ctypes.CDLL(None, use_errno=True)
    found: List[np.ndarray] = []
    span = MINCORE_PAGES_MAX * _OS_PAGE
    for offset in range(0, nbytes + start - base, span):
        size = min(span, nbytes + start - base - offset)
        vec = (ctypes.c_ubyte * ((size + _OS_PAGE - 1) // _OS_PAGE))()
        if libc.mincore(ctypes.c_void_p(base + offset), ctypes.c_size_t(size), vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore on the pool slab")
        os_pages = np.nonzero(np.frombuffer(vec, dtype=np.uint8) & 1)[0].astype(np.int64)
        if os_pages.size:
            begin = np.maximum(base + offset + os_pages * _OS_PAGE - start, 0)
            end = np.minimum(base + offset + (os_pages + 1) * _OS_PAGE - start, nbytes)
            first, count = begin // page_bytes, (end - 1) // page_bytes - begin // page_bytes + 1
            # Every pool page an OS page overlaps: first, first + 1, ..., first + count - 1.
            steps = np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)
            found.append(np.unique(np.repeat(first, count) + steps))
    pages = np.unique(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)
    return torch.from_numpy(pages.astype(np.int64))


class SlabHashes:
    """One kind's slab of this rank: the hash of every page it watches (flat page index -> hash)."""

    def __init__(self, slab: torch.Tensor) -> None:
        self.slab = slab
        self.pages = slab.reshape(slab.shape[0] * slab.shape[1], -1)
        self.sparse = slab.device.type == "cpu"
        self.weights = _weights(self.pages.shape[1], slab.device)
        self.index = self._watched()
        self.hashes = hash_pages(self.pages, self.index, self.weights)

    def _watched(self) -> torch.Tensor:
        if self.sparse:
            return resident_pages(self.slab)
        return torch.arange(self.pages.shape[0], dtype=torch.int64)  # device memory is dense

    def kept_bytes(self) -> int:
        return self.index.numel() * 8 + self.hashes.numel() * 8 + self.weights.numel() * 8

    def changed(self) -> Optional[int]:
        """The first page (flat index) that changed since the last look, or None; watches new pages."""
        now = hash_pages(self.pages, self.index, self.weights)
        wrong = torch.nonzero(now != self.hashes).reshape(-1)
        self.hashes = now
        first = int(self.index[wrong[0]]) if wrong.numel() else None
        if self.sparse:
            new = torch.from_numpy(np.setdiff1d(resident_pages(self.slab).numpy(), self.index.numpy(), assume_unique=True))
            if new.numel():
                new_hashes = hash_pages(self.pages, new, self.weights)
                written = torch.nonzero(new_hashes != 0).reshape(-1)  # a hole reads as zeros: only a write makes it other
                if first is None and written.numel():
                    first = int(new[written[0]])
                self.index, self.hashes = torch.cat([self.index, new]), torch.cat([self.hashes, new_hashes])
        return first


class PoolGuard:
    """Hashes of this rank's pool pages, taken once after the prefill and compared after every batch."""

    def __init__(self, ctx) -> None:
        self.slabs: Dict[str, SlabHashes] = {kind: SlabHashes(ctx.pool[kind][ctx.rank]) for kind in ctx.kinds}

    def kept_bytes(self) -> int:
        """What the guard holds between checks (its hashes and their page indices)."""
        return sum(s.kept_bytes() for s in self.slabs.values())

    def check(self, ctx, batch: int) -> Optional[str]:
        for kind, slab in self.slabs.items():
            page = slab.changed()
            if page is None:
                continue
            layer, local = divmod(page, slab.slab.shape[1])
            return (f"rank {ctx.rank} batch {batch}: wrote outside its buffers: rank {ctx.rank}'s pool slab of {kind} changed "
                    f"on layer {layer} local page {local} (logical page {local * ctx.cp + ctx.rank}; the pool is read-only to the "
                    f"exchange: PROTOCOL.md section 1; any rank may have written it through its mapping)")
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

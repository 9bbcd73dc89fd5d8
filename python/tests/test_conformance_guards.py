"""The pool guard keeps a hash per page, not a copy of the slab (issue 35, item 7b).

Why it matters: a CPU pool is a sparse shared-memory file (a trace's pool of 65536 pages is tens of
GB per rank; a batch touches a few of them). A guard that copied each rank's slab made it dense:
mooncake_slice.jsonl got a rank OOM-killed. The guard must still locate a write into the pool (PROTOCOL.md
section 1: read-only to the exchange) by rank, batch, layer and page, including into a page no
batch names (memory no one had touched). The memory is measured, not assumed: the process's
resident anonymous and shared memory before and after the guard is made.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from cpkv.conformance import _shm  # noqa: E402
from cpkv.conformance._guards import PoolGuard  # noqa: E402

# A slab of 8 layers x 4096 local pages x 16 rows x 656 bytes: 344 MB of address, of which the test
# writes 12 pages. A copy costs the whole of it (and reading every page of the file makes it resident).
SHAPE = (8, 4096, 16, 656)
TOUCHED = [(layer, page) for layer in (0, 5) for page in (3, 700, 701, 2048, 4000, 4095)]
# What the guard may add to the process: its hashes and one hashing chunk (far under the slab's 344 MB).
GUARD_RSS_KIB_MAX = 32 * 1024
GUARD_KEPT_BYTES_MAX = 1 << 20


def resident_kib() -> int:
    """The process's resident anonymous plus shared memory (what a copy and a read of a sparse file cost)."""
    total = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssShmem:")):
                total += int(line.split()[1])
    return total


@pytest.fixture
def sparse_ctx():
    nbytes = SHAPE[0] * SHAPE[1] * SHAPE[2] * SHAPE[3]
    path = _shm.path_of(f"{os.getpid()}-guardtest", "pool", 0)
    _shm.create_file(path, nbytes)
    try:
        slab = _shm.map_file(path, nbytes).view(SHAPE)
    finally:
        _shm.unlink_quietly(path)
    for layer, page in TOUCHED:
        slab[layer, page] = (layer * 7 + page) % 251 + 1
    # Rank 0 of two; a peer's mapping of rank 0's slab is the same memory.
    yield SimpleNamespace(rank=0, cp=2, kinds=["kv_fp8"], pool={"kv_fp8": [slab, slab]})


def test_the_guard_of_a_sparse_pool_keeps_memory_bounded_by_the_pages_touched(sparse_ctx):
    before = resident_kib()
    guard = PoolGuard(sparse_ctx)
    grown = resident_kib() - before
    assert grown < GUARD_RSS_KIB_MAX, f"the guard made the process {grown} KiB larger (a copy of the slab is {344 * 1024} KiB)"
    assert guard.kept_bytes() < GUARD_KEPT_BYTES_MAX
    assert guard.check(sparse_ctx, 0) is None


def test_a_write_into_a_touched_page_is_located_by_layer_and_page(sparse_ctx):
    guard = PoolGuard(sparse_ctx)
    sparse_ctx.pool["kv_fp8"][1][5, 2048, 3, 100] ^= 0xFF  # through the peer's mapping
    line = guard.check(sparse_ctx, 4)
    assert line is not None and line.startswith("rank 0 batch 4: wrote outside its buffers: rank 0's pool slab of kv_fp8 changed "
                                                "on layer 5 local page 2048 (logical page 4096;"), line
    assert guard.check(sparse_ctx, 5) is None  # one report per write


def test_a_write_into_a_page_no_one_touched_is_located_and_a_read_of_one_is_not_a_write(sparse_ctx):
    guard = PoolGuard(sparse_ctx)
    slab = sparse_ctx.pool["kv_fp8"][0]
    assert int(slab[2, 1500].sum()) == 0  # a read of a hole: zeros, and memory now, but no write
    assert guard.check(sparse_ctx, 0) is None
    slab[7, 3333, 15, 655] = 1
    line = guard.check(sparse_ctx, 1)
    assert line is not None and "changed on layer 7 local page 3333 (logical page 6666;" in line, line

"""What `--time` puts beside an implementation's compose time: the measured link limit of the same
layer, and cpkv's built-in staging_direct on the same batches.

The link limit: right after each timed layer, on the same rank, stream and tensors, a plain copy of
the bytes that layer's dense buffers take from each rank (per staging_direct's plan, section 5:
every slot's page comes from one rank's pool or staging), as one contiguous copy per source rank
from that rank's pool slab into this rank's dense buffer. No gather, no barrier: the time the bytes
alone need over the link (peer to local), so compose / limit is from one run, on one machine state.

The built-in figure: the Python extension (python/src/) does not link cpkv's CUDA backend (gpu/),
so the harness runs the built `cpkv bench` on the same trace (a subprocess, after the run, bounded)
and reads staging_direct's per-layer compose time from its JSON. `cpkv bench` refuses ranks that
would share a GPU, and timings of ranks sharing a GPU are not of record anyway, so the figure is
measured only at one rank per GPU.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from typing import Dict, List, Optional, Union

import numpy as np
import torch

from .. import _cpkv
from ._probes import LayerTimer, percentile

# `cpkv bench` on one small trace: its build of the plans and its timed replays.
BENCH_S_MAX = 300.0


def rows_per_source(ctx) -> np.ndarray:
    """Per source rank, the dense rows this rank's layer takes from it (its pool or its staging)."""
    plan = np.asarray(_cpkv.staging_direct_plan(ctx.layout))
    sources = np.where(plan[:, 0] < ctx.cp, plan[:, 0], plan[:, 0] - ctx.cp) if len(plan) else np.zeros(0, dtype=np.int64)
    return np.bincount(sources.astype(np.int64), minlength=ctx.cp) * ctx.setting.page_size


def _copy(dst: torch.Tensor, src: torch.Tensor, nbytes: int) -> None:
    """nbytes from src to dst, in chunks of at most the smaller of the two (flat uint8 views)."""
    chunk = min(dst.numel(), src.numel())
    done = 0
    while done < nbytes and chunk > 0:
        n = min(chunk, nbytes - done)
        dst[:n].copy_(src[:n], non_blocking=True)
        done += n


def link_limit_s(ctx, layer: int, timer: LayerTimer) -> float:
    """The layer's bytes from every source rank copied plainly into this rank's dense buffers
    (source rank r's pool slab, read where it lives: a peer's over the link), timed like the layer."""
    rows = rows_per_source(ctx)
    timer.start()
    for kind in ctx.kinds_on(layer):
        dense = ctx.dense_out(kind).reshape(-1)
        for source in range(ctx.cp):
            _copy(dense, ctx.pool[kind][source].reshape(-1), int(rows[source]) * ctx.row_bytes[kind])
    return timer.stop()


def limit_ms(batches: List[dict]) -> Optional[dict]:
    """Per (batch, layer) the slowest rank's limit, and the ratio of the layer's compose time (its
    slowest rank) to it: medians over the layers."""
    limits, ratios = [], []
    for b in batches:
        per_rank_limit, per_rank_compose = b.get("limit_s", []), b.get("compose_s", [])
        if not per_rank_limit or not all(per_rank_limit):
            continue
        for layer in range(min(len(r) for r in per_rank_limit)):
            limit = max(r[layer] for r in per_rank_limit)
            compose = max(r[layer] for r in per_rank_compose if layer < len(r))
            limits.append(limit * 1e3)
            ratios.append(compose / limit if limit > 0 else float("inf"))
    if not limits:
        return None
    return {"median": percentile(limits, 0.5), "p90": percentile(limits, 0.9), "layers": len(limits),
            "compose_over_limit_median": percentile(ratios, 0.5)}


def one_rank_per_gpu(cp: int) -> bool:
    return torch.cuda.is_available() and cp <= torch.cuda.device_count()


def find_cpkv(explicit: Optional[str]) -> Optional[str]:
    """The `cpkv` binary: --cpkv-bin (whose default is $CPKV_BIN, read by the command line), else
    the build's (cli/cpkv beside the build's python/ folder the package runs from), else `cpkv` on PATH."""
    if explicit:
        return explicit
    package = os.path.dirname(os.path.dirname(os.path.abspath(_cpkv.__file__)))
    built = os.path.join(os.path.dirname(package), "cli", "cpkv")
    return built if os.access(built, os.X_OK) else shutil.which("cpkv")


def builtin_from_bench(bench: dict, batches: List[int]) -> Union[dict, str]:
    """staging_direct's compose time per layer from `cpkv bench --json`'s object, over the given
    batches (those the bench timed: an overflowing batch has no row): median and the batches used."""
    layers_model = bench.get("layers_model")
    us = [row["ms_per_batch_compose"] * 1e3 / layers_model for row in bench.get("rows", [])
          if row.get("variant") == "staging_direct" and row.get("batch") in batches]
    if not layers_model or not us:
        return f"n/a: `cpkv bench` timed no staging_direct row for batches {batches}"
    return {"median": percentile(us, 0.5) / 1e3, "batches": len(us), "byte_exact": all(
        row.get("byte_exact", False) for row in bench["rows"] if row.get("variant") == "staging_direct")}


def builtin_staging_direct(trace: str, layers: int, batches: List[int], cp: int, binary: Optional[str]) -> Union[dict, str]:
    """The built-in figure (a dict, ms) or one line of why there is none."""
    if not one_rank_per_gpu(cp):
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return f"not measured: {cp} ranks on {gpus} GPU(s) share a GPU (`cpkv bench` needs one GPU per rank)"
    if binary is None:
        return "n/a: no `cpkv` binary (--cpkv-bin PATH or $CPKV_BIN)"
    with tempfile.TemporaryDirectory(prefix="cpkv-conformance-bench-") as tmp:
        out = os.path.join(tmp, "bench.json")
        # cpkv's own exchange, the built-in plugin (the default): its compose part is the compose column.
        command = [binary, "bench", trace, "--backend", "cuda", "--variant", "staging_direct",
                   "--layers", str(max(2, layers)), "--json", out]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=BENCH_S_MAX)
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"n/a: {' '.join(command[:2])}: {type(error).__name__}: {error}"
        if done.returncode != 0 or not os.path.exists(out):
            last = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or [""])[-1]
            return f"n/a: `cpkv bench` exit {done.returncode}: {last}"
        with open(out) as f:
            return builtin_from_bench(json.load(f), batches)

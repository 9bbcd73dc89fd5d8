"""What the conformance table and header say (issue 35, items 7g and 7h).

Why it matters: a report that miscounts or misnames sends its reader the wrong way. A refused batch
composes no layer (PROTOCOL.md section 4: refused before any write), so it adds none to `layers`;
the implementation is named whole; a run's seconds are one clock on a pass and a failure (wall
time); the swarm header names the ranks the slow roles fall on (taken modulo cp), never one the run
does not have; and a wrong row that is a stale row of the previous batch is explained as that, not
as garbage.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import cpkv  # noqa: E402
from cpkv import _cpkv, conformance  # noqa: E402
from cpkv.conformance import _adversity as adv  # noqa: E402
from cpkv.conformance import _report  # noqa: E402
from cpkv.conformance._launch import Outcome  # noqa: E402

R = cpkv.Request
SETTING = cpkv.Setting(cp=2, page_size=4, kinds=["kv_fp8", "indexer_k"], layer_pattern="FS", pool_pages=16,
                       max_total_extend_tokens=24, max_batch_requests=2)


def record(batch: int, refused: bool, layers: int) -> dict:
    return {"batch": batch, "mismatches": [], "findings": [], "raised": [], "refused": [refused, refused],
            "compose_s": [[0.001] * (0 if refused else layers)] * 2, "mismatch_kinds": [0, 0], "host_syncs": [[None] * layers] * 2,
            "arrivals": [0, 0], "limit_s": [[], []]}


def test_the_table_counts_only_composed_layers_names_the_impl_whole_and_says_wall_seconds():
    long_impl = "my_engine.exchanges.context_parallel.staging:StagingDirectWithAVeryLongClassName"
    spec = conformance.case(long_impl, SETTING, [cpkv.Batch([R(0, 8, [])])] * 3, layers=2, impl_kwargs={"bug": "x"})
    outcome = Outcome(batches=[record(0, False, 2), record(1, True, 2), record(2, False, 2)], seconds=3.5)
    header, row = _report.table(spec, outcome)[:2]
    cells = row.split()
    assert cells[0] == f'{long_impl}(bug="x")', row
    assert cells[1:4] == ["3", "4", "1"], row  # 3 batches, 2 x 2 layers composed (the refused batch none), 1 refused
    assert row.endswith("pass (3.50 s wall)"), row


def test_the_swarm_header_never_names_a_rank_the_run_does_not_have():
    seeds = [seed for seed in range(1, 400) if int(_cpkv.conformance.swarm_knobs(seed)["slow_rank"]) >= 2]
    assert seeds, "some swarm seed draws a slow rank of 2 or more"
    for seed in seeds[:20]:
        knob = adv.knobs(seed, True)
        line = adv.describe(knob, True, 2)
        producer, offset = (int(v) for v in re.search(r"rank (-?\d+) reader \+(-?\d+)", line).groups())
        assert 0 <= producer < 2 and 0 <= offset < 2, line
        # The rank the harness makes slow (Adversity.slow_rank) is the one the line names.
        rank = adv.Adversity(knob, 0, 2, 2, torch.zeros((2, adv.POSITION_COLUMNS), dtype=torch.int64), torch.device("cpu"), True)
        assert rank.slow_rank("producer", 0, 0) == producer


def current_row(setting, seed, layer, kind, request, token) -> bytes:
    out = np.zeros((1, setting.kinds[0].row_bytes if kind == "kv_fp8" else setting.kinds[1].row_bytes), dtype=np.uint8)
    _cpkv.conformance.fill_current_rows(out, setting, seed, layer, kind, [request], [token])
    return out.tobytes()


def test_a_stale_row_of_the_previous_batch_is_explained_as_that_not_as_garbage():
    """Batch 0 had two requests, batch 1 has one: a slot of batch 1 that still holds batch 0's request
    1 token 3 (a staging slot not refilled) holds a row no token of batch 1 has."""
    seed = 5
    batch0, batch1 = cpkv.Batch([R(0, 8, []), R(0, 8, [])]), cpkv.Batch([R(0, 16, [])])
    stale = current_row(SETTING, seed, 0, "kv_fp8", 1, 3)
    alone = _cpkv.conformance.explain_row(SETTING, batch1, seed, 0, "kv_fp8", 0, 3, 0, stale)
    assert alone.startswith("no row of this batch"), alone  # what it said before: nothing to compare with
    why = _cpkv.conformance.explain_row(SETTING, batch1, seed, 0, "kv_fp8", 0, 3, 0, stale, previous=batch0, batch_index=1)
    assert why.startswith("a row of batch 0 (the previous batch"), why
    assert "request 1 token 3 (current)" in why and "layer 0" in why, why


def test_the_device_path_and_the_host_path_name_one_wrong_byte_with_one_line():
    """The byte check has two paths: the host's (the C++ oracle compares a numpy buffer) and the
    device's (torch finds the first wrong byte where the tensor lives, for CUDA). Both must print
    the simulator's line for the same wrong byte; the device path is run here on CPU tensors (its
    torch operations are the same on either device)."""
    from types import SimpleNamespace

    from cpkv.conformance import _check

    seed, layer, kind = 7, 0, "kv_fp8"
    batch = cpkv.Batch([R(0, 16, []), R(0, 5, [])])
    oracle = _cpkv.conformance.ByteOracle(SETTING, batch)
    dense = torch.from_numpy(np.array(oracle.dense(SETTING, seed, layer, kind), copy=True))
    row_bytes = dense.shape[1]
    dense[SETTING.page_size * 2 + 1, 5] ^= 0xFF  # slot 2 row 1 byte 5
    dense[SETTING.page_size * 3, 0] ^= 0x01  # a second wrong byte, later: counted, not located
    ctx = SimpleNamespace(rank=1, batch_index=3, seed=seed, setting=SETTING, batch=batch, device=torch.device("cpu"),
                          row_bytes={kind: row_bytes})
    host = _check._check_cpu(ctx, oracle, layer, kind, dense)
    device = _check._check_cuda(ctx, oracle, layer, kind, dense, {})
    assert host is not None and host == device, (host, device)
    assert host.startswith(f"mismatch: rank 1 batch 3 layer 0 kind kv_fp8 slot 2 row 1 byte 5: expected "), host
    assert "(2 wrong bytes)" in host, host


def test_the_conformance_checks_findings_have_the_harness_shape():
    """A finding of the conformance checks is printed in the shape every front end prints
    (`invariant N (name): rank R batch B: detail`, the invariant's name from PROTOCOL.md section 9),
    not a shape of its own: an overflowing batch that rank 1 composed, and ranks that arrived at
    different barrier counts."""
    from cpkv.conformance import _check
    summaries = [{"rank": 0, "refused_at": 0, "wrote_before_refusal": False}, {"rank": 1, "refused_at": None, "wrote_before_refusal": False}]
    lines = _check.overflow_findings(2, summaries, current_pages_total=5, declared=3)
    assert len(lines) == 1, lines
    assert lines[0].startswith("invariant 3 (overflow determinism): rank 1 batch 2: composed every layer, but the batch overflows "
                               "the declared staging ("), lines
    arrived = [{"rank": r, "events_used": True, "events": [(0, "arrive", r, 0, 0, 0, 0)] * (r + 1)} for r in range(2)]
    drained = _check._arrival_counts(4, arrived)
    assert drained == ["invariant 4 (barrier phase safety): batch 4: barriers not drained at the batch's end: rank 0 arrived at 1 "
                       "barriers, rank 1 at 2"], drained

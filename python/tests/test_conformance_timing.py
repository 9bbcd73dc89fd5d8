"""`--time`'s figures beside the implementation's compose time, and the capture-probe controls, on
CPU (gloo ranks, shared-memory files).

Why it matters: a compose time alone does not say whether an exchange is fast; beside the time the
same bytes need as a plain copy (the link limit, measured in the same run) it does. The built-in
staging_direct figure comes from `cpkv bench`, which times only one rank per GPU; where it cannot be
measured the report must say so instead of printing a number. The capture controls (cpkv.conformance
.controls) are correct exchanges at cp 1; on CPU they must pass every check, so that on CUDA their
"capturable" / "not capturable" answers are about capture alone (test_conformance_gpu.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest

torch = pytest.importorskip("torch")

import cpkv  # noqa: E402
from cpkv import conformance  # noqa: E402
from cpkv.conformance import _timing  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("CPKV_SOURCE_DIR", os.path.join(HERE, "..", ".."))
TINY = os.path.join(SOURCE, "traces", "samples", "tiny.jsonl")
BENCH_JSON = os.path.join(SOURCE, "docs", "benchmarks", "bench-cp2-seeds_batch.json")
# No case here must run into a wait's bound (each passes, or fails on a check or at setup), so the bound
# is one no loaded machine's stall reaches: it costs nothing when nothing waits it out.
WINDOW_S = 20.0
CONTROLS = ("cpkv.conformance.controls:PrecomputedGather", "cpkv.conformance.controls:SyncEachLayer")
R = cpkv.Request


def cp1_case():
    """tiny.jsonl's batches at cp 1: staging_slots = ceil(16 / 4) + 1 = 5, so batch 2 (8 current
    pages) overflows and batch 0 (2 + 3 = 5) does not."""
    setting = cpkv.Setting(cp=1, page_size=4, kinds=["kv_fp8", "indexer_k"], layer_pattern="FS", pool_pages=16,
                           max_total_extend_tokens=16, max_batch_requests=2)
    return setting, [b for b in cpkv.read_trace(TINY)]


@pytest.mark.parametrize("impl", CONTROLS)
def test_the_capture_controls_are_correct_exchanges_at_cp1(impl):
    setting, batches = cp1_case()
    outcome = conformance.run(impl, setting, batches, seed=5, window_s=WINDOW_S)
    assert outcome.passed, "\n".join(outcome.mismatches + outcome.findings + [outcome.failure or ""])
    # Section 4: the overflowing batch is refused before anything is written; the others composed.
    assert [any(b["refused"]) for b in outcome.batches] == [False, False, True]
    assert outcome.capture == [] and outcome.capture_batch is None  # no capture probe on CPU
    assert outcome.leftovers == []


def test_a_capture_control_at_cp2_is_refused_in_one_line():
    reader = cpkv.read_trace(TINY)
    outcome = conformance.run(CONTROLS[0], reader.setting, list(reader)[:1], seed=5, window_s=WINDOW_S)
    assert not outcome.passed
    assert "is a cp 1 control" in outcome.failure and "cp 2" in outcome.failure, outcome.failure
    assert outcome.leftovers == []


def test_rows_per_source_counts_each_ranks_prefix_and_current_pages():
    """Section 1: logical page g lives on rank g % cp; section 2: each current page has one writer.
    Each dense slot takes its page from that one rank (a pool, or the writer's staging), so a source's
    rows are its stored prefix pages plus the current pages it writes, times P."""
    reader = cpkv.read_trace(TINY)
    setting = reader.setting
    for batch in list(reader)[:2]:
        ctx = types.SimpleNamespace(layout=cpkv.layout_batch(setting, batch), cp=setting.cp, setting=setting)
        writers = [int(w) for w in ctx.layout.writers]
        prefix = [g for request in batch.requests for g in request.prefix_pages]
        expected = [(sum(1 for g in prefix if g % setting.cp == r) + writers.count(r)) * setting.page_size for r in range(setting.cp)]
        assert list(_timing.rows_per_source(ctx)) == expected


def test_time_mode_times_the_link_limit_of_every_layer_beside_compose():
    reader = cpkv.read_trace(TINY)
    outcome = conformance.run("cpkv.conformance.reference:StagingDirect", reader.setting, list(reader)[:2], seed=3,
                              window_s=WINDOW_S, timing=True)
    assert outcome.passed, outcome.failure
    limits = [t for b in outcome.batches for per_rank in b["limit_s"] for t in per_rank]
    assert len(limits) == 2 * 2 * 2 and all(0 < t < WINDOW_S for t in limits), limits  # 2 batches, 2 ranks, 2 layers
    figure = _timing.limit_ms(outcome.batches)
    assert figure["layers"] == 4 and figure["median"] > 0 and figure["compose_over_limit_median"] > 0


def test_the_cli_time_report_shows_the_limit_and_says_why_there_is_no_builtin_on_cpu(tmp_path):
    out = tmp_path / "run.json"
    done = subprocess.run([sys.executable, "-m", "cpkv.conformance", TINY, "--impl", "cpkv.conformance.reference:V2",
                           "--ranks", "2", "--time", "--batch", "0", "--window", str(WINDOW_S), "--json", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "link limit per layer" in done.stdout and "compose / limit: median" in done.stdout, done.stdout
    assert "cpkv staging_direct (built-in) on the same batches: n/a on cpu" in done.stdout
    run = json.loads(out.read_text())["runs"][0]
    assert run["link_limit_ms"]["layers"] == 2 and run["timings_of_record"] is False
    assert run["builtin_staging_direct_ms"] == "n/a"


def test_the_builtin_figure_is_not_measured_when_ranks_would_share_a_gpu():
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    line = _timing.builtin_staging_direct(TINY, 2, [0], gpus + 1, "/nonexistent/cpkv")
    assert line == f"not measured: {gpus + 1} ranks on {gpus} GPU(s) share a GPU (`cpkv bench` needs one GPU per rank)"


def test_the_builtin_figure_is_read_from_a_real_cpkv_bench_json():
    """A `cpkv bench --json` of the H200 pair (docs/benchmarks): staging_direct's per-layer compose
    time is ms_per_batch_compose over the model's layers (cli/bench_command.cpp writes it so)."""
    with open(BENCH_JSON) as f:
        bench = json.load(f)
    row = next(r for r in bench["rows"] if r["variant"] == "staging_direct")
    figure = _timing.builtin_from_bench(bench, [row["batch"]])
    assert figure["batches"] == 1
    assert figure["median"] == pytest.approx(row["ms_per_batch_compose"] / bench["layers_model"])
    assert _timing.builtin_from_bench(bench, [10 ** 6]).startswith("n/a: `cpkv bench` timed no staging_direct row")


@pytest.mark.parametrize("impl, expected", [
    ("WritesPastDense", "wrote outside its buffers: dense buffer of kv_fp8 row "),
    ("WritesIntoPeerPool", "batch 0: wrote outside its buffers: rank 0's pool slab of kv_fp8 changed on layer 1"),
])
def test_a_write_outside_the_buffers_is_one_located_line_though_every_dense_byte_is_right(impl, expected):
    """Issue 23's bad input: an implementation that writes outside its buffers. The pool is read-only
    to the exchange (section 1) and the dense buffer has dense_rows() rows; the bytes it was asked
    for are right, so only the guards can see it."""
    reader = cpkv.read_trace(TINY)
    outcome = conformance.run(f"{os.path.join(HERE, 'conformance_impls.py')}:{impl}", reader.setting, list(reader)[:2], seed=3,
                              window_s=WINDOW_S)
    assert outcome.mismatches == [], outcome.mismatches
    assert "contract" in outcome.checks_fired(), outcome.checks_fired()
    assert any(expected in line for line in outcome.findings), outcome.findings
    assert outcome.leftovers == []


def test_outputs_that_speak_only_dlpack_are_checked_like_tensors():
    """Issue 23 item 5: DLPack tensors accepted wherever a buffer is (an output of compose_layer)."""
    reader = cpkv.read_trace(TINY)
    outcome = conformance.run(f"{os.path.join(HERE, 'conformance_impls.py')}:DlpackOutputs", reader.setting, list(reader)[:2], seed=3,
                              window_s=WINDOW_S)
    assert outcome.passed, "\n".join(outcome.mismatches + outcome.findings + [outcome.failure or ""])

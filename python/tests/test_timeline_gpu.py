"""cpkv replay --backend cuda --timeline and cpkv bench --timeline on a GPU (docs/event-log.md,
"GPU timelines"): the file holds the Chrome trace event format's required fields (timeline_format.py);
one track per rank, named "rank R"; every batch the overflow verdict accepted has, on every rank, one
compose span per layer (the fused launch; a plugin's "compose_layer (plugin NAME)" beside "rows" and
"verify"), a refused batch an "overflow" instant instead; a planted bug's mismatch, as the report
prints it, is a "mismatch" instant on its rank's track at its batch and layer; the bench records the
checked layers only (exactly one compose span per rank, batch and layer: no graph replay).
Skips, saying so, where no CUDA device is visible (the cuda backend's own one-line refusal)."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
from collections import Counter

import pytest

from conftest import CLI, SOURCE_DIR
from timeline_format import checked_events

TINY = str(SOURCE_DIR / "traces" / "samples" / "tiny.jsonl")
# The plain example plugin (examples/exchange_plain), built beside the CLI: it reads ctx->rows.
PLAIN = str(pathlib.Path(CLI).resolve().parents[1] / "examples" / "libcpkv_exchange_plain.so")
NO_DEVICE = "no CUDA device is visible"


def cpkv(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=300)


def _gpu_visible() -> bool:
    run = cpkv("replay", TINY, "--backend", "cuda", "--variant", "staging_direct", "--layers", "1")
    return not (run.returncode == 2 and NO_DEVICE in run.stderr)


if not _gpu_visible():
    pytest.skip(f"SKIPPED: {NO_DEVICE}: the GPU timeline tests need one", allow_module_level=True)


def replay(timeline, *args: str) -> subprocess.CompletedProcess:
    return cpkv("replay", TINY, "--backend", "cuda", "--layers", "all", "--timeline", str(timeline), *args)


def spans(events, tid=None, name=None):
    return [e for e in events if e["ph"] == "X" and (tid is None or e["tid"] == tid) and (name is None or e["name"] == name)]


def check_tracks_and_layers(events, compose_name, cp=2, layers=2):
    """One track per rank; per rank, one compose span for every layer of every accepted batch."""
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    pids = {e["pid"] for e in events if e["ph"] == "X"}
    assert pids, "no spans"
    for pid in pids:
        assert all(names.get((pid, r)) == f"rank {r}" for r in range(cp)), names
        ours = [e for e in events if e["pid"] == pid]
        refused = {r: {e["args"]["batch"] for e in ours if e["ph"] == "i" and e["name"] == "overflow" and e["tid"] == r} for r in range(cp)}
        assert all(refused[r] == refused[0] for r in range(cp)), f"the overflow verdict is rank-uniform: {refused}"
        batches = {e["args"]["batch"] for e in ours if e["ph"] == "X"} | refused[0]
        assert batches == set(range(max(batches) + 1)), f"every batch of the trace is there: {sorted(batches)}"
        for r in range(cp):
            composed = Counter((e["args"]["batch"], e["args"]["layer"]) for e in spans(ours, r, compose_name))
            expected = Counter((b, l) for b in batches - refused[r] for l in range(layers))
            assert composed == expected, f"pid {pid} rank {r}: compose spans {sorted(composed)} vs {sorted(expected)}"
            for e in spans(ours, r):
                assert e["args"]["half"] == e["args"]["layer"] % 2 and e["args"]["variant"], e
                assert e["args"]["align_us"] >= 0, e
    return pids


def test_replay_on_the_gpu_writes_one_track_per_rank_with_every_layers_compose(tmp_path):
    timeline = tmp_path / "t.json"
    run = replay(timeline, "--variant", "all")  # cpkv's exchange through the plugin host, the backend's one rank loop
    assert run.returncode == 0, run.stdout + run.stderr
    events = checked_events(timeline)
    pids = check_tracks_and_layers(events, "compose_layer (plugin fused)")
    assert len(pids) > 1, "each variant its own process"
    compose = spans(events, name="compose_layer (plugin fused)")
    assert spans(events, name="verify")
    assert any("CUDA events" in e["args"].get("clock", "") for e in events if e["name"] == "clock")
    assert not list(tmp_path.glob("*.part")), "the rank parts are merged and removed"
    check_ranks_share_a_clock(compose)


# Variants whose compose launch holds the counting barrier (PROTOCOL.md section 7).
BARRIER_VARIANTS = {"staging_direct", "staging_publish", "symm_dense"}


def check_ranks_share_a_clock(compose, slack_us=10.0):
    """A layer whose compose launch holds the counting barrier cannot end before every peer's has
    begun (each waits for the peers' signals, given inside their launches): on one clock, within the
    ranks' alignment bounds (align_us), rank r's end >= rank p's begin for every batch and layer."""
    by_layer = {}
    for e in compose:
        if e["args"]["variant"] in BARRIER_VARIANTS:
            by_layer.setdefault((e["pid"], e["args"]["batch"], e["args"]["layer"]), []).append(e)
    assert by_layer, "some variant's compose holds the barrier"
    for where, group in by_layer.items():
        for a in group:
            for b in group:
                bound = a["args"]["align_us"] + b["args"]["align_us"] + slack_us
                assert a["ts"] + a["dur"] >= b["ts"] - bound, f"{where}: rank {a['tid']} ended before rank {b['tid']} began"


def test_a_planted_bug_is_a_mismatch_instant_at_its_rank_batch_and_layer(tmp_path):
    timeline = tmp_path / "t.json"
    run = replay(timeline, "--variant", "staging_direct", "--mutant", "skip_zero")
    assert run.returncode == 1, run.stdout + run.stderr
    reported = {tuple(int(g) for g in m.groups()) for m in re.finditer(r"invariant 6 \([^)]*\): rank (\d+) batch (\d+) layer (\d+)", run.stdout)}
    assert reported, run.stdout
    events = checked_events(timeline)
    instants = {(e["tid"], e["args"]["batch"], e["args"]["layer"]) for e in events if e["ph"] == "i" and e["name"] == "mismatch"}
    assert reported <= instants, f"reported {sorted(reported)}, in the timeline {sorted(instants)}"
    for rank, batch, layer in reported:
        verify = [e for e in spans(events, rank, "verify") if e["args"]["batch"] == batch and e["args"]["layer"] == layer]
        assert verify, f"rank {rank} batch {batch} layer {layer} has a verify span"
        hit = next(e for e in events if e["ph"] == "i" and e["name"] == "mismatch" and (e["tid"], e["args"]["batch"], e["args"]["layer"]) == (rank, batch, layer))
        assert hit["ts"] >= max(v["ts"] for v in verify), "at the end of the layer's verify, where it was found"


def test_an_exchange_plugin_has_rows_compose_layer_and_verify_spans(tmp_path):
    timeline = tmp_path / "t.json"
    run = replay(timeline, "--variant", "staging_direct", "--exchange", PLAIN)
    assert run.returncode == 0, run.stdout + run.stderr
    events = checked_events(timeline)
    names = {e["name"] for e in spans(events)}
    assert "compose_layer (plugin plain)" in names, names
    check_tracks_and_layers(events, "compose_layer (plugin plain)")
    assert {"rows", "verify"} <= names, names


def test_the_default_exchange_is_the_built_in_plugin_whose_producer_is_inside_its_layer(tmp_path):
    # No --exchange: cpkv's fused compose through the ABI; cpkv's producer runs inside its
    # compose_layer (produce_rows), so there is no separate rows span.
    timeline = tmp_path / "t.json"
    run = replay(timeline, "--variant", "staging_direct")
    assert run.returncode == 0, run.stdout + run.stderr
    events = checked_events(timeline)
    names = {e["name"] for e in spans(events)}
    check_tracks_and_layers(events, "compose_layer (plugin fused)")
    assert "verify" in names and "rows" not in names, names


def test_the_bench_records_its_checked_layers_only_and_adds_no_host_sync_to_the_layer_loop(tmp_path):
    timeline, report = tmp_path / "t.json", tmp_path / "bench.json"
    run = cpkv("bench", TINY, "--variant", "staging_direct", "--layers", "2", "--reps", "3", "--time-sliced",
               "--timeline", str(timeline), "--json", str(report))
    assert run.returncode == 0, run.stdout + run.stderr
    check_tracks_and_layers(checked_events(timeline), "compose_layer (plugin fused)")  # exactly one per layer: the graph replays are not in it
    rows = json.loads(report.read_text())["rows"]
    assert rows and all(row["host_syncs_per_layer"] == 0 for row in rows), "the bench's count of host synchronizations in the layer loop stays 0 with the timeline on"

"""The conformance harness's timeline (cpkv.conformance.run(timeline=...), --timeline F): the Chrome
trace event format's required fields (JSON object form: traceEvents, displayTimeUnit 'ms' or 'ns';
every event name, ph, ts, pid, tid; X a dur; i a scope s of g, p or t), one track per rank, a span
per compose_layer call, the reference's event hooks, and a planted bug's mismatch as an instant at
the rank whose bytes were wrong."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import cpkv  # noqa: E402
from cpkv import conformance  # noqa: E402

from conftest import SOURCE_DIR  # noqa: E402
from timeline_format import checked_events  # noqa: E402

TINY = str(SOURCE_DIR / "traces" / "samples" / "tiny.jsonl")
IMPL = "cpkv.conformance.reference:StagingDirect"


def test_a_passing_run_has_a_track_per_rank_and_a_span_per_compose_layer(tmp_path):
    reader = cpkv.read_trace(TINY)
    batches = list(reader)[:2]  # the third overflows: refused before any layer
    path = tmp_path / "run.timeline.json"
    outcome = conformance.run(IMPL, reader.setting, batches, seed=7, timeline=path)
    assert outcome.passed, outcome.report()
    events = checked_events(path)
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {0: "rank 0", 1: "rank 1"}
    layers = reader.setting.layer_count
    for rank in (0, 1):
        spans = [e for e in events if e["ph"] == "X" and e["name"] == "compose_layer" and e["tid"] == rank]
        assert sorted((s["args"]["batch"], s["args"]["layer"]) for s in spans) == [(b, l) for b in range(2) for l in range(layers)]
        assert all(s["args"]["half"] == s["args"]["layer"] % 2 for s in spans)
        hooks = {e["name"] for e in events if e["tid"] == rank and e.get("cat") == "hook"}
        assert {"write", "read", "arrive", "passed"} <= hooks, hooks
    assert not [e for e in events if e["ph"] == "i" and e["name"] == "mismatch"]


def test_a_planted_bugs_mismatch_is_an_instant_at_its_rank(tmp_path):
    reader = cpkv.read_trace(TINY)
    path = tmp_path / "bug.timeline.json"
    outcome = conformance.run(IMPL, reader.setting, list(reader)[:1], seed=7, mutant="skip_zero", delays=False, timeline=path)
    assert not outcome.passed
    events = checked_events(path)
    instants = [e for e in events if e["ph"] == "i" and e["name"] == "mismatch"]
    assert instants, "the planted bug's wrong bytes show on the timeline"
    for e in instants:
        rank = int(re.search(r"rank (\d+)", e["args"]["detail"]).group(1))
        assert e["tid"] == rank, e
        spans = [s for s in events if s["ph"] == "X" and s["name"] == "compose_layer" and s["tid"] == rank and s["args"]["layer"] == e["args"]["layer"]]
        assert spans and e["ts"] >= spans[0]["ts"] + spans[0]["dur"], "after the layer it found wrong"


def test_the_command_takes_timeline(tmp_path):
    path = tmp_path / "cli.timeline.json"
    run = subprocess.run([sys.executable, "-m", "cpkv.conformance", TINY, "--impl", IMPL, "--ranks", "2", "--batch", "0", "--timeline", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert any(e["name"] == "compose_layer" for e in checked_events(path))
    bad = subprocess.run([sys.executable, "-m", "cpkv.conformance", TINY, "--impl", IMPL, "--ranks", "2", "--timeline", str(tmp_path / "no" / "x.json")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "timeline" in bad.stderr and bad.stdout == "", bad.stderr

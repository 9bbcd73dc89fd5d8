"""cpkv replay --timeline and --event-log (docs/event-log.md): the timeline holds the format's
required fields (timeline_format.py) in every simulator mode; a planted bug's first violation, as
the report prints it, is an instant on its rank's track at its step; the streamed event log is the
one the in-memory log wrote (tests/golden/); other backends refuse the option with one line."""

from __future__ import annotations

import re
import subprocess

from conftest import SOURCE_DIR
from timeline_format import checked_events

TINY = str(SOURCE_DIR / "traces" / "samples" / "tiny.jsonl")
GOLDEN = SOURCE_DIR / "tests" / "golden"


def replay(cli: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([cli, "replay", TINY, "--variant", "staging_direct", "--seed", "7", *args], capture_output=True, text=True, timeout=300)


def test_a_planted_bug_is_an_instant_at_its_rank_and_step_and_the_log_is_the_old_one(cli, tmp_path):
    timeline, log = tmp_path / "t.json", tmp_path / "e.log"
    run = replay(cli, "--schedule", "random", "--mutant", "single_half", "--timeline", str(timeline), "--event-log", str(log))
    assert run.returncode == 1, run.stdout + run.stderr
    first = re.search(r"invariant (\d) \([^)]*\): rank (\d+) batch (\d+) layer (\d+) slot -?\d+ step (\d+)", run.stdout)
    assert first, run.stdout
    invariant, rank, batch, layer, step = (int(g) for g in first.groups())
    events = checked_events(timeline)
    hits = [e for e in events if e["ph"] == "i" and e["args"].get("step") == step and e["args"].get("batch") == batch]
    assert hits and hits[0]["tid"] == rank and hits[0]["name"] == f"violation: invariant {invariant}" and hits[0]["args"]["layer"] == layer
    spans = sorted((e for e in events if e["ph"] == "X" and e["tid"] == rank), key=lambda e: e["ts"])
    assert spans[step]["ts"] + spans[step]["dur"] == hits[0]["ts"] + 1, "on the rank's violating step"
    assert any("scheduler steps" in e["args"].get("clock", "") for e in events if e["name"] == "clock"), "a scheduled run counts steps"
    assert log.read_text() == (GOLDEN / "event-log-tiny-seed7-single_half.log").read_text()


def test_free_running_modes_write_a_valid_timeline_of_wall_time(cli, tmp_path):
    for ranks_as in ("threads", "processes"):
        timeline = tmp_path / f"{ranks_as}.json"
        run = replay(cli, "--ranks-as", ranks_as, "--timeline", str(timeline))
        assert run.returncode == 0, run.stdout + run.stderr
        events = checked_events(timeline)
        assert {e["tid"] for e in events if e["ph"] == "X"} == {0, 1}
        assert any("wall time" in e["args"].get("clock", "") for e in events if e["name"] == "clock")


def test_a_backend_without_timelines_refuses_the_option_in_one_line(cli, tmp_path):
    run = subprocess.run([cli, "replay", TINY, "--backend", "model", "--timeline", str(tmp_path / "t.json")], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and run.stdout == "" and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert not (tmp_path / "t.json").exists()


def test_the_cuda_backend_and_the_bench_take_the_option(cli, tmp_path):
    """Checked before any rank: the cuda backend takes --timeline (so here, without a GPU, the one
    refusal is the missing device, not the option, and no file is written); the bench too."""
    for command in (["replay", TINY, "--backend", "cuda"], ["bench", TINY, "--reps", "1", "--time-sliced"]):
        timeline = tmp_path / f"{command[0]}.json"
        run = subprocess.run([cli, *command, "--timeline", str(timeline)], capture_output=True, text=True, timeout=300)
        assert "--timeline" not in run.stderr, run.stderr
        if run.returncode == 2:
            assert "no CUDA device" in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
            assert not timeline.exists()
        else:
            assert run.returncode == 0, run.stdout + run.stderr
            checked_events(timeline)

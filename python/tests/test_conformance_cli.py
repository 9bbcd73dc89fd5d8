"""`python3 -m cpkv.conformance` and the harness's handling of bad implementations: one located line
and exit 1 or 2, never a hang, an orphan process or a file left in /dev/shm.

Why it matters: the harness runs code it did not write. An implementation that raises, returns the
wrong thing or never returns must be named (rank, batch, layer, and where in its code) within the
stated window, and the group torn down; bad input must be rejected before any rank starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from cpkv import conformance  # noqa: E402
from cpkv.conformance import _report, _shm  # noqa: E402
import cpkv  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("CPKV_SOURCE_DIR", os.path.join(HERE, "..", ".."))
TINY = os.path.join(SOURCE, "traces", "samples", "tiny.jsonl")
IMPLS = os.path.join(HERE, "conformance_impls.py")
# The bound of the waits of the case that hangs (NeverReturns): the hang is named within
# 2 * WINDOW_S + 5 s (the harness's own wait), well before the watchdog. Above what a loaded 2-core
# machine's stall can reach in the setup before the hang (a 1.5 s window once bounded every case of
# the session, the passing ones too: a session's process groups take its first case's window).
WINDOW_S = 5.0
# The cases that must pass (or fail on a check, never on a wait) run under a window no loaded machine's
# stall reaches: a passing run never waits it out.
LIVE_WINDOW_S = 20.0
CLI_TIMEOUT_S = 120


def conformance_cli(*args: str):
    return subprocess.run([sys.executable, "-m", "cpkv.conformance", *args], capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
                          env=dict(os.environ))


def test_typed_alone_the_layers_default_is_every_backends_four():
    """The command is a spelling of `cpkv replay --backend torch`'s request, whose --layers default
    is 4 (at most the trace's), as every backend's (README, docs/conformance.md); it ran every layer."""
    from cpkv.conformance import _impl_spec
    from cpkv.conformance.__main__ import parse, request_options
    seeds = os.path.join(SOURCE, "traces", "samples", "seeds_batch.jsonl")  # 61 layers
    impl = ["--impl", "cpkv.conformance.reference:StagingDirect", "--ranks", "2"]

    def layers(*more: str):
        a = parse([seeds, *impl, *more])
        a.impl, a.impl_kwargs = _impl_spec.resolve(a.impl, a.impl_arg)  # as prepare does
        return request_options(a, 2)["layers"]

    assert layers() == 4
    assert layers("--layers", "all") is None  # every layer
    assert layers("--layers", "7") == 7


def test_an_impl_that_does_not_import_is_one_line_and_exit_2():
    done = conformance_cli(TINY, "--impl", "no_such_engine.exchange:Exchange", "--ranks", "2")
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "no_such_engine.exchange" in lines[0] and "ModuleNotFoundError" in lines[0]


def test_ranks_that_differ_from_the_trace_cp_are_exit_2():
    done = conformance_cli(TINY, "--impl", "cpkv.conformance.reference:StagingDirect", "--ranks", "3")
    assert done.returncode == 2, done
    assert "--ranks: 3 ranks for a trace of cp = 2" in done.stderr


def test_a_planted_bug_fails_with_a_table_a_located_line_json_and_a_reproducer(tmp_path, cli):
    out = tmp_path / "result.json"
    done = conformance_cli(TINY, "--impl", "cpkv.conformance.reference:StagingDirect", "--ranks", "2", "--seed", "5", "--mutant", "skip_zero",
                           "--json", str(out))
    assert done.returncode == 1, done
    assert "cpkv conformance: " in done.stdout and "seed 5" in done.stdout
    assert "FAIL: bytes" in done.stdout
    assert "mismatch: rank" in done.stdout and "the wrong row is 0xa5 staging poison" in done.stdout
    replay = [line for line in done.stdout.splitlines() if line.startswith("replay: ")]
    assert replay and "--mutant skip_zero" in replay[0] and "--seed 5" in replay[0]
    result = json.loads(out.read_text())
    assert result["conformance"]["checks_fired"][0] == "bytes" and result["conformance"]["leftovers"] == []
    assert_replay_schema(result, tmp_path, cli)


def keys_missing(theirs: dict, ours: dict, where: str) -> list:
    return [f"{where}.{key}" for key in sorted(set(theirs) - set(ours))]


def assert_replay_schema(ours: dict, tmp_path, cli) -> None:
    """README: `--json` writes what `cpkv replay --json` writes. The simulator's object for the same
    trace, seed and planted bug is the reference: every key of it (top, run, rank) is in ours, and the
    keys that say what the run was (the trace's rejected batches, layers, seed, mutant, pass) agree."""
    sim_json = tmp_path / "replay.json"
    done = subprocess.run([cli, "replay", TINY, "--backend", "sim", "--variant", "staging_direct", "--seed", "5", "--mutant", "skip_zero",
                           "--json", str(sim_json)], capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert done.returncode == 1, done
    theirs = json.loads(sim_json.read_text())
    missing = keys_missing(theirs, ours, "") + keys_missing(theirs["runs"][0], ours["runs"][0], "runs[0]")
    missing += keys_missing(theirs["runs"][0]["ranks"][0], ours["runs"][0]["ranks"][0], "runs[0].ranks[0]")
    assert missing == [], missing
    for key in ("trace", "seed", "layers", "mutant", "rejected_batches"):
        assert ours[key] == theirs[key], (key, ours[key], theirs[key])
    run, sim_run = ours["runs"][0], theirs["runs"][0]
    assert run["passed"] is False and sim_run["passed"] is False
    assert len(run["ranks"]) == len(sim_run["ranks"]) == 2
    # skip_zero leaves poison in the dense buffers from the first layer: both count wrong buffers, and
    # both list them as invariant 6 lines among the violations.
    assert run["mismatches"] > 0 and run["violations"] >= run["mismatches"]
    assert any(line.startswith("invariant 6 (byte exactness): mismatch: rank") for line in run["violation_details"])
    # The harness stops at the first batch that fails (the simulator runs on): batch 0 here.
    assert [r["batches"] for r in run["ranks"]] == [1, 1] and [r["layers"] for r in run["ranks"]] == [2, 2]


@pytest.fixture(scope="module")
def bad_impls():
    setting_batches = __import__("cpkv").read_trace(TINY)
    batches = list(setting_batches)[:2]
    # A launch's process groups take its first case's window (their timeouts, and the harness's own
    # wait): the passing cases come first, under the live window. RaisesOnLayer1 is named as it raises
    # (not at a wait's end) and ends the launch; NeverReturns, last, starts one of its own with the
    # short window it must wait out.
    names = ["NumpyOutputs", "WrongDtype", "RaisesOnLayer1", "NeverReturns"]
    cases = [conformance.case(f"{IMPLS}:{n}", setting_batches.setting, batches, seed=2, window_s=WINDOW_S if n == "NeverReturns" else LIVE_WINDOW_S)
             for n in names]
    # --time, in the same session (no extra processes): checks off, so even a planted bug passes.
    timed = [conformance.case("cpkv.conformance.reference:StagingDirect", setting_batches.setting, batches, seed=2, window_s=LIVE_WINDOW_S,
                              timing=True, mutant=mutant) for mutant in (None, "skip_zero")]
    # NeverReturns stays last: it ends the session's processes.
    return dict(zip(names[:2] + ["timed", "timed_skip_zero"] + names[2:], conformance.run_cases(cases[:2] + timed + cases[2:])))


def test_outputs_with_the_array_interface_are_accepted(bad_impls):
    outcome = bad_impls["NumpyOutputs"]
    assert outcome.passed, outcome.mismatches + outcome.findings + [outcome.failure or ""]


def test_an_impl_that_raises_is_named_with_rank_batch_layer_and_its_line(bad_impls):
    outcome = bad_impls["RaisesOnLayer1"]
    assert not outcome.passed
    assert "rank 1 batch 0 layer 1 raised in compose_layer: ValueError: engine bug" in outcome.failure
    assert "conformance_impls.py:" in outcome.failure
    assert outcome.leftovers == []


def test_an_impl_that_returns_the_wrong_dtype_breaks_the_contract(bad_impls):
    outcome = bad_impls["WrongDtype"]
    assert outcome.checks_fired()[0] == "contract", outcome.findings
    assert "dtype torch.int32, expected torch.uint8" in outcome.findings[0]


def test_an_impl_that_never_returns_is_named_and_torn_down(bad_impls):
    outcome = bad_impls["NeverReturns"]
    assert outcome.failure_kind == "hang", outcome.failure
    assert outcome.failure.startswith("rank 0 batch 0 layer 0 in compose_layer: never returned"), outcome.failure
    assert outcome.leftovers == []
    assert [p for p in _shm.leftovers() if os.path.basename(p).startswith(f"{_shm.PREFIX}{os.getpid()}-")] == []


def test_time_mode_measures_every_layer_with_checks_off(bad_impls):
    """README: --time turns the checks off and reports each layer's compose time as a median and p90;
    on CPU the GPU-only columns say n/a."""
    outcome = bad_impls["timed"]
    assert outcome.passed and outcome.batches, outcome.failure
    for record in outcome.batches:
        assert [len(per_rank) for per_rank in record["compose_s"]] == [2, 2]  # two layers, both ranks
        assert all(0 < seconds < LIVE_WINDOW_S for per_rank in record["compose_s"] for seconds in per_rank)  # within the run's bound
        assert record["events"] == 0  # the hooks were off
    assert bad_impls["timed_skip_zero"].passed  # the poison it leaves is not looked at
    spec = conformance.case("cpkv.conformance.reference:StagingDirect", cpkv.read_trace(TINY).setting,
                            list(cpkv.read_trace(TINY))[:2], timing=True)
    lines = _report.table(spec, outcome)
    assert any(line.startswith("compose per layer (perf_counter") and "median" in line and "p90" in line for line in lines), lines
    run = _report.run_json(spec, outcome, "processes")
    assert run["compose_ms"]["layers"] == 4 and 0 < run["compose_ms"]["median"] <= run["compose_ms"]["p90"]
    assert (run["host_syncs_per_layer"], run["graph_capturable"], run["builtin_staging_direct_ms"]) == ("n/a", "n/a", "n/a")

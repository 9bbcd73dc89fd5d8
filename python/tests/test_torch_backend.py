"""The torch backend of the one replay request (issue 36, item 2): cpkv.replay(path, backend="torch",
impl="module:Class") checks impl, device and ranks in the request check every backend shares
(harness/request.hpp), then runs the conformance harness in this process and returns the report
`python3 -m cpkv.conformance --json` writes: one run with the totals, violations by invariant,
failure and deadlock of every backend's run, and the conformance-only figures in its own block.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import cpkv  # noqa: E402

SOURCE = Path(os.environ.get("CPKV_SOURCE_DIR", Path(__file__).resolve().parents[2]))
TINY = str(SOURCE / "traces" / "samples" / "tiny.jsonl")
REFERENCE = "cpkv.conformance.reference:StagingDirect"


def test_replay_backend_torch_runs_the_conformance_harness_and_reports_as_every_backend():
    report = cpkv.replay(TINY, backend="torch", impl=REFERENCE, ranks=2, seed=5)
    assert report["trace"] == TINY and report["seed"] == 5 and report["layers"] == 2  # the request's 4 layers, at most the trace's 2
    [run] = report["runs"]
    assert run["passed"] is True and run["failure"] == "" and run["deadlock"] is False
    assert run["violations"] == 0 and set(run["violations_by_invariant"]) == {str(i) for i in range(1, 10)}
    assert len(run["ranks"]) == 2 and all(rank["batches"] == 3 for rank in run["ranks"])  # tiny.jsonl holds 3 batches
    assert report["conformance"]["impl"] == REFERENCE and report["conformance"]["device"] == "cpu"


def test_a_planted_bug_fails_the_run_with_its_invariant_counted():
    # token_split: a page gets two writers (invariant 1, tests/conformance_expected.py from PROTOCOL.md section 9).
    report = cpkv.replay(TINY, backend="torch", impl=REFERENCE, mutant="token_split")
    [run] = report["runs"]
    assert run["passed"] is False
    assert run["violations_by_invariant"]["1"] > 0, run
    assert report["mutant"] == "token_split"
    assert report["conformance"]["reproducer"].startswith("python3 -m cpkv.conformance ")


@pytest.mark.parametrize("options, named", [
    ({"backend": "torch"}, "impl"),                                            # the class is required
    ({"backend": "torch", "impl": "no_colon"}, "impl"),                        # not module:Class
    ({"backend": "torch", "impl": REFERENCE, "device": "tpu"}, "device"),
    ({"backend": "torch", "impl": REFERENCE, "ranks": 0}, "ranks"),
    ({"backend": "torch", "impl": REFERENCE, "variant": "v2"}, "variant"),     # the class is its own variant
    ({"backend": "torch", "impl": REFERENCE, "schedule": "random"}, "schedule"),  # the simulator's option
    ({"backend": "sim", "impl": REFERENCE}, "impl"),                           # only the torch backend takes it
    ({"backend": "sim", "device": "cpu"}, "device"),
    ({"backend": "torch", "impl": REFERENCE, "ranks": 3}, "--ranks"),          # not the trace's cp: the harness's own check
    ({"backend": "torch", "impl": "cpkv.conformance.reference:NoSuchClass"}, "impl"),  # does not import
])
def test_bad_input_raises_one_input_error_naming_the_option(options, named):
    with pytest.raises(cpkv.InputError) as error:
        cpkv.replay(TINY, **options)
    assert named in str(error.value), str(error.value)


def test_the_conformance_command_and_the_replay_call_write_the_same_report(tmp_path):
    """`python3 -m cpkv.conformance` is a spelling of the same run: its --json equals replay()'s report
    but for the clock (seconds) and the per-batch timings."""
    out = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "cpkv.conformance", TINY, "--impl", REFERENCE, "--ranks", "2", "--seed", "5",
                           "--layers", "2", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr + done.stdout
    written = json.loads(out.read_text())
    called = cpkv.replay(TINY, backend="torch", impl=REFERENCE, seed=5)

    def steady(report: dict) -> dict:
        report = json.loads(json.dumps(report))
        for run in report["runs"]:
            run.pop("seconds"), run.pop("compose_ms")
        report["conformance"].pop("batches")
        return report

    assert steady(written) == steady(called)

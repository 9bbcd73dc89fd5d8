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
    # The reproducer is the request's own line, the harness's (issue 36): the same request through `cpkv replay`.
    assert report["conformance"]["reproducer"].startswith(f"cpkv replay {TINY} --backend torch --impl {REFERENCE} ")


@pytest.mark.parametrize("options, named", [
    ({"backend": "torch"}, "impl"),                                            # the class is required
    ({"backend": "torch", "impl": "no_colon"}, "impl"),                        # not module:Class
    ({"backend": "torch", "impl": REFERENCE, "device": "tpu"}, "device"),
    ({"backend": "torch", "impl": REFERENCE, "ranks": 0}, "ranks"),
    ({"backend": "torch", "impl": REFERENCE, "variant": "v2"}, "variant"),     # the class is its own variant
    ({"backend": "torch", "impl": REFERENCE, "schedule": "random"}, "schedule"),  # the simulator's option
    ({"backend": "sim", "impl": REFERENCE}, "impl"),                           # only the torch backend takes it
    ({"backend": "sim", "device": "cpu"}, "device"),
    ({"backend": "torch", "impl": REFERENCE, "ranks": 3}, "ranks: 3 ranks for a trace of cp = 2"),  # checked against the trace, in the one check
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


def conformance(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cpkv.conformance", TINY, "--impl", REFERENCE, *args], capture_output=True, text=True,
                          timeout=600)


@pytest.mark.parametrize("flag, value, option", [
    ("--wait-ms-max", "0", {"wait_ms_max": 0}),
    ("--device", "tpu", {"device": "tpu"}),
    ("--ipc-missing-rank", "5", {"ipc_missing_rank": 5}),     # a rank of the model's cap, not of the trace's cp: checked against the trace
    ("--layers", "300", {"layers": 300}),
])
def test_a_bad_option_to_the_conformance_command_is_the_request_checks_one_line(cli, flag, value, option):
    """Issue 36: `python3 -m cpkv.conformance` parses its options into the one replay request and the
    harness's check refuses a bad value: one line, exit 2, the option as `cpkv replay` spells it, the
    reason the request check gives every front end (here: cpkv.replay's, and `cpkv replay` names it too)."""
    with pytest.raises(cpkv.InputError) as called:
        cpkv.replay(TINY, backend="torch", impl=REFERENCE, ranks=2, **option)
    done = conformance("--ranks", "2", flag, value)
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.splitlines() == [f"cpkv conformance: error: {flag}: {called.value.reason}"], done.stderr
    command = subprocess.run([cli, "replay", TINY, "--backend", "torch", "--impl", REFERENCE, flag, value], capture_output=True, text=True, timeout=600)
    assert command.returncode == 2 and len(command.stderr.splitlines()) == 1 and f"error: {flag}: " in command.stderr, command


def fields(header: str) -> list:
    """The run header's first line without its front end's name: trace, cp and page, batches, layers, mode, seed."""
    return header.split(": ", 1)[1].split(" | ")


def test_the_header_and_the_json_common_part_are_cpkv_replays(cli, tmp_path):
    """Issue 36: the run header and the JSON's common part of the torch run are the harness's, as
    `cpkv replay` prints and writes them for the same trace, seed and layers (the mode names each
    backend's run; the run object has every key a `cpkv replay` run has)."""
    sim_json, torch_json = tmp_path / "sim.json", tmp_path / "torch.json"
    sim = subprocess.run([cli, "replay", TINY, "--variant", "staging_direct", "--seed", "5", "--layers", "2", "--json", str(sim_json)],
                         capture_output=True, text=True, timeout=600)
    torch_run = conformance("--ranks", "2", "--seed", "5", "--layers", "2", "--json", str(torch_json))
    assert sim.returncode == 0 and torch_run.returncode == 0, sim.stderr + torch_run.stdout + torch_run.stderr
    sim_header, torch_header = sim.stdout.splitlines()[0], torch_run.stdout.splitlines()[0]
    assert sim_header.startswith("cpkv replay: ") and torch_header.startswith("cpkv conformance: "), torch_header
    sim_fields, torch_fields = fields(sim_header), fields(torch_header)
    assert len(torch_fields) == len(sim_fields) == 6, torch_header
    assert torch_fields[:4] + torch_fields[5:] == sim_fields[:4] + sim_fields[5:], (sim_header, torch_header)
    assert torch_fields[4] == "mode conformance/processes", torch_header
    assert f"torch: impl {REFERENCE} | device cpu | ranks 2" in torch_run.stdout.splitlines(), torch_run.stdout
    knobs = [line for line in torch_run.stdout.splitlines() if line.startswith("knobs: ")]
    assert knobs == ["knobs: --import-s-max 120 (default) | --cpkv-bin the build's (default)"], torch_run.stdout
    sim_report, torch_report = json.loads(sim_json.read_text()), json.loads(torch_json.read_text())
    assert set(torch_report) - {"conformance"} == set(sim_report), torch_report.keys()
    for key in ("trace", "seed", "layers", "mutant", "rejected_batches"):
        assert torch_report[key] == sim_report[key], key
    assert set(sim_report["runs"][0]) <= set(torch_report["runs"][0]), torch_report["runs"][0].keys()
    assert set(sim_report["runs"][0]["ranks"][0]) <= set(torch_report["runs"][0]["ranks"][0])


def test_the_run_object_is_the_harness_run_json_with_what_it_cannot_observe_null():
    """Issue 36: the torch run's object is harness run_json over the figures the conformance harness
    counted: its verdict is the harness's (a failure or a violation fails the run, as every backend's),
    and the figures it cannot observe of a foreign class are null."""
    rank = {"batches": 3, "layers": 6, "barriers": None, "overflows": 1, "mismatches": 0}
    figures = {"variant": REFERENCE, "mode": "processes", "failure": "", "deadlock": False, "violations": 0, "seconds": 1.5,
               "violations_by_invariant": {str(i): 0 for i in range(1, 10)}, "ranks": [rank, dict(rank, barriers=12)], "violation_details": []}
    run = cpkv._cpkv.foreign_run_json(figures)
    assert run["passed"] is True and run["variant"] == REFERENCE and run["steps"] is None and run["mismatches"] == 0
    assert run["ranks"][0]["barriers"] is None and run["ranks"][1]["barriers"] == 12
    assert all(r[key] is None for r in run["ranks"] for key in ("collectives", "bytes_gathered_from_peers", "bytes_reduced"))
    assert cpkv._cpkv.foreign_run_json(dict(figures, failure="rank 1: died"))["passed"] is False
    failed = cpkv._cpkv.foreign_run_json(dict(figures, ranks=[dict(rank, mismatches=2), rank]))
    assert failed["passed"] is False and failed["mismatches"] == 2


def handed(args: list, fd: int, **popen) -> subprocess.CompletedProcess:
    """`python3 -m cpkv.conformance TINY --impl REFERENCE ARGS --request-fd FD`, with FD inherited."""
    return subprocess.run([sys.executable, "-m", "cpkv.conformance", TINY, "--impl", REFERENCE, *args, "--request-fd", str(fd)],
                          capture_output=True, text=True, timeout=600, pass_fds=(fd,), **popen)


def checked_run_file(tmp_path: Path, options: dict, name: str = "checked.json") -> int:
    """The checked run the harness's one check returns for these options, in a file opened for reading."""
    path = tmp_path / name
    path.write_text(json.dumps(cpkv._cpkv.check_torch_run(TINY, dict({"impl": REFERENCE, "ranks": 2, "seed": 5}, **options))))
    return os.open(path, os.O_RDONLY)


def test_a_bad_request_fd_is_one_line_and_nothing_runs(tmp_path):
    """--request-fd is the cpkv command's: a descriptor that is not open, not a file, holds no checked
    run, or the checked run of another command is one line naming it, exit 2, nothing run (no table)."""
    def refused(done: subprocess.CompletedProcess, why: str) -> None:
        assert done.returncode == 2 and done.stdout == "", done
        assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("cpkv conformance: error: --request-fd: "), done.stderr
        assert why in done.stderr, done.stderr

    absent = subprocess.run([sys.executable, "-m", "cpkv.conformance", TINY, "--impl", REFERENCE, "--ranks", "2", "--request-fd", "987"],
                            capture_output=True, text=True, timeout=600)
    refused(absent, "987 is not an open file descriptor")
    read_end, write_end = os.pipe()
    try:
        refused(handed(["--ranks", "2"], read_end), "is not a file the cpkv command wrote")  # a pipe is never read: nothing can block
    finally:
        os.close(read_end), os.close(write_end)
    (tmp_path / "not.json").write_text('{"format": "something else"}')
    fd = os.open(tmp_path / "not.json", os.O_RDONLY)
    refused(handed(["--ranks", "2"], fd), "does not hold a checked run")
    os.close(fd)
    fd = checked_run_file(tmp_path, {"seed": 7})  # the checked run of --seed 7, handed to a command of --seed 5
    refused(handed(["--ranks", "2", "--seed", "5", "--layers", "2"], fd), "the checked run is of another command")
    os.close(fd)


def test_a_handed_run_is_read_not_checked_again(tmp_path):
    """Handed a checked run, the command prints what it holds (its header lines) and checks nothing
    again: a line added to the handed header is printed, which a check of its own would not build."""
    data = cpkv._cpkv.check_torch_run(TINY, {"impl": REFERENCE, "ranks": 2, "seed": 5})
    assert data["arguments"][2:] == [TINY, "--impl", REFERENCE, "--ranks", "2", "--seed", "5", "--layers", "2"], data["arguments"]
    data["header"]["conformance/processes"].append("handed: this line is the checked run's")
    (tmp_path / "checked.json").write_text(json.dumps(data))
    fd = os.open(tmp_path / "checked.json", os.O_RDONLY)
    done = handed(data["arguments"][5:], fd)  # after "-m cpkv.conformance TRACE --impl CLASS"
    os.close(fd)
    assert done.returncode == 0, done.stderr + done.stdout
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"cpkv conformance: {TINY} | cp 2 page 4 | 3 batches | 2 of 2 layers | mode conformance/processes | seed 5"), lines
    assert lines[0] == data["header"]["conformance/processes"][0], lines
    assert "handed: this line is the checked run's" in lines, done.stdout

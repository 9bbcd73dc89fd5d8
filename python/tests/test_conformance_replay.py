"""Every replay line reproduces its run (issue 35, item 7e).

Why it matters: a reproducer that drops what was run sends its reader chasing a pass. A foreign
implementation's planted bug is its own business: a constructor argument (`--impl
module:Class(k=v)`, `--impl-arg k=v`) or an environment variable; the replay line must keep both,
and the wait bound (`--wait-ms-max`, once `--window`) and `--no-delays`, and the pytest plugin must name the counterexample by that bug.
The tests run the printed line itself (its `python3` is the suite's interpreter) and check that it
fails as the original did.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from cpkv.conformance import ContractError  # noqa: E402
from cpkv.conformance._impl_spec import format_impl, parse_impl, parse_impl_args, resolve  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("CPKV_SOURCE_DIR", os.path.join(HERE, "..", ".."))
TINY = os.path.join(SOURCE, "traces", "samples", "tiny.jsonl")
RACES = os.path.join(HERE, "conformance_races.py")
RUN_S_MAX = 300


@pytest.fixture(scope="module")
def shell_env(tmp_path_factory):
    """The suite's environment with `python3` on PATH being this interpreter (the one with torch) and
    `cpkv` the build's command (a reproducer is `cpkv replay ... --backend torch`, which runs the
    conformance harness under CPKV_PYTHON: this interpreter)."""
    bin_dir = tmp_path_factory.mktemp("bin")
    os.symlink(sys.executable, bin_dir / "python3")
    cli = os.environ.get("CPKV_CLI", os.path.join(SOURCE, "build", "cli", "cpkv"))
    if not os.access(cli, os.X_OK):
        pytest.fail(f"the cpkv command is not at {cli} (set CPKV_CLI): the replay lines run it")
    os.symlink(cli, bin_dir / "cpkv")
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}:{env.get('PATH', '')}"
    env.pop("CPKV_TEST_FOREIGN_BUG", None)
    env["CPKV_PYTHON"] = sys.executable
    return env


def cli(args, env):
    return subprocess.run([sys.executable, "-m", "cpkv.conformance", *args], capture_output=True, text=True, timeout=RUN_S_MAX, env=env)


def replay_line(stdout: str) -> str:
    lines = [line for line in stdout.splitlines() if line.startswith("replay: ")]
    assert len(lines) == 1, stdout
    return lines[0][len("replay: "):]


def run_line(line: str, env):
    return subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=RUN_S_MAX, env=env)


def first_finding(stdout: str) -> str:
    """The first located line, without the counts that depend on the run's timing."""
    for line in stdout.splitlines():
        if line.startswith(("mismatch: ", "invariant ")):
            return re.sub(r"\(\d+ wrong bytes\)", "", line)
    return ""


def test_constructor_arguments_are_python_literals_never_code():
    assert parse_impl("m:C(bug='skip_zero', n=3, t=(1, 2))") == ("m:C", {"bug": "skip_zero", "n": 3, "t": (1, 2)})
    assert parse_impl("pkg/file.py:C") == ("pkg/file.py:C", {})
    assert parse_impl_args(["flag=True", "name='x'"]) == {"flag": True, "name": "x"}
    assert format_impl("m:C", {"n": 3, "bug": "skip_zero"}) == 'm:C(bug="skip_zero", n=3)'
    assert parse_impl(format_impl("m:C", {"d": {"a": [1, None]}})) == ("m:C", {"d": {"a": [1, None]}})
    for bad in ("m:C(x=__import__('os').system('true'))", "m:C(1)", "m:C(**k)", "m:C(x=open)"):
        with pytest.raises(ContractError):
            parse_impl(bad)
    with pytest.raises(ContractError, match="given twice"):
        resolve("m:C(bug=1)", ["bug=2"])
    with pytest.raises(ContractError, match="NAME=VALUE"):
        parse_impl_args(["bug"])


def test_one_reproducer_builder_says_everything_a_case_ran_with():
    """Issue 36, item 2: the command line's failures, the pytest plugin's counterexamples and the
    shrunk cases print one builder's line (the shrunk case's dropped constructor arguments, delays
    and the wait bound); it spells the options as `cpkv replay` does."""
    import cpkv
    from cpkv.conformance import _shrink
    from cpkv.conformance._impl_spec import spec_reproducer
    from cpkv.conformance._rank import RunSpec
    reader = cpkv.read_trace(TINY)
    spec = RunSpec(impl=f"{RACES}:Configurable", setting=reader.setting, batches=list(reader)[:1], layers=2, seed=5, device="cpu",
                   delays=False, mutant=None, window_s=7.0, ipc_fail_rank=1, impl_kwargs={"bug": "skip_zero"}, require_attention=True)
    line = spec_reproducer(spec, "case.jsonl")
    # The harness's line for the same request (harness/src/request.cpp: replay_line), not one built here.
    assert line.startswith(f"cpkv replay case.jsonl --backend torch --impl '{RACES}:Configurable(bug=\"skip_zero\")' "), line
    for said in ('bug="skip_zero"', "--ranks 2", "--seed 5", "--layers 2", "--no-delays", "--wait-ms-max 7000", "--ipc-missing-rank 1",
                 "--require-attention"):
        assert said in line, line
    assert "--window" not in line and "--ipc-fail-rank" not in line, line
    assert _shrink.reproducer(spec, "case.jsonl") == line
    assert "--batch 3" in spec_reproducer(spec, "t.jsonl", batch=3)


def test_a_bad_impl_argument_is_one_line_and_exit_2(shell_env):
    done = cli([TINY, "--impl", "cpkv.conformance.reference:StagingDirect", "--ranks", "2", "--impl-arg", "mutant=skip zero"], shell_env)
    assert done.returncode == 2, done
    assert done.stderr.strip().count("\n") == 0 and "--impl-arg mutant=skip zero" in done.stderr, done.stderr


def test_a_replay_line_keeps_constructor_arguments_window_and_delays_and_fails_again(shell_env):
    impl = f"{RACES}:Configurable(bug='skip_zero', note='kept')"
    done = cli([TINY, "--impl", impl, "--ranks", "2", "--seed", "4", "--window", "7", "--no-delays"], shell_env)
    assert done.returncode == 1, done.stdout + done.stderr
    line = replay_line(done.stdout)
    for kept in ("--wait-ms-max 7000", "--no-delays", "--seed 4", 'bug="skip_zero"', 'note="kept"'):
        assert kept in line, line
    # Issue 36: the reproducer is the request's, from the harness: `cpkv replay` with the torch backend.
    assert line.startswith(f"cpkv replay {TINY} --backend torch --impl "), line
    again = run_line(line, shell_env)
    assert again.returncode == 1, again.stdout + again.stderr
    assert "FAIL: bytes" in again.stdout and first_finding(again.stdout) == first_finding(done.stdout), again.stdout
    assert replay_line(again.stdout) == line, again.stdout  # the replay of a replay is the same line


def test_impl_arg_passes_the_same_arguments(shell_env):
    done = cli([TINY, "--impl", f"{RACES}:Configurable", "--impl-arg", "bug='skip_zero'", "--ranks", "2", "--no-delays"], shell_env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert 'Configurable(bug="skip_zero")' in replay_line(done.stdout)


def test_a_planted_bug_in_an_environment_variable_is_named_in_the_replay_line(shell_env):
    env = dict(shell_env, CPKV_TEST_FOREIGN_BUG="skip_zero")
    done = cli([TINY, "--impl", f"{RACES}:BugFromEnvironment", "--ranks", "2", "--seed", "2", "--no-delays"], env)
    assert done.returncode == 1, done.stdout + done.stderr
    line = replay_line(done.stdout)
    assert line.startswith("CPKV_TEST_FOREIGN_BUG=skip_zero "), line
    again = run_line(line, shell_env)  # the variable is not in this environment: only the line sets it
    assert again.returncode == 1, again.stdout + again.stderr
    assert first_finding(again.stdout) == first_finding(done.stdout), again.stdout


def knobs_line(stdout: str) -> str:
    lines = [line for line in stdout.splitlines() if line.startswith("knobs: ")]
    assert len(lines) == 1, stdout
    return lines[0]


def test_a_knob_from_the_environment_is_in_the_header_and_the_replay_line_and_replays_without_it(shell_env):
    """Issue 36, item 3: the environment's knobs (CPKV_IMPORT_S_MAX, CPKV_BIN) are read at the command
    line's edge only, printed in the header with what chose them, and written into the replay line as
    flags, so the line replays the same run whatever the next shell sets."""
    env = dict(shell_env, CPKV_IMPORT_S_MAX="90", CPKV_BIN="/nonexistent/cpkv")
    done = cli([TINY, "--impl", f"{RACES}:Configurable(bug='skip_zero')", "--ranks", "2", "--no-delays", "--layers", "2"], env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "--import-s-max 90 (CPKV_IMPORT_S_MAX)" in knobs_line(done.stdout), done.stdout
    assert "--cpkv-bin /nonexistent/cpkv (CPKV_BIN)" in knobs_line(done.stdout), done.stdout
    line = replay_line(done.stdout)
    assert "--import-s-max 90" in line and "--cpkv-bin /nonexistent/cpkv" in line, line
    clean = {k: v for k, v in shell_env.items() if k not in ("CPKV_IMPORT_S_MAX", "CPKV_BIN")}
    again = run_line(line, clean)
    assert again.returncode == 1, again.stdout + again.stderr
    assert "--import-s-max 90 (--import-s-max)" in knobs_line(again.stdout), again.stdout
    assert "--cpkv-bin /nonexistent/cpkv (--cpkv-bin)" in knobs_line(again.stdout), again.stdout
    plain = cli([TINY, "--impl", f"{RACES}:Configurable(bug='skip_zero')", "--ranks", "2", "--no-delays", "--layers", "2"], clean)
    assert "--import-s-max 120 (default)" in knobs_line(plain.stdout), plain.stdout
    assert "--import-s-max" not in replay_line(plain.stdout)


def test_a_bad_knob_in_the_environment_is_one_line_naming_it(shell_env):
    done = cli([TINY, "--impl", "cpkv.conformance.reference:StagingDirect", "--ranks", "2"], dict(shell_env, CPKV_IMPORT_S_MAX="soon"))
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.strip().count("\n") == 0 and "--import-s-max: CPKV_IMPORT_S_MAX=soon is not a number of seconds" in done.stderr, done.stderr


PLUGIN_TEST = textwrap.dedent('''
    import cpkv

    def test_foreign(cpkv_conformance):
        reader = cpkv.read_trace({trace!r})
        cpkv_conformance({impl!r}, reader.setting, list(reader)[:1], impl_kwargs={{"bug": "skip_zero"}}, delays=False, window_s=7.0)
''')


def test_the_pytest_plugin_names_a_foreign_bugs_counterexample_by_its_bug_and_its_replay_fails(tmp_path, shell_env):
    (tmp_path / "test_foreign.py").write_text(PLUGIN_TEST.format(trace=TINY, impl=f"{RACES}:Configurable"))
    out = tmp_path / "cex"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "cpkv.pytest_plugin", str(tmp_path / "test_foreign.py"),
                           "--cpkv-counterexamples", str(out)], capture_output=True, text=True, timeout=RUN_S_MAX, env=shell_env, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    written = sorted(os.listdir(out))
    assert written == ["counterexample-Configurable-skip_zero-seed1.jsonl"], written
    shown = [part.split("replay: ", 1)[1] for part in done.stdout.splitlines() if "replay: " in part]
    assert shown, done.stdout
    line = shown[0]
    assert 'bug="skip_zero"' in line and "--no-delays" in line and "--wait-ms-max 7000" in line, line
    again = run_line(line, shell_env)
    assert again.returncode == 1 and "FAIL: bytes" in again.stdout, again.stdout + again.stderr

"""The conformance launcher against hostile runs (issue 34's Python side, issue 35 item 7 a, c, d, f;
docs/reliability.md, "Third audit: Python front end"): a killed or interrupted launcher, ranks that
die or fork, an --impl whose import exits or hangs, outputs aimed at an input, bad options.

Why it matters: the harness runs foreign code beside a user's own work. A launcher that overwrites
its input, leaves ranks running after it is killed, reads a pass where an import exited, or blames
the wrong rank costs the user data, machines or a day of chasing the wrong bug.

No test waits on a short clock: each waits for logical progress (a file a rank writes, a process
gone) under a generous bound, which only a broken launcher reaches.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")

import cpkv  # noqa: E402
from cpkv import conformance  # noqa: E402
from cpkv.conformance import _launch, _shm  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # the spawned ranks import launcher_ranks by name (the late-done rank body)
import launcher_ranks  # noqa: E402

SOURCE = os.environ.get("CPKV_SOURCE_DIR", os.path.join(HERE, "..", ".."))
TINY = os.path.join(SOURCE, "traces", "samples", "tiny.jsonl")
RANKS = os.path.join(HERE, "launcher_ranks.py")
REFERENCE = "cpkv.conformance.reference:StagingDirect"
CLI_TIMEOUT_S = 180
GONE_S_MAX = 60.0  # a bound only: processes that must die are gone long before on any machine
# The window of a case whose peer must run into its barrier's timeout: above a loaded 2-core
# machine's stall in the setup before it (a 1.5 s window could time a healthy setup out).
WINDOW_S = 5.0


def conformance_cli(*args: str, env=None, timeout=CLI_TIMEOUT_S):
    return subprocess.run([sys.executable, "-m", "cpkv.conformance", *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))


class Done:
    """What main() did in-process: returncode, stdout, stderr (as subprocess.run's result)."""

    def __init__(self, returncode, stdout, stderr) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr

    def __repr__(self) -> str:
        return f"Done({self.returncode}, stdout={self.stdout!r}, stderr={self.stderr!r})"


def main_in_process(capsys, *args: str) -> Done:
    """`python3 -m cpkv.conformance ARGS` as a call of its main() here: every refusal before a rank
    starts is the same code, without another interpreter importing torch (the suite's time)."""
    from cpkv.conformance.__main__ import main

    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as exit_:  # argparse's refusals
        code = exit_.code
    out, err = capsys.readouterr()
    return Done(code, out, err)


def one_error_line(done, code=2) -> str:
    assert done.returncode == code, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cpkv conformance: error: "), done.stderr
    assert "Traceback" not in done.stderr and done.stdout == "", done  # before any rank: not even the header
    return lines[0]


def wait_for(predicate, what: str, bound_s: float = GONE_S_MAX) -> None:
    deadline = time.monotonic() + bound_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {bound_s:.0f} s"
        time.sleep(0.05)


def processes_with(marker: str) -> list:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker.encode() in f.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                pass
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.fixture
def trace_copy(tmp_path):
    path = tmp_path / "t.jsonl"
    shutil.copy(TINY, path)
    return path


@pytest.fixture
def setting_batches():
    reader = cpkv.read_trace(TINY)
    return reader.setting, list(reader)


# --- item 1 and item 7: outputs checked before any rank starts, never an input, written whole ---

@pytest.mark.parametrize("option", ["--json", "--timeline"])
def test_an_output_that_is_the_trace_is_refused_and_the_trace_kept(trace_copy, option):
    before = trace_copy.read_bytes()
    line = one_error_line(conformance_cli(str(trace_copy), "--impl", REFERENCE, "--ranks", "2", option, str(trace_copy)))
    assert f"{option}: {trace_copy} is the same file as the input" in line
    assert trace_copy.read_bytes() == before


def test_run_trace_refuses_a_timeline_that_is_its_trace(trace_copy):
    before = trace_copy.read_bytes()
    with pytest.raises(cpkv.InputError, match="is the same file as the input"):
        conformance.run_trace(str(trace_copy), REFERENCE, timeline=str(trace_copy))
    assert trace_copy.read_bytes() == before


def _bad_outputs(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    os.symlink(tmp_path / "loop", tmp_path / "loop")
    (tmp_path / "folder").mkdir()
    return {"a missing folder": str(tmp_path / "no" / "r.json"), "a folder": str(tmp_path / "folder"),
            "/dev/full": "/dev/full", "/proc": "/proc/version", "a link loop": str(tmp_path / "loop"),
            "a FIFO": str(tmp_path / "fifo"), "a file under a link loop": str(tmp_path / "loop" / "r.json")}


def test_an_output_that_cannot_be_a_file_is_refused_by_the_clis_rules(tmp_path):
    from cpkv import _outputs

    for what, path in _bad_outputs(tmp_path).items():
        with pytest.raises(cpkv.InputError) as error:
            _outputs.check_output("--json", path)
        assert str(error.value).startswith("--json: ") and path in str(error.value), (what, error.value)


@pytest.mark.parametrize("option, what", [("--json", "a FIFO"), ("--timeline", "/proc"), ("--json", "a missing folder")])
def test_an_output_that_cannot_be_a_file_is_one_line_before_any_rank(tmp_path, capsys, option, what):
    path = _bad_outputs(tmp_path)[what]
    line = one_error_line(main_in_process(capsys, TINY, "--impl", REFERENCE, "--ranks", "2", option, path))
    assert f"{option}: " in line and path in line, line


def test_two_outputs_naming_one_file_are_refused(tmp_path, capsys):
    target = tmp_path / "x.json"
    line = one_error_line(main_in_process(capsys, TINY, "--impl", REFERENCE, "--ranks", "2", "--json", str(target), "--timeline", str(target)))
    assert "--timeline" in line and "is the same file as --json" in line


WRITE_CHILD = r"""
import resource, signal, sys
from cpkv import _outputs
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
out = _outputs.check_output("--json", sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # the disk is full after 4 KiB
try:
    _outputs.write_output(out, b"x" * 100000)
except _outputs.OutputWriteError as error:
    print(error)
"""


def test_a_write_that_fails_midway_leaves_the_old_output_whole(tmp_path):
    old = tmp_path / "r.json"
    old.write_text('{"old": true}')
    done = subprocess.run([sys.executable, "-c", WRITE_CHILD, str(old)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done
    assert "--json: cannot write" in done.stdout and "the file was left as it was" in done.stdout, done.stdout
    assert old.read_text() == '{"old": true}'
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary left beside it


# --- item 15: options refused in one line, exit 2, before any rank ---

BAD_OPTIONS = {
    # Issue 36: the values are checked by the one request check (harness check_request and
    # check_source), which names the option as `cpkv replay` spells it; --window (seconds) and
    # --ipc-fail-rank are old spellings, their values checked as the request's milliseconds and rank.
    "--window 0": (["--window", "0"], "--wait-ms-max: 0 is not in 1..3600000"),
    "--window -5": (["--window", "-5"], "--wait-ms-max: -5000 is not in 1..3600000"),
    "--window nan": (["--window", "nan"], "--window: 'nan' is not a number of seconds"),
    "--window inf": (["--window", "inf"], "--window: 'inf' is not a number of seconds"),
    "--window 1e300": (["--window", "1e300"], "--window: '1e300' is not a number of seconds"), "--seed -1": (["--seed", "-1"], "--seed"),
    "--seed 2**64": (["--seed", str(2 ** 64)], "--seed"), "--ipc-fail-rank 7": (["--ipc-fail-rank", "7"], "--ipc-missing-rank: 7 is not a rank of cp = 2"),
    "--ipc-missing-rank 2": (["--ipc-missing-rank", "2"], "--ipc-missing-rank: 2 is not a rank of cp = 2"),
    "--ranks abc": (["--ranks", "abc"], "--ranks: 'abc' is not a whole number"),
    "--wait-ms-max 0": (["--wait-ms-max", "0"], "--wait-ms-max: 0 is not in 1..3600000"),
    "--wait-ms-max nan": (["--wait-ms-max", "nan"], "--wait-ms-max: 'nan' is not a whole number"),
    "--wait-ms-max and --window": (["--wait-ms-max", "5000", "--window", "5"], "not both"),
    "--device gpu": (["--device", "gpu"], "--device: 'gpu' is neither cpu nor cuda"),
    "--layers 0": (["--layers", "0"], "--layers: 0 is not 'all' or a number in 1..256"),
    "--batch 9": (["--batch", "9"], "--batch: 9 is not in "),
    "--import-s-max 0": (["--import-s-max", "0"], "--import-s-max: 0 is not a number of seconds in (0, 3600]"),
}


@pytest.mark.parametrize("name", sorted(BAD_OPTIONS))
def test_a_bad_option_is_one_line_and_exit_2_before_any_rank(capsys, name):
    extra, option = BAD_OPTIONS[name]
    ranks = [] if "--ranks" in extra else ["--ranks", "2"]
    line = one_error_line(main_in_process(capsys, TINY, "--impl", REFERENCE, *ranks, *extra))
    assert option in line, line


def test_a_bad_option_from_the_command_line_is_one_line():
    """The same from a shell: argparse's usage dump replaced, nothing else printed."""
    line = one_error_line(conformance_cli(TINY, "--impl", REFERENCE, "--ranks", "2", "--window", "nan"))
    assert "--window: 'nan' is not a number of seconds" in line


def test_no_ranks_names_the_option_and_the_traces_cp(capsys):
    line = one_error_line(main_in_process(capsys, TINY, "--impl", REFERENCE))
    assert "--ranks: required" in line and "cp is 2" in line and "None" not in line


def test_a_world_size_that_is_not_a_number_is_one_line(capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "abc")
    monkeypatch.setenv("RANK", "0")
    line = one_error_line(main_in_process(capsys, TINY, "--impl", REFERENCE))
    assert "WORLD_SIZE: 'abc' is not a number of ranks" in line


def test_a_header_only_trace_is_one_line(tmp_path, capsys):
    header = tmp_path / "header.jsonl"
    header.write_text(open(TINY).readline())
    line = one_error_line(main_in_process(capsys, str(header), "--impl", REFERENCE, "--ranks", "2"))
    assert "holds no batch" in line


def test_a_trace_that_is_a_fifo_is_refused_without_opening_it(tmp_path, capsys):
    """Item 12: a FIFO as the trace is one line and exit 2 at once, never opened (an open for
    reading waits for a writer; with none, the old launcher blocked). A writer process waits at the
    FIFO with a trace's header: the old launcher opened the FIFO, read the header and refused a
    header-only trace; the new one never opens it, and the test lets the writer go at the end."""
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    writer = subprocess.Popen(["sh", "-c", f"head -n 1 '{TINY}' > '{fifo}'"])
    try:
        done = main_in_process(capsys, str(fifo), "--impl", REFERENCE, "--ranks", "2")
    finally:
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader at last: the writer's open returns, it writes and ends
        writer.wait(timeout=GONE_S_MAX)
        os.close(reader)
    line = one_error_line(done)
    assert f"trace: {fifo} is a pipe, not a regular file" in line, line
    with pytest.raises(cpkv.InputError, match="is a pipe, not a regular file"):
        conformance.run_trace(str(fifo), REFERENCE)


def test_device_cuda_without_a_gpu_is_refused_before_any_rank(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: nothing to refuse")
    line = one_error_line(main_in_process(capsys, TINY, "--impl", REFERENCE, "--ranks", "2", "--device", "cuda"))
    assert "--device: cuda: no CUDA device" in line


# --- items 6 and 16: an --impl whose import exits, hangs, is interrupted or names no class ---

BAD_IMPORTS = {
    "sys.exit(0)": ("import sys\nsys.exit(0)\n", "called sys.exit(0)"),
    "os._exit(0)": ("import os\nos._exit(0)\n", "exited (exit code 0) before the import finished"),
    "KeyboardInterrupt": ("raise KeyboardInterrupt\n", "raised KeyboardInterrupt"),
    "SIGKILL": ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", "killed by signal 9"),
    "an int": ("Exchange = 3\n", "Exchange is int 3, not a class"),
}


@pytest.mark.parametrize("name", sorted(BAD_IMPORTS))
def test_an_impl_whose_import_misbehaves_is_one_line_and_exit_2(tmp_path, capsys, name):
    """In-process main(), as a test suite calls it: the import runs in the probe child, so even
    os._exit(0) cannot end this process."""
    body, words = BAD_IMPORTS[name]
    module = tmp_path / "engine.py"
    module.write_text(body)
    line = one_error_line(main_in_process(capsys, TINY, "--impl", f"{module}:Exchange", "--ranks", "2"))
    assert f"--impl {module}:Exchange" in line and words in line, line


def test_an_impl_that_hangs_at_import_is_bounded(tmp_path, capsys, monkeypatch):
    module = tmp_path / "engine.py"
    marker = f"cpkv-import-hang-{os.getpid()}"
    module.write_text(f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', {marker!r}])\n"
                      "time.sleep(600)\n")
    monkeypatch.setenv("CPKV_IMPORT_S_MAX", "3")
    line = one_error_line(main_in_process(capsys, TINY, "--impl", f"{module}:Exchange", "--ranks", "2"))
    assert "did not finish within 3 s" in line
    wait_for(lambda: not processes_with(marker), "the process the import started")


def test_an_impl_file_with_a_dataclass_and_a_sibling_import_runs(tmp_path):
    """Issue 35, item 7c: `from __future__ import annotations` with a @dataclass needs the module in
    sys.modules while it runs; `import helper` needs the file's folder on sys.path."""
    (tmp_path / "engine_helper.py").write_text("FACTOR = 1\n")
    (tmp_path / "engine.py").write_text(
        "from __future__ import annotations\nfrom dataclasses import dataclass\nimport engine_helper\n"
        "from cpkv.conformance.reference import StagingDirect\n\n@dataclass\nclass Knobs:\n    factor: int = engine_helper.FACTOR\n\n"
        "class Exchange(StagingDirect):\n    knobs: Knobs = Knobs()\n")
    done = conformance_cli(TINY, "--impl", f"{tmp_path / 'engine.py'}:Exchange", "--ranks", "2", "--batch", "0", "--layers", "2")
    assert done.returncode == 0, done


# --- items 5, 17, 18, 19: ranks die with their launcher; what they fork dies with them ---

def _start_hanging_run(tmp_path, marker: str, impl: str = "Hangs") -> subprocess.Popen:
    env = dict(os.environ, CPKV_TEST_DIR=str(tmp_path), CPKV_TEST_MARKER=marker, CPKV_TEST_HANG="1")
    launcher = subprocess.Popen([sys.executable, "-m", "cpkv.conformance", TINY, "--impl", f"{RANKS}:{impl}", "--ranks", "2",
                                 "--layers", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                start_new_session=True)
    mark = "forked" if impl == "Forks" else "running"
    wait_for(lambda: all((tmp_path / f"{mark}.{r}").exists() for r in range(2)), "both ranks in compose_layer", CLI_TIMEOUT_S)
    return launcher


def _rank_pids(tmp_path, mark: str) -> list:
    return [int((tmp_path / f"{mark}.{r}").read_text()) for r in range(2)]


def _files_of(pid: int) -> list:
    return [p for p in _shm.leftovers() if os.path.basename(p).startswith(f"{_shm.PREFIX}{pid}-")]


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP])
def test_a_killed_launcher_takes_its_ranks_and_their_processes_with_it(tmp_path, signum):
    marker = f"cpkv-sleeper-{os.getpid()}-{int(signum)}"
    launcher = _start_hanging_run(tmp_path, marker, impl="Forks")
    ranks = _rank_pids(tmp_path, "forked")
    assert len(processes_with(marker)) == 6  # three per rank: a child, a detached child, a daemon
    os.kill(launcher.pid, signum)
    launcher.communicate(timeout=CLI_TIMEOUT_S)
    wait_for(lambda: not any(alive(p) for p in ranks), "the ranks")
    wait_for(lambda: not processes_with(marker), "the processes the implementation started")
    _shm.sweep_stale()  # the next run's sweep: the dead launch's lock is free
    assert _files_of(launcher.pid) == []


def test_ctrl_c_is_one_line_exit_130_and_stops_every_rank(tmp_path):
    marker = f"cpkv-sleeper-{os.getpid()}-int"
    launcher = _start_hanging_run(tmp_path, marker)
    ranks = _rank_pids(tmp_path, "running")
    os.killpg(launcher.pid, signal.SIGINT)  # the terminal's Ctrl-C: the whole foreground group
    out, err = launcher.communicate(timeout=CLI_TIMEOUT_S)
    assert launcher.returncode == 130, (out, err)
    assert err.strip().splitlines() == ["cpkv conformance: interrupted (every rank stopped)"], err
    wait_for(lambda: not any(alive(p) for p in ranks), "the ranks")
    assert _files_of(launcher.pid) == []


def test_what_an_implementation_forks_ends_with_a_passing_run(tmp_path, monkeypatch, setting_batches):
    marker = f"cpkv-sleeper-{os.getpid()}-pass"
    monkeypatch.setenv("CPKV_TEST_DIR", str(tmp_path))
    setting, batches = setting_batches
    outcome = conformance.run(f"{RANKS}:Forks", setting, batches[:1], layers=1, impl_kwargs={"marker": marker})
    assert outcome.passed, outcome.failure
    wait_for(lambda: not processes_with(marker), "the processes the implementation started")


def test_the_sweep_keeps_a_live_launchs_files_and_removes_a_dead_ones():
    """Item 19: liveness by the launch's held lock, not its pid (a pid of another PID namespace, or
    one that was never alive here, says nothing)."""
    import fcntl

    run = _shm.run_id(2 ** 22 + 12345, 7)  # above any pid_max: the old sweep judged this launch dead
    lock_path = os.path.join(_shm.SHM_DIR, f"{_shm.PREFIX}{run}.lock")  # what a launch holds (RunLock)
    lock = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    path = _shm.path_of(run, "positions", 0)
    _shm.create_file(path, 64)
    try:
        _shm.sweep_stale()
        assert os.path.exists(path), "a live launch's file was swept"
    finally:
        os.close(lock)  # the launch dies without its teardown: the lock is free, its files stay
    _shm.sweep_stale()
    left = [p for p in (path, lock_path) if os.path.exists(p)]
    for p in left:
        os.unlink(p)
    assert left == [], "a dead launch's files were not swept"


def _shm_names_of(pids) -> set:
    """The /dev/shm names the processes have mapped (named semaphores are mapped files: sem.mp-*)."""
    names = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        for line in lines:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/dev/shm/") and not fields[5].endswith(" (deleted)"):
                names.add(os.path.basename(fields[5]))
    return names


def _group_of(pgid: int) -> list:
    return [int(e) for e in os.listdir("/proc") if e.isdigit() and _pgid(int(e)) == pgid]


def _pgid(pid: int) -> int:
    try:
        return os.getpgid(pid)
    except OSError:
        return -1


def test_a_sigkilled_launch_leaves_nothing_in_dev_shm_after_the_next_run_and_a_live_ones_stay(tmp_path, setting_batches):
    """Items 5 and 19: SIGKILL to the launcher's whole process group (its resource tracker too, as a
    container stop does): the next run leaves none of its names in /dev/shm (the multiprocessing
    Queue's semaphores sem.mp-* stayed for good: no sweep can tell whose a random name is), and a run
    made while it lived kept every one of its names."""
    launcher = _start_hanging_run(tmp_path, f"cpkv-sleeper-{os.getpid()}-shm")
    ranks = _rank_pids(tmp_path, "running")
    names = _shm_names_of(_group_of(launcher.pid) + ranks) | {os.path.basename(p) for p in _files_of(launcher.pid)}
    assert any(n.startswith(f"{_shm.PREFIX}{launcher.pid}-") for n in names), names  # its positions file, at least
    setting, batches = setting_batches
    live = conformance.run(REFERENCE, setting, batches[:1], layers=1)  # a run beside a live one: sweeps nothing of it
    assert live.passed, live.failure
    assert [n for n in names if not os.path.exists(os.path.join(_shm.SHM_DIR, n))] == [], "a live run's file was swept"
    os.killpg(launcher.pid, signal.SIGKILL)
    launcher.communicate(timeout=CLI_TIMEOUT_S)
    wait_for(lambda: not any(alive(p) for p in ranks + _group_of(launcher.pid)), "the ranks and the launcher's group")
    after = conformance.run(REFERENCE, setting, batches[:1], layers=1)  # the next run: its sweep
    assert after.passed, after.failure
    left = sorted(n for n in names if os.path.exists(os.path.join(_shm.SHM_DIR, n)))
    for n in left:
        if n.startswith("sem."):
            os.unlink(os.path.join(_shm.SHM_DIR, n))  # what the old launcher left: not for the next test to see
    assert left == [], f"the killed run's names left in /dev/shm: {left}"


# --- issue 35, item 7: (a) no false death at the end, (f) a death named first, (d) the group rebuilt ---

class LateDoneLauncher(_launch.Launcher):
    rank_target = staticmethod(launcher_ranks.late_done_rank)


def test_a_rank_that_exited_after_reporting_is_not_a_death_when_a_peers_report_is_late(tmp_path, monkeypatch, setting_batches):
    monkeypatch.setenv("CPKV_TEST_DIR", str(tmp_path))
    setting, batches = setting_batches
    spec = conformance.case(REFERENCE, setting, batches[:1], layers=2)
    outcomes = LateDoneLauncher([spec]).run()
    assert outcomes[0].passed, outcomes[0].failure
    assert outcomes[0].leftovers == []


@pytest.mark.parametrize("mode, words", [("sigkill", "died (signal 9 SIGKILL"), ("exit3", "died (exit code 3) without a report"),
                                         ("last_words", "died (exit code 3) without a report; its stderr ended: "
                                                        "cpkv-test: the last words before exit 3")])
def test_a_rank_that_dies_is_named_before_its_peers_consequent_error(setting_batches, mode, words):
    setting, batches = setting_batches
    outcome = conformance.run(f"{RANKS}:DiesInLayer0", setting, batches[:1], layers=2, window_s=60, impl_kwargs={"mode": mode})
    assert outcome.failure_kind == "died", outcome.failure
    assert outcome.failure.startswith("rank 0 batch 0 layer 0 in compose_layer: " + words), outcome.failure
    assert outcome.leftovers == []


def test_sys_exit_in_compose_layer_is_a_located_raise_not_a_silent_exit(setting_batches):
    """A rank whose implementation calls sys.exit(0) reports it (SystemExit is not an Exception, and
    escaped the rank's report: exit 0 without a report, named only as a death)."""
    setting, batches = setting_batches
    outcome = conformance.run(f"{RANKS}:DiesInLayer0", setting, batches[:1], layers=2, window_s=60, impl_kwargs={"mode": "sys_exit"})
    assert outcome.failure_kind == "raised", outcome.failure
    assert outcome.failure.startswith("rank 0 batch 0 layer 0 in compose_layer: SystemExit: 0 (at "), outcome.failure
    assert "launcher_ranks.py" in outcome.failure, outcome.failure
    assert outcome.leftovers == []


class ReadsAfterEveryExitLauncher(_launch.Launcher):
    """A launcher that gets no CPU until every rank has exited (a loaded machine): it reads the ranks'
    reports only then, every pipe at once, rank 0's first."""

    def watch(self) -> None:
        for p in self.processes:
            p.join(GONE_S_MAX)
        super().watch()


def test_a_capture_control_refused_by_both_ranks_is_named_when_the_launcher_reads_after_both_exited(setting_batches):
    """Issue 35, item 9: under load the launcher named "rank 1 in setup: died (exit code 1) without a
    report" for a cp-1 control at cp 2, whose ranks both refused in setup and reported it: rank 1's
    report was in its pipe when rank 0's was read, and rank 1's exit was taken for a silent death."""
    setting, batches = setting_batches
    spec = conformance.case("cpkv.conformance.controls:PrecomputedGather", setting, batches[:1], layers=2, window_s=60)
    outcome = ReadsAfterEveryExitLauncher([spec]).run()[0]
    assert outcome.failure_kind == "raised", outcome.failure
    assert "is a cp 1 control" in outcome.failure and "this run has cp 2" in outcome.failure, outcome.failure
    assert outcome.leftovers == []


@pytest.mark.parametrize("first", [0, 1])
def test_of_two_ranks_that_reported_and_exited_the_first_raise_is_named(tmp_path, monkeypatch, setting_batches, first):
    """The rank that raised first is named, whichever pipe is read first: the other's raise came after
    the first rank had exited (a consequence), and neither is a death without a report."""
    monkeypatch.setenv("CPKV_TEST_DIR", str(tmp_path))
    setting, batches = setting_batches
    spec = conformance.case(f"{RANKS}:RaisesInSetupThenPeerRaises", setting, batches[:1], layers=2, window_s=60,
                            impl_kwargs={"first": first})
    outcome = ReadsAfterEveryExitLauncher([spec]).run()[0]
    assert outcome.failure_kind == "raised", outcome.failure
    assert outcome.failure.startswith(f"rank {first} in setup: ValueError: the first raise"), outcome.failure
    assert outcome.leftovers == []


def test_after_a_raise_and_a_peers_timeout_the_next_case_passes(setting_batches):
    """(d) the raising case's peer runs into its barrier's timeout (WINDOW_S); the next, correct case of
    the same run_cases (its own window generous) runs in a fresh group and passes. The old launcher
    kept the session's broken group for it."""
    setting, batches = setting_batches
    raising = conformance.case(f"{RANKS}:RaisesWhilePeerWaits", setting, batches[:1], layers=2, window_s=WINDOW_S)
    correct = conformance.case(REFERENCE, setting, batches[:2], layers=2, window_s=600)
    first, second = conformance.run_cases([raising, correct])
    assert first.failure_kind == "raised", first.failure
    assert second.passed, second.failure
    assert [b["batch"] for b in second.batches] == [0, 1], "the second case was not run"


def test_a_raise_is_reported_at_once_and_the_next_case_runs_in_a_fresh_group(setting_batches):
    """(f) the raise is named while its peer still waits (a window of 600 s: the old launcher named it
    only when the peer's barrier timed out); (d) the next, correct case of the same run_cases passes."""
    setting, batches = setting_batches
    raising = conformance.case(f"{RANKS}:RaisesWhilePeerWaits", setting, batches[:1], layers=2, window_s=600)
    correct = conformance.case(REFERENCE, setting, batches[:2], layers=2, window_s=600)
    first, second = conformance.run_cases([raising, correct])
    assert first.failure_kind == "raised", first.failure
    assert first.failure.startswith("rank 1 batch 0 layer 0 raised in compose_layer: ValueError: engine bug"), first.failure
    assert first.seconds < 600, "reported at the window's end"
    assert second.passed, second.failure
    assert [b["batch"] for b in second.batches] == [0, 1], "the second case was not run"


def test_a_session_of_another_cp_is_a_clear_input_error(setting_batches):
    setting, batches = setting_batches
    three = cpkv.Setting(cp=3, page_size=4, kinds=["kv_fp8"], layer_pattern="F", pool_pages=24, max_total_extend_tokens=24,
                         max_batch_requests=3)
    with conformance.Session() as session:
        assert session.run(conformance.case(REFERENCE, setting, batches[:1], layers=1)).passed
        with pytest.raises(cpkv.InputError, match="a session of cp 2 cannot run a case of cp 3"):
            session.run(conformance.case(REFERENCE, three, [cpkv.Batch([cpkv.Request(4, 3, [11])])], layers=1))

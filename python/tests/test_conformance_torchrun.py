"""The harness's torchrun mode on CPU: each process is one rank (WORLD_SIZE, RANK, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT: the environment torchrun gives it), the rendezvous is env://, rank 0
prints. Debian's torchrun (PyTorch 1.13 on Python 3.11) fails in its own launcher before it starts a
process, so the test starts the ranks with that environment itself.

Why it matters: issue 23 promises both launches; a run under torchrun must check as much as a
spawned one, and a planted bug must fail it (exit 1 on rank 0, the table and a reproducer).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("CPKV_SOURCE_DIR", os.path.join(HERE, "..", ".."))
TINY = os.path.join(SOURCE, "traces", "samples", "tiny.jsonl")
RUN_S_MAX = 150


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(*args: str):
    """Both ranks of a torchrun-style launch; returns [(exit code, stdout + stderr)] per rank."""
    port = str(_port())
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen([sys.executable, "-m", "cpkv.conformance", TINY, *args, "--window", "5"], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    out = []
    for p in procs:
        try:
            text, _ = p.communicate(timeout=RUN_S_MAX)
        except subprocess.TimeoutExpired:
            p.kill()
            text, _ = p.communicate()
        out.append((p.returncode, text))
    return out


def test_under_torchrun_the_reference_passes_and_rank_0_prints_the_table():
    (code0, text0), (code1, text1) = run_ranks("--impl", "cpkv.conformance.reference:StagingDirect")
    assert code0 == 0 and code1 == 0, text0 + text1
    assert "cpkv.conformance.reference:StagingDirect        3       4         1         0          0" in text0, text0
    assert "pass" in text0 and text1.strip() == "", text1


def test_under_torchrun_a_planted_bug_fails_on_rank_0_with_a_reproducer():
    (code0, text0), _ = run_ranks("--impl", "cpkv.conformance.reference:StagingDirect", "--mutant", "single_half")
    assert code0 == 1, text0
    # Section 9: a single parity half lets a reader see the next layer's fill (invariant 2), and the
    # wrong bytes are that layer's rows.
    assert "FAIL: " in text0 and "invariant 2 (parity-half reuse safety)" in text0, text0
    assert "replay: cpkv replay " in text0 and "--backend torch" in text0 and "--mutant single_half" in text0, text0

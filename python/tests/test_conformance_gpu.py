"""The conformance harness on CUDA: the reference implementations over CUDA IPC (peer pools and
staging shared through torch.multiprocessing's CUDA tensor sharing), their dense buffers checked on
the device (no host copy), delays as spin kernels on each rank's stream. Two ranks oversubscribe one
GPU (gloo carries the implementation's collectives then: NCCL refuses two ranks on one device), or
take one GPU each when two are visible (NCCL).

Why it matters: the kernels the harness exists for run on GPUs; a bug that only shows under real
device concurrency (a read of a peer's staging racing its next fill) must be caught there too.
Skips, saying so, without a CUDA device.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch: the gpu conformance tests need one", allow_module_level=True)

import cpkv  # noqa: E402
from cpkv import conformance  # noqa: E402

SOURCE = os.environ.get("CPKV_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
TINY = os.path.join(SOURCE, "traces", "samples", "tiny.jsonl")
WINDOW_S = 10.0
from conformance_expected import EXPECTED as _CPU_EXPECTED, GPU_BUGS  # noqa: E402

EXPECTED = {bug: _CPU_EXPECTED[bug] for bug in GPU_BUGS}
NAMES = ["correct"] + list(EXPECTED)
IMPLS = {"staging_direct": "cpkv.conformance.reference:StagingDirect", "v2": "cpkv.conformance.reference:V2"}


@pytest.fixture(scope="module")
def sessions():
    reader = cpkv.read_trace(TINY)
    batches = list(reader)
    cache = {}

    def get(impl):
        if impl not in cache:
            cases = [conformance.case(IMPLS[impl], reader.setting, batches, seed=3, device="cuda", window_s=WINDOW_S,
                                      mutant=None if n == "correct" else n) for n in NAMES]
            cache[impl] = dict(zip(NAMES, conformance.run_cases(cases)))
        return cache[impl]

    return get


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("name", NAMES)
def test_reference_on_cuda_passes_or_its_planted_bug_is_caught(sessions, impl, name):
    outcome = sessions(impl)[name]
    detail = "\n".join(outcome.mismatches + outcome.findings + [outcome.failure or ""] + outcome.positions)
    assert outcome.leftovers == []
    if name == "correct":
        assert outcome.passed, detail
    else:
        assert set(outcome.checks_fired()) & EXPECTED[name], f"{name}: fired {outcome.checks_fired()}:\n{detail}"

"""Invariant 9 on CUDA: the plan a CUDA implementation returns (a device tensor, copied to the host
by the harness) is checked every layer as on CPU, the reference attention gives the same bits on the
GPU as on the CPU, and --attention-output compares on the device. Skips, saying so, without a CUDA
device (the lead runs it on an H200: ctest -L gpu, cpkv.python.conformance_gpu).

Why it matters: the plans engines build live on the GPU beside the kernels that read them; a check
that only runs on CPU tensors would not see the plan an engine's CUDA path really hands its kernels.
Expected lines as test_attention_conformance.py's (computed by hand there from PROTOCOL.md section 11).
"""

from __future__ import annotations


import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch: the gpu attention tests need one", allow_module_level=True)

import cpkv  # noqa: E402
import cpkv.attention as attention  # noqa: E402
from cpkv import conformance  # noqa: E402
from test_attention_conformance import HEAD, IMPLS, ONE_SEQUENCE_RANK0, PLANTED, SEED, TINY  # noqa: E402

WINDOW_S = 10.0
CASES = {
    "one_sequence": dict(impl=f"{IMPLS}:AllGatherOneSequencePlan", attention_output=True),
    "per_request": dict(impl=f"{IMPLS}:AllGatherZigzag", require_attention=True, attention_output=True),
    "staging_direct": dict(impl="cpkv.conformance.reference:StagingDirect", require_attention=True, attention_output=True),
    **{bug: dict(impl="cpkv.conformance.reference:StagingDirect", mutant=bug) for bug in PLANTED},
}


@pytest.fixture(scope="module")
def outcomes():
    reader = cpkv.read_trace(TINY)
    batches = list(reader)
    specs = [conformance.case(options.pop("impl"), reader.setting, batches, seed=SEED, device="cuda", window_s=WINDOW_S, **options)
             for options in (dict(o) for o in CASES.values())]
    return dict(zip(CASES, conformance.run_cases(specs)))


def explain(outcome) -> str:
    return "\n".join(outcome.mismatches + outcome.findings + [outcome.failure or ""] + outcome.positions)


def test_the_reference_attention_gives_the_same_bits_on_cuda_as_on_cpu():
    reader = cpkv.read_trace(TINY)
    setting, batch = reader.setting, list(reader)[0]
    dense = torch.from_numpy(cpkv.expected_dense(setting, cpkv.layout_batch(setting, batch), SEED, 0, 0).reshape(-1, 656))
    plan = attention.single_device_plan(setting, batch)
    rows = torch.from_numpy(attention.query_rows(setting, batch, plan))
    q = attention.qkv_of_rows(dense[rows])[0]
    on_cpu = attention.reference(q, dense, plan)
    on_gpu = attention.reference(q.cuda(), dense.cuda(), plan)
    assert on_gpu.device.type == "cuda" and torch.equal(on_gpu.cpu(), on_cpu)


def test_a_one_sequence_plan_on_cuda_is_named_on_the_first_layer_while_its_bytes_pass(outcomes):
    o = outcomes["one_sequence"]
    assert o.mismatches == [] and o.checks_fired() == ["invariant 9"], explain(o)
    assert o.findings[0] == ONE_SEQUENCE_RANK0, explain(o)
    assert any("attention output (kind kv_fp8): query 3 (request 1 token 0) differs" in f for f in o.findings), explain(o)


@pytest.mark.parametrize("name", ["per_request", "staging_direct"])
def test_the_right_plans_pass_on_cuda_with_their_output_equal_to_the_single_device(outcomes, name):
    assert outcomes[name].passed, explain(outcomes[name])


@pytest.mark.parametrize("bug", list(PLANTED))
def test_each_planted_plan_bug_is_caught_on_cuda_by_invariant_9(outcomes, bug):
    o = outcomes[bug]
    assert o.mismatches == [] and o.checks_fired() == ["invariant 9"], explain(o)
    assert o.findings[0] == HEAD + "rank 0 batch 0 layer 0: " + PLANTED[bug], explain(o)


def test_a_cuda_plan_tensor_is_checked_like_a_host_one():
    reader = cpkv.read_trace(TINY)
    setting, batch = reader.setting, list(reader)[0]
    plan = torch.tensor([[0, 4, 2, 14, 0], [1, 4, 5, 23, 16]], device="cuda")
    found = cpkv.check_attention_plan(setting, batch, 1, attention.as_array(plan))
    assert (found.field, found.expected, found.got) == ("kv_len", 9, 23)
    assert np.array_equal(attention.as_array(plan), plan.cpu().numpy())

"""Invariant 9 under the conformance harness (issue 33): an engine's own attention plan, returned by
compose_layer beside its dense buffers, is checked every layer with the model's checker; a wrong
plan is reported as invariant 9 with the checker's located line while the bytes pass.

Why it matters: a token-split all-gather exchange, applied to batches of several requests, comes out
byte-exact while its plan takes the batch as one causal sequence (issue 33's first paragraph). The
harness must name that on the first layer, with the request, the tokens and the expected and got
kv_len, and pass the same exchange with the right plan. Every expected line is computed by hand
from PROTOCOL.md section 11 on tiny.jsonl's batch 0 (cp 2, P 4; see test_attention.py's header):
  zigzag tokens, rank 0: r0 tokens 0..1 and 5, r1 tokens 0..2 and 7..8;
  the batch as one sequence counts r0's 8 + 6 = 14 keys before r1: r1 tokens 0..2 get kv_len
  14 + 0 + 3 = 17, section 11 says 0 + 0 + 3 = 3.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import cpkv  # noqa: E402
from cpkv import conformance  # noqa: E402

SOURCE = os.environ.get("CPKV_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
TINY = os.path.join(SOURCE, "traces", "samples", "tiny.jsonl")
IMPLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conformance_impls.py")
WINDOW_S = 10.0
SEED = 3
HEAD = "invariant 9 (attention plan exactness): "
ONE_SEQUENCE_RANK0 = (HEAD + "rank 0 batch 0 layer 0: segment 2 (request 1 tokens 0..2): q_len 3 kv_len 17, the request needs kv_len 3: "
                      "kv_len counts request 0's 14 keys too: the batch taken as one sequence?")
# Rank 1 of the zigzag token split: r0 tokens 2..3 and 4, r1 tokens 3..4 (kv_len 14 + 5 = 19, needs 5) and 5..6.
ONE_SEQUENCE_RANK1 = (HEAD + "rank 1 batch 0 layer 0: segment 2 (request 1 tokens 3..4): q_len 2 kv_len 19, the request needs kv_len 5: "
                      "kv_len counts request 0's 14 keys too: the batch taken as one sequence?")
# The planted bugs of the references, rank 0 of the page split (r0 tokens 0..3: kv_len 12, k_base 0; r1 tokens 0..3: kv_len 4).
PLANTED = {
    "causal_off_by_one": "segment 0 (request 0 tokens 0..3): q_len 4 kv_len 11, the request needs kv_len 12: one key short: query t sees "
                         "keys 0..prefix_len+t, itself included (causal off by one?)",
    "key_base_skips_prefix": "segment 0 (request 0 tokens 0..3): k_base 8, the request's keys begin at dense row 0: k_base is the current "
                             "span's: the prefix was skipped?",
    "batch_as_one_sequence": "segment 1 (request 1 tokens 0..3): q_len 4 kv_len 18, the request needs kv_len 4: kv_len counts request 0's "
                             "14 keys too: the batch taken as one sequence?",
}


def impl(name: str) -> str:
    return f"{IMPLS}:{name}"


CASES = {
    "one_sequence": dict(impl=impl("AllGatherOneSequencePlan")),
    "one_sequence_output": dict(impl=impl("AllGatherOneSequencePlan"), attention_output=True),
    "per_request": dict(impl=impl("AllGatherZigzag"), require_attention=True, attention_output=True),
    "continuous": dict(impl=impl("AllGatherContinuous"), require_attention=True, attention_output=True),
    "undeclared_split": dict(impl=impl("AllGatherUndeclaredSplit")),
    "int32": dict(impl=impl("AttentionInt32")),
    "not_a_plan": dict(impl=impl("AttentionNotAPlan")),
    "no_plan": dict(impl=impl("NoAttention")),
    "no_plan_required": dict(impl=impl("NoAttention"), require_attention=True),
    "rank_zero_plan": dict(impl=impl("AttentionOfRankZero")),
    "staging_direct": dict(impl="cpkv.conformance.reference:StagingDirect", require_attention=True, attention_output=True),
    "v2": dict(impl="cpkv.conformance.reference:V2", require_attention=True, attention_output=True),
    **{bug: dict(impl="cpkv.conformance.reference:StagingDirect", mutant=bug) for bug in PLANTED},
}


@pytest.fixture(scope="module")
def outcomes():
    """Every case over tiny.jsonl's three batches, in one session of two gloo ranks."""
    reader = cpkv.read_trace(TINY)
    batches = list(reader)
    specs = [conformance.case(options.pop("impl"), reader.setting, batches, seed=SEED, window_s=WINDOW_S, **options)
             for options in (dict(o) for o in CASES.values())]
    return dict(zip(CASES, conformance.run_cases(specs)))


def explain(outcome) -> str:
    return "\n".join(outcome.mismatches + outcome.findings + [outcome.failure or ""] + outcome.positions)


def test_a_token_split_all_gather_whose_plan_takes_the_batch_as_one_sequence_is_named_on_the_first_layer(outcomes):
    o = outcomes["one_sequence"]
    assert o.mismatches == [] and o.failure is None, explain(o)  # its bytes are right
    assert o.checks_fired() == ["invariant 9"], explain(o)
    assert o.findings[:2] == [ONE_SEQUENCE_RANK0, ONE_SEQUENCE_RANK1], explain(o)
    assert o.batches[0]["attention_wrong_layers"] == [2, 2]  # both layers of both ranks


def test_the_same_exchange_with_the_right_plan_passes_with_its_output_equal_to_the_single_device(outcomes):
    for name in ("per_request", "continuous"):
        o = outcomes[name]
        assert o.passed, f"{name}:\n{explain(o)}"
        assert len(o.batches) == 3  # tiny.jsonl's batch 2 too: the all-gather has no staging to overflow


def test_the_attention_output_of_the_one_sequence_plan_differs_from_the_single_device(outcomes):
    o = outcomes["one_sequence_output"]
    output = [f for f in o.findings if "attention output" in f]
    # Rank 0's r1 tokens 0..2 (its queries 3..5) read 17 keys from row 0: r0's rows and padding.
    assert output and output[0].startswith(HEAD + "rank 0 batch 0 layer 0: attention output (kind kv_fp8): query 3 (request 1 token 0) "
                                                  "differs from the single-device result of the whole request"), explain(o)


def test_a_split_the_implementation_does_not_declare_is_checked_as_cpkvs_page_split(outcomes):
    o = outcomes["undeclared_split"]
    # Rank 0's zigzag tokens of r0 are 0, 1, 5; the page split gives it 0..3: its query 2 is token 5, not token 2.
    assert o.findings[0] == (HEAD + "rank 0 batch 0 layer 0: segment 1 (request 0 tokens 5..5): query 2 is token 5 of request 0, but the "
                                    "rank's query 2 is token 2 of request 0: token 5 of request 0 is computed on another rank"), explain(o)


def test_a_token_held_by_two_ranks_is_named_by_the_coverage_check(outcomes):
    o = outcomes["rank_zero_plan"]
    assert HEAD + "rank 0 batch 0 layer 0: token 0 of request 0 is a query on ranks 0 and 1" in o.findings, explain(o)
    assert o.findings[0].startswith(HEAD + "rank 1 batch 0 layer 0: segment 0 (request 0 tokens 0..3): query 0 is token 0"), explain(o)


def test_a_malformed_plan_is_a_contract_line_and_a_missing_one_fails_only_when_required(outcomes):
    int32, not_a_plan = outcomes["int32"], outcomes["not_a_plan"]
    assert int32.findings[0] == ("rank 0 batch 0 layer 0: attention: dtype torch.int32 shape (2, 5), expected an int64 tensor (n, 5) "
                                 "[request, q_base, q_len, kv_len, k_base] or a list of cpkv.RaggedSegment"), explain(int32)
    assert not_a_plan.findings[0].startswith("rank 0 batch 0 layer 0: attention: compose_layer returned dict, expected"), explain(not_a_plan)
    assert int32.checks_fired() == ["contract"] and not_a_plan.checks_fired() == ["contract"]
    assert outcomes["no_plan"].passed, explain(outcomes["no_plan"])
    required = outcomes["no_plan_required"]
    assert required.findings[0] == ('rank 0 batch 0 layer 0: --require-attention: compose_layer returned no "attention" plan '
                                    "(PROTOCOL.md section 11)"), explain(required)


@pytest.mark.parametrize("name", ["staging_direct", "v2"])
def test_the_references_return_the_models_plan_and_pass_every_check(outcomes, name):
    assert outcomes[name].passed, explain(outcomes[name])


@pytest.mark.parametrize("bug", list(PLANTED))
def test_each_planted_plan_bug_is_caught_by_invariant_9_alone_with_a_located_line(outcomes, bug):
    o = outcomes[bug]
    assert o.mismatches == [] and o.checks_fired() == ["invariant 9"], explain(o)
    assert o.findings[0] == HEAD + "rank 0 batch 0 layer 0: " + PLANTED[bug], explain(o)


def test_several_requests_at_cp_3_one_sequence_caught_and_right_plan_passes():
    # cp 3: r0 (prefix 8, extend 6) in 6 blocks of 1 -> rank 0 tokens 0 and 5; r1 (extend 9) in blocks
    # 2, 2, 2, 1, 1, 1 -> rank 0 tokens 0..1 and 8; one sequence: r1's kv_len 14 + 0 + 2 = 16, needs 2.
    setting = cpkv.Setting(cp=3, page_size=4, kinds=["kv_fp8", "indexer_k"], layer_pattern="FS", pool_pages=24,
                           max_total_extend_tokens=24, max_batch_requests=3)
    batch = cpkv.Batch([cpkv.Request(8, 6, [5, 2]), cpkv.Request(0, 9, []), cpkv.Request(4, 7, [11])])
    wrong, right = conformance.run_cases([
        conformance.case(impl("AllGatherOneSequencePlan"), setting, [batch], seed=SEED, window_s=WINDOW_S),
        conformance.case(impl("AllGatherZigzag"), setting, [batch], seed=SEED, window_s=WINDOW_S, require_attention=True,
                         attention_output=True)])
    assert wrong.mismatches == [] and wrong.checks_fired() == ["invariant 9"], explain(wrong)
    assert wrong.findings[0] == (HEAD + "rank 0 batch 0 layer 0: segment 2 (request 1 tokens 0..1): q_len 2 kv_len 16, the request needs "
                                        "kv_len 2: kv_len counts request 0's 14 keys too: the batch taken as one sequence?"), explain(wrong)
    assert right.passed, explain(right)


def test_the_command_line_reports_invariant_9_counts_it_in_json_and_replays_it(tmp_path):
    out = tmp_path / "run.json"
    run = subprocess.run([sys.executable, "-m", "cpkv.conformance", TINY, "--impl", impl("AllGatherOneSequencePlan"), "--ranks", "2",
                          "--seed", str(SEED), "--window", str(WINDOW_S), "--require-attention", "--json", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr
    assert ONE_SEQUENCE_RANK0 in run.stdout and "FAIL: invariant 9" in run.stdout, run.stdout
    assert "--require-attention" in run.stdout.splitlines()[-1], run.stdout
    report = json.loads(out.read_text())
    counts = report["runs"][0]["violations_by_invariant"]
    assert counts["9"] == 4 and counts["6"] == 0 and sum(counts.values()) == 4, counts  # 2 ranks x 2 layers, no byte wrong
    assert ONE_SEQUENCE_RANK0 in report["runs"][0]["violation_details"]


pytest_plugins = ["pytester"]


def test_the_pytest_plugin_fails_a_planted_plan_bug_with_the_checkers_line(pytester):
    pytester.makepyfile(f"""
        import cpkv

        def test_reference(cpkv_conformance):
            reader = cpkv.read_trace({TINY!r})
            cpkv_conformance("cpkv.conformance.reference:StagingDirect", reader.setting, [list(reader)[1]], mutant="causal_off_by_one",
                             window_s={WINDOW_S})
    """)
    result = pytester.runpytest("-p", "cpkv.pytest_plugin", "-q", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    # Batch 1 is one request (prefix 4, extend 1): its one query sees 4 + 0 + 1 = 5 keys; the bug says 4.
    result.stdout.fnmatch_lines(["*cpkv conformance: invariant 9*", "*invariant 9 (attention plan exactness): rank 0 batch 0 layer 0: "
                                 "segment 0 (request 0 tokens 0..0): q_len 1 kv_len*", "*replay: cpkv replay * --backend torch --impl *"])

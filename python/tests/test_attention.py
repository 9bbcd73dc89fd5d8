"""What attention reads (PROTOCOL.md section 11), from Python: the bindings of the model's oracle and
checker of invariant 9, the converters from engines' plan forms, and the reference attention.

Why it matters: byte-exact KV with a wrong plan is still a wrong answer. An engine hands cpkv its
plan in its own form (FlashAttention's cu_seqlens, FlashInfer's indptr, zigzag half lengths); if the
converters or the checker misread it, a right plan fails or a wrong one passes. Every expectation
is computed by hand from section 11 on tiny.jsonl's batch 0 (cp 2, P 4, zigzag pages):

    r0: prefix 8, extend 6 -> k_base 0 (8 prefix rows + 2 pages of 4 = 16 rows)
        page 0 (tokens 0..3) rank 0, page 1 (tokens 4..5) rank 1
    r1: prefix 0, extend 9 -> k_base 16; page 0 (0..3) rank 0, pages 1, 2 (4..8) rank 1
    rank 0: (r0, q_base 0, q_len 4, kv_len 8+0+4 = 12, k_base 0), (r1, 0, 4, 4, 16)
    rank 1: (r0, 4, 2, 14, 0), (r1, 4, 5, 9, 16)
"""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

import cpkv
import cpkv.attention as attention

SOURCE = os.environ.get("CPKV_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
TINY = os.path.join(SOURCE, "traces", "samples", "tiny.jsonl")
S = cpkv.RaggedSegment
RANK0 = [(0, 0, 4, 12, 0), (1, 0, 4, 4, 16)]
RANK1 = [(0, 4, 2, 14, 0), (1, 4, 5, 9, 16)]
# Zigzag tokens at cp 2: r0's 6 tokens in blocks 2, 2, 1, 1 -> rank 0 tokens 0..1 and 5; r1's 9 in 3, 2, 2, 2 -> rank 0 0..2, 7..8.
ZIGZAG0 = [(0, 0, 2, 10, 0), (0, 5, 1, 14, 0), (1, 0, 3, 3, 16), (1, 7, 2, 9, 16)]


@pytest.fixture(scope="module")
def tiny():
    reader = cpkv.read_trace(TINY)
    return reader.setting, list(reader)[0]


def tuples(plan):
    return [s.as_tuple() for s in plan] if isinstance(plan, list) else [tuple(r) for r in np.asarray(plan).tolist()]


# --- the bindings -------------------------------------------------------------------------------

def test_the_oracle_gives_section_11s_plans_of_the_tiny_batch(tiny):
    setting, batch = tiny
    assert tuples(cpkv.expected_attention_plan(setting, batch, 0)) == RANK0
    assert tuples(cpkv.expected_attention_plan(setting, batch, 1)) == RANK1
    assert tuples(cpkv.expected_attention_plan(setting, batch, 0, "zigzag_tokens")) == ZIGZAG0
    assert tuples(cpkv.expected_attention_plan(setting, batch, 0, cpkv.QuerySplit.zigzag_tokens)) == ZIGZAG0
    assert list(cpkv.request_key_base(setting, batch)) == [0, 16]
    queries = cpkv.rank_queries(setting, batch, 1)
    assert queries.dtype == np.int64 and queries.tolist() == [[0, 4], [0, 5]] + [[1, t] for t in range(4, 9)]


def test_the_model_ragged_index_plan_in_the_neutral_form_is_the_oracles(tiny):
    setting, batch = tiny
    layout = cpkv.layout_batch(setting, batch)
    for rank, want in ((0, RANK0), (1, RANK1)):
        assert tuples(cpkv.ragged_index_plan(layout, batch, rank).attention_segments()) == want
    assert isinstance(cpkv.ragged_index_plan(layout, batch, 0).segments[0], cpkv.RaggedIndexSegment)


def test_a_segment_is_a_value_that_pickles_and_prints_as_its_constructor():
    s = S(request=1, q_base=4, q_len=5, kv_len=9, k_base=16)
    assert s == S(1, 4, 5, 9, 16) and s != S(1, 4, 5, 9, 15)
    assert pickle.loads(pickle.dumps(s)) == s
    assert repr(s) == "RaggedSegment(request=1, q_base=4, q_len=5, kv_len=9, k_base=16)"
    assert eval(repr(s), {"RaggedSegment": S}) == s
    s.kv_len = 23
    assert s.as_tuple() == (1, 4, 5, 23, 16)


@pytest.mark.parametrize("form", ["segments", "array"])
def test_the_right_plans_pass_in_either_form(tiny, form):
    setting, batch = tiny
    for rank, plan in ((0, RANK0), (1, RANK1)):
        given = [S(*row) for row in plan] if form == "segments" else np.array(plan, dtype=np.int64)
        assert cpkv.check_attention_plan(setting, batch, rank, given) is None
    assert cpkv.check_attention_plan(setting, batch, 0, np.array(ZIGZAG0), "zigzag_tokens") is None
    assert cpkv.check_attention_coverage(batch, [np.array(RANK0), [S(*r) for r in RANK1]]) is None


def test_the_batch_taken_as_one_sequence_is_named_with_request_tokens_and_kv_lens(tiny):
    setting, batch = tiny
    plan = np.array(RANK1)
    plan[1, 3] = 23  # r1's kv_len counting r0's 8 + 6 = 14 keys too: 9 + 14
    found = cpkv.check_attention_plan(setting, batch, 1, plan)
    assert (found.segment, found.request, found.token_first, found.token_last) == (1, 1, 4, 8)
    assert (found.field, found.expected, found.got) == ("kv_len", 9, 23)
    assert found.describe(1, 0) == ("invariant 9 (attention plan exactness): rank 1 batch 0: segment 1 (request 1 tokens 4..8): q_len 5 "
                                    "kv_len 23, the request needs kv_len 9: kv_len counts request 0's 14 keys too: the batch taken as one "
                                    "sequence?")
    assert found.detail() == found.describe(1, 0).split("batch 0: ", 1)[1]


def test_a_key_base_that_skips_the_prefix_and_an_off_by_one_are_named(tiny):
    setting, batch = tiny
    skipped = cpkv.check_attention_plan(setting, batch, 0, [S(0, 0, 4, 12, 8), S(1, 0, 4, 4, 16)])
    assert (skipped.field, skipped.expected, skipped.got) == ("k_base", 0, 8)
    assert skipped.why == "k_base is the current span's: the prefix was skipped?"
    short = cpkv.check_attention_plan(setting, batch, 0, [S(0, 0, 4, 11, 0), S(1, 0, 4, 4, 16)])
    assert (short.field, short.expected, short.got) == ("kv_len", 12, 11) and "causal off by one" in short.why


def test_a_token_on_two_ranks_names_the_token_and_both_ranks(tiny):
    _, batch = tiny
    twice = [(0, 0, 4, 12, 0), (1, 0, 5, 5, 16)]  # r1 token 4 on rank 0 too
    finding, rank = cpkv.check_attention_coverage(batch, [twice, RANK1])
    assert finding.what == "token 4 of request 1 is a query on ranks 0 and 1" and rank == 0
    finding, rank = cpkv.check_attention_coverage(batch, [RANK0, RANK1[:1]])
    assert finding.what == "token 4 of request 1 is a query on no rank"


def test_bad_plans_and_splits_are_one_line_input_errors(tiny):
    setting, batch = tiny
    with pytest.raises(cpkv.InputError) as wrong_shape:
        cpkv.check_attention_plan(setting, batch, 0, np.zeros((2, 4), dtype=np.int64))
    assert wrong_shape.value.field == "segments" and "(n, 5)" in str(wrong_shape.value)
    with pytest.raises(cpkv.InputError) as float_plan:
        cpkv.check_attention_plan(setting, batch, 0, np.zeros((2, 5)))
    assert "dtype float64" in str(float_plan.value)
    with pytest.raises(cpkv.InputError) as split:
        cpkv.check_attention_plan(setting, batch, 0, RANK0, "tokens")
    assert split.value.field == "split" and "zigzag_tokens" in str(split.value)
    with pytest.raises(cpkv.InputError) as rank:
        cpkv.expected_attention_plan(setting, batch, 2)
    assert rank.value.field == "rank"
    with pytest.raises(TypeError):
        cpkv.check_attention_plan(setting, batch, 0, "not a plan")


# --- the converters -----------------------------------------------------------------------------
# Rank 1's plan (RANK1) as each engine form writes it: two sequences, r0 tokens 4..5 (2 queries, 14
# keys) and r1 tokens 4..8 (5 queries, 9 keys); the request and q_base of each sequence and each
# request's k_base are what the arrays cannot say.

WHO = dict(request=[0, 1], q_base=[4, 4], k_base=[0, 16])


def test_flash_attention_varlen_cu_seqlens_become_the_plan(tiny):
    setting, batch = tiny
    plan = attention.from_cu_seqlens([0, 2, 7], [0, 14, 23], **WHO)
    assert plan.dtype == np.int64 and tuples(plan) == RANK1
    assert cpkv.check_attention_plan(setting, batch, 1, plan) is None


def test_cu_seqlens_q_with_seqused_k_and_flashinfer_indptr_become_the_plan():
    assert tuples(attention.from_seqused_k([0, 2, 7], [14, 9], **WHO)) == RANK1
    assert tuples(attention.from_indptr([0, 2, 7], [0, 14, 23], **WHO)) == RANK1
    # k_base as a mapping from request to row, and a padding sequence of no query (dropped).
    padded = attention.from_cu_seqlens([0, 2, 2, 7], [0, 14, 14, 23], request=[0, 0, 1], q_base=[4, 6, 4], k_base={0: 0, 1: 16})
    assert tuples(padded) == RANK1


def test_zigzag_half_lengths_become_the_token_splits_plan(tiny):
    # Rank 0 of the zigzag token split: r0 halves 0..1 and 5; r1 halves 0..2 and 7..8.
    setting, batch = tiny
    plan = attention.from_zigzag_halves([2, 3], [1, 2], [8 + 2, 0 + 3], [8 + 6, 0 + 9], request=[0, 1], q_base_prev=[0, 0],
                                        q_base_next=[5, 7], k_base=[0, 16])
    assert tuples(plan) == ZIGZAG0
    assert cpkv.check_attention_plan(setting, batch, 0, plan, "zigzag_tokens") is None
    # A one-token request at cp 2 has an empty prev half on rank 0 (blocks of 1, 0, 0, 0): dropped.
    assert tuples(attention.from_zigzag_halves([0], [1], [4], [5], request=[0], q_base_prev=[0], q_base_next=[0], k_base=[0])) == [(0, 0, 1, 5, 0)]


def test_torch_tensors_are_read_as_arrays():
    torch = pytest.importorskip("torch")
    plan = attention.from_cu_seqlens(torch.tensor([0, 2, 7], dtype=torch.int32), torch.tensor([0, 14, 23]), request=torch.tensor([0, 1]),
                                     q_base=[4, 4], k_base=torch.tensor([0, 16]))
    assert tuples(plan) == RANK1
    assert tuples(attention.as_array(torch.tensor(RANK1))) == RANK1


@pytest.mark.parametrize("call, field", [
    (lambda: attention.from_cu_seqlens([1, 2, 7], [0, 14, 23], **WHO), "cu_seqlens_q"),
    (lambda: attention.from_cu_seqlens([0, 7, 2], [0, 14, 23], **WHO), "cu_seqlens_q"),
    (lambda: attention.from_cu_seqlens([0, 2, 7], [0, 14], **WHO), "cu_seqlens_k"),
    (lambda: attention.from_seqused_k([0, 2, 7], [14, 9], request=[0], q_base=[4, 4], k_base=[0, 16]), "request"),
    (lambda: attention.from_indptr([0, 2, 7], [0, 14, 23], request=[0, 2], q_base=[4, 4], k_base=[0, 16]), "k_base"),
    (lambda: attention.from_cu_seqlens([0.0, 2.0], [0, 1], request=[0], q_base=[0], k_base=[0]), "cu_seqlens_q"),
    (lambda: attention.as_array([(0, 1, 2)]), "plan"),
])
def test_malformed_engine_arrays_are_input_errors_naming_the_argument(call, field):
    with pytest.raises(cpkv.InputError) as error:
        call()
    assert error.value.field == field, str(error.value)


# --- the reference attention --------------------------------------------------------------------

def _rows(nibbles_k, nibbles_v, nibbles_q=0, row_bytes=48):
    """A uint8 row whose k, v and q nibbles are the given integers (-8..7) in every column."""
    row = np.zeros(row_bytes, dtype=np.uint8)
    row[0:16], row[16:32], row[32:48] = nibbles_k + 8, nibbles_v + 8, nibbles_q + 8
    return row


def test_the_reference_attention_is_causal_base_two_softmax_computed_by_hand():
    # Keys: k0 = 1 (score floor(16 * 1 * 1 / 8) = 2 against q = 1), v0 = 2; k1 = 0 (score 0), v1 = -4.
    # Query 0 sees key 0 only: v0 = 2. Query 1 sees both: weights 2^0 and 2^(0 - 2) = 1/4, so
    # (2 - 1) / 1.25 = 0.8 (the division rounded once).
    torch = pytest.importorskip("torch")
    dense = torch.from_numpy(np.stack([_rows(1, 2), _rows(0, -4)]))
    q = torch.ones((2, attention.HEAD_DIM), dtype=torch.float64)
    out = attention.reference(q, dense, [S(0, 0, 2, 2, 0)])
    assert out.dtype == torch.float64 and out.shape == (2, 16)
    assert torch.equal(out[0], torch.full((16,), 2.0, dtype=torch.float64))
    assert torch.equal(out[1], torch.full((16,), 1.0 / 1.25, dtype=torch.float64))
    q_of, k_of, v_of = attention.qkv_of_rows(dense)
    assert k_of[0].tolist() == [1.0] * 16 and v_of[1].tolist() == [-4.0] * 16 and q_of[0].tolist() == [0.0] * 16


def test_a_query_gives_the_same_bits_alone_or_among_others_and_in_any_segment_split(tiny):
    # The premise of --attention-output: a query's row depends only on the keys it sees.
    torch = pytest.importorskip("torch")
    setting, batch = tiny
    dense = torch.from_numpy(cpkv.expected_dense(setting, cpkv.layout_batch(setting, batch), 3, 0, 0).reshape(-1, 656))
    single = attention.single_device_plan(setting, batch)
    assert tuples(single) == [(0, 0, 6, 14, 0), (1, 0, 9, 9, 16)]
    q = attention.qkv_of_rows(dense[torch.from_numpy(attention.query_rows(setting, batch, single))])[0]
    whole = attention.reference(q, dense, single)
    split = [(0, 0, 1, 9, 0), (0, 1, 5, 14, 0), (1, 0, 9, 9, 16)]
    assert torch.equal(attention.reference(q, dense, split), whole)
    alone = attention.reference(q[10:11], dense, [(1, 4, 1, 5, 16)])  # r1 token 4 is query 6 + 4
    assert torch.equal(alone[0], whole[10])


def test_the_output_of_a_right_plan_equals_the_single_device_and_a_wrong_one_is_named(tiny):
    torch = pytest.importorskip("torch")
    setting, batch = tiny
    dense = torch.from_numpy(cpkv.expected_dense(setting, cpkv.layout_batch(setting, batch), 3, 0, 0).reshape(-1, 656))
    for plan in (RANK0, RANK1, ZIGZAG0):
        assert attention.output_difference(setting, batch, dense, dense, plan) is None
    one_sequence = [(0, 4, 2, 14, 0), (1, 4, 5, 23, 0)]  # r1 as if after r0 in one sequence
    line = attention.output_difference(setting, batch, dense, dense, one_sequence)
    assert line.startswith("query 2 (request 1 token 4) differs from the single-device result of the whole request (5 of 7 queries"), line
    short = attention.output_difference(setting, batch, dense, dense, [(1, 0, 1, 0, 16)])
    assert short.startswith("the plan cannot be run: segment 0: q_len 1 kv_len 0"), short
    wrong_bytes = dense.clone()
    wrong_bytes[17] ^= 1  # r1's key 1 (a row of rank 0's page): right plan, wrong bytes
    assert attention.output_difference(setting, batch, wrong_bytes, dense, RANK1) is not None


def test_q_must_hold_the_small_integers_the_exactness_needs():
    torch = pytest.importorskip("torch")
    dense = torch.from_numpy(np.stack([_rows(1, 2)]))
    with pytest.raises(cpkv.InputError) as error:
        attention.reference(torch.full((1, 16), 0.5, dtype=torch.float64), dense, [S(0, 0, 1, 1, 0)])
    assert error.value.field == "q"
    with pytest.raises(cpkv.InputError) as outside:
        attention.reference(torch.ones((1, 16), dtype=torch.float64), dense, [S(0, 0, 1, 2, 0)])
    assert "not rows of the 1-row dense buffer" in str(outside.value)

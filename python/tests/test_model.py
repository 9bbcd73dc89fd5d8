"""Differential checking: the model's layout, staging, plans, content and expected buffers from Python.

Expectations are worked out by hand from PROTOCOL.md on the tiny sample trace (cp 2, P 4, kv_fp8 +
indexer_k, layers "FS", caps 16 tokens / 2 requests), not read from the model's output.
"""

from __future__ import annotations

import numpy as np
import pytest

import cpkv

SEED = 11


@pytest.fixture
def tiny_batches(tiny):
    reader = cpkv.read_trace(tiny)
    return reader.setting, list(reader)


@pytest.fixture
def batch0(tiny_batches):
    setting, batches = tiny_batches
    return setting, batches[0], cpkv.layout_batch(setting, batches[0])


def test_layout_slots_writers_and_current_indices_follow_the_protocol(batch0):
    # Batch 0: request 0 has prefix pages [5, 2] and 6 extend tokens (2 current pages, the last with
    # 2 rows); request 1 has 9 extend tokens (3 pages, the last with 1 row). Zigzag over 2*cp = 4
    # blocks: 2 pages -> writers [0, 1]; 3 pages -> blocks of 1, 1, 1, 0 -> writers [0, 1, 1].
    _, _, layout = batch0
    assert (layout.slot_count, layout.current_pages_total) == (7, 5)
    assert [(s.kind, s.request, s.page_or_index) for s in layout.slots] == [
        ("prefix", 0, 5), ("prefix", 0, 2), ("current", 0, 0), ("current", 0, 1), ("current", 1, 2), ("current", 1, 3), ("current", 1, 4)]
    assert layout.writers.tolist() == [0, 1, 0, 1, 1]
    assert layout.writers.dtype == np.int32
    assert layout.current_slots.tolist() == [2, 3, 4, 5, 6]
    assert [p.rows_valid for p in layout.current] == [4, 2, 4, 4, 1]
    assert layout.request_first_slot == [0, 4]
    assert layout.request_first_current_index == [0, 2]


def test_split_policies_give_the_protocols_writers():
    # One request of 5 current pages on cp 2: contiguous [0,0,1,1,1]; round_robin [0,1,0,1,0];
    # zigzag over 4 blocks of 2, 1, 1, 1 pages: rank 0 takes blocks 0 and 3, rank 1 blocks 1 and 2.
    expected = {"contiguous": [0, 0, 1, 1, 1], "round_robin": [0, 1, 0, 1, 0], "zigzag": [0, 0, 1, 1, 0]}
    for split, writers in expected.items():
        setting = cpkv.Setting(cp=2, page_size=2, kinds=["kv_fp8"], layer_pattern="S", pool_pages=8, split=split)
        assert cpkv.layout_batch(setting, cpkv.Batch([cpkv.Request(0, 10)])).writers.tolist() == writers, split


def test_staging_capacity_and_overflow_verdict(tiny_batches):
    setting, batches = tiny_batches
    capacity = cpkv.staging_capacity(setting)
    assert (capacity.staging_slots, capacity.source) == (16 // 4 + 2, "caps")
    assert capacity.bytes_total == 2 * 6 * 4 * (656 + 132)
    # Batch 2: 16 + 13 extend tokens -> 4 + 4 current pages > 6 slots.
    layout = cpkv.layout_batch(setting, batches[2])
    verdict = cpkv.overflow_verdict(layout.current_pages_total, capacity.staging_slots)
    assert verdict.overflow
    assert str(verdict) == "overflow: 8 current pages > 6 staging slots"
    assert not cpkv.overflow_verdict(6, 6).overflow


def test_staging_direct_plan_descriptors(batch0):
    # Prefix page g: (g % cp, g // cp); current index i of writer w: (cp + w, i).
    _, _, layout = batch0
    expected = [[1, 2], [0, 1], [2, 0], [3, 1], [2, 2], [3, 3], [3, 4]]
    plan = cpkv.staging_direct_plan(layout)
    assert plan.dtype == np.int64 and plan.shape == (7, 2)
    assert plan.tolist() == expected
    for rank in range(2):
        vp = cpkv.variant_plan(layout, "staging_direct", rank)
        assert vp.gather1.shape == (0, 2)  # one gather, after the barrier: it reads peers' staging
        assert vp.gather2.tolist() == expected
        assert vp.fill_to_staging and vp.barrier and vp.allreduce_count() == 0
        assert vp.own_current == [i for i, w in enumerate([0, 1, 0, 1, 1]) if w == rank]


def test_variant_plans_match_the_protocol_table(batch0):
    _, batch, layout = batch0
    legacy = cpkv.variant_plan(layout, "legacy_span_ar", 0)
    assert legacy.allreduce_count() == 2 * len(batch)
    assert cpkv.variant_plan(layout, "fused_ar", 1).allreduce_count() == 1
    v2 = cpkv.variant_plan(layout, "v2", 0)
    assert v2.compact_allreduce and v2.compact_pages == 5
    assert [t for t, _ in v2.gather1.tolist()[2:]] == [cpkv.ZERO_FILL] * 5
    assert cpkv.variant_plan(layout, "staging_publish", 0).publish


def test_layer_bytes_count_whole_pages_from_each_source(batch0):
    # Rank 0's gather on layer 0 (F: kv_fp8 and indexer_k) reads slots 1, 2, 4 from itself and
    # 0, 3, 5, 6 from rank 1, each P rows of 656 + 132 bytes.
    setting, _, layout = batch0
    page_bytes = 4 * (656 + 132)
    bytes0 = cpkv.layer_bytes(setting, cpkv.variant_plan(layout, "staging_direct", 0), 0)
    assert bytes0.pulled_from == [3 * page_bytes, 4 * page_bytes]
    assert bytes0.pulled_from_peers() == 4 * page_bytes
    assert (bytes0.barriers, bytes0.gathers) == (1, 2)


def test_page_inverse_points_current_tokens_at_dense_or_staging_rows(batch0):
    # Rank 0 writes current index 0 (request 0 tokens 8..11, slot 2) and 2 (request 1 tokens 0..3, slot 4).
    _, batch, layout = batch0
    dense = cpkv.page_inverse(layout, batch, 0, "dense")
    assert dense.request.tolist() == [0] * 4 + [1] * 4
    assert dense.token.tolist() == [8, 9, 10, 11, 0, 1, 2, 3]
    assert dense.dest_row.tolist() == [8, 9, 10, 11, 16, 17, 18, 19]
    assert cpkv.page_inverse(layout, batch, 0, "staging").dest_row.tolist() == [0, 1, 2, 3, 8, 9, 10, 11]


def test_expected_dense_is_the_content_of_each_rows_source_and_zero_past_the_end(batch0):
    setting, _, layout = batch0
    dense = cpkv.expected_dense(setting, layout, SEED, 0, "kv_fp8")
    assert dense.dtype == np.uint8 and dense.shape == (7 * 4, 656)
    assert not dense.flags.owndata and dense.base is not None  # the model's buffer, not a copy
    # Slot 0 row 1: pool page 5, row 1.
    assert np.array_equal(dense[1], cpkv.row_content(cpkv.prefix_row_key(SEED, 0, 0, 5, 1), 656))
    assert np.array_equal(dense[0:4], cpkv.prefix_page_rows(setting, SEED, 0, "kv_fp8", 5))
    # Slot 2 row 0: request 0's first extend token, sequence position 8.
    assert np.array_equal(dense[8], cpkv.row_content(cpkv.current_row_key(SEED, 0, 0, 0, 8), 656))
    assert np.array_equal(dense[12:14], cpkv.current_rows(setting, SEED, 0, "kv_fp8", 0, 12, 2))
    # Slot 3 holds 2 valid rows (tokens 12, 13); slot 6 holds 1 (request 1, token 8).
    assert not dense[14:16].any() and not dense[25:28].any()
    assert dense[24].any()
    assert cpkv.row_source(layout, 3, 2) is None
    assert cpkv.row_source(layout, 6, 0).token == 8
    assert np.array_equal(cpkv.expected_row(setting, layout, SEED, 0, 0, 3, 1), dense[13])


def test_a_shared_prefix_page_reads_the_same_bytes_in_every_request():
    setting = cpkv.Setting(cp=2, page_size=2, kinds=["indexer_k"], layer_pattern="F", pool_pages=8)
    batch = cpkv.Batch([cpkv.Request(2, 1, [3]), cpkv.Request(4, 2, [6, 3])])
    layout = cpkv.layout_batch(setting, batch)
    dense = cpkv.expected_dense(setting, layout, SEED, 0, 0)
    slot_of_page3_in_request1 = layout.request_first_slot[1] + 1
    assert np.array_equal(dense[0:2], dense[2 * slot_of_page3_in_request1:2 * slot_of_page3_in_request1 + 2])


def test_the_comparison_names_the_first_wrong_rank_slot_row_and_byte(batch0):
    setting, _, layout = batch0
    expected = cpkv.expected_dense(setting, layout, SEED, 0, "kv_fp8")
    good = expected.copy()
    bad = expected.copy()
    bad[4 * 4 + 1, 100] ^= 0xFF  # slot 4, row 1, byte 100
    bad[5 * 4, 7] ^= 0x01        # a second wrong byte, later
    assert cpkv.compare_dense(good, expected, 4, 656) is None
    assert cpkv.check_dense(good, setting, layout, SEED, 0, "kv_fp8") is None
    rank, mismatch = cpkv.first_mismatch([good, bad], setting, layout, SEED, 0, "kv_fp8")
    assert (rank, mismatch.slot, mismatch.row, mismatch.byte, mismatch.wrong_bytes) == (1, 4, 1, 100, 2)
    assert mismatch.actual == expected[17, 100] ^ 0xFF
    with pytest.raises(cpkv.DenseMismatchError) as error:
        cpkv.assert_dense_equal({0: good, 1: bad}, setting, layout, SEED, 0, "kv_fp8", batch=0)
    assert str(error.value) == (f"mismatch: rank 1 batch 0 layer 0 kind kv_fp8 slot 4 row 1 byte 100: expected 0x{expected[17, 100]:02x} "
                                f"got 0x{bad[17, 100]:02x} (2 wrong bytes)")
    # Any one-byte view compares: the same bytes as int8, flattened.
    assert cpkv.compare_dense(bad.view(np.int8).ravel(), expected, 4, 656).slot == 4


@pytest.mark.parametrize("call, field", [
    (lambda s, b, l: cpkv.variant_plan(l, "nope", 0), "variant"),
    (lambda s, b, l: cpkv.variant_plan(l, "v2", 2), "rank"),
    (lambda s, b, l: cpkv.expected_dense(s, l, SEED, 1, "indexer_k"), "kind"),
    (lambda s, b, l: cpkv.expected_dense(s, l, SEED, 2, 0), "layer"),
    (lambda s, b, l: cpkv.expected_dense(s, l, SEED, 0, "kv_bf16"), "kind"),
    (lambda s, b, l: cpkv.compare_dense(np.zeros(10, np.uint8), np.zeros(12, np.uint8), 4, 656), "actual"),
    (lambda s, b, l: cpkv.compare_dense(np.zeros(4, np.float32), np.zeros(16, np.uint8), 4, 1), "actual"),
    (lambda s, b, l: cpkv.row_source(l, 7, 0), "slot"),
    (lambda s, b, l: cpkv.page_inverse(l, cpkv.Batch([cpkv.Request(0, 1)]), 0), "batch"),
    (lambda s, b, l: cpkv.layout_batch(s, cpkv.Batch([cpkv.Request(3, 1, [1])])), "requests[0].prefix_len"),
    (lambda s, b, l: cpkv.validate(s, cpkv.Batch([])), "requests"),
])
def test_bad_arguments_raise_one_line_input_errors_naming_the_parameter(batch0, call, field):
    setting, batch, layout = batch0
    with pytest.raises(cpkv.InputError) as error:
        call(setting, batch, layout)
    assert error.value.field == field
    assert "\n" not in str(error.value)


def test_ragged_index_plan_segments_cover_this_ranks_query_tokens(batch0):
    # Rank 1 writes request 0's page 1 (2 tokens) and request 1's pages 1-2 (4 + 1 tokens).
    _, batch, layout = batch0
    plan = cpkv.ragged_index_plan(layout, batch, 1)
    assert plan.q_tokens_total == 7
    assert [(s.request, s.q_len, s.q_base, s.kv_len) for s in plan.segments] == [(0, 2, 4, 8 + 6), (1, 5, 4, 9)]

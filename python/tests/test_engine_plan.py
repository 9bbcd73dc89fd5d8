"""An engine's own plan builder and gather (examples/engine_plan.py) against the model, byte for byte.

Why it matters: this is the workflow the package exists for. An engine developer writes the plan
from PROTOCOL.md, draws batches with cpkv.strategies, and compares descriptors and dense bytes with
the C++ model; a wrong plan must fail with a located mismatch, as the token-split bug does here.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, find, given, settings as hsettings

import cpkv
import cpkv.strategies as cs
import engine_plan

SEED = 3


def engine_plan_of(setting, batch, token_split=False):
    return engine_plan.build_plan(setting.cp, setting.page_size, setting.split, [r.prefix_len for r in batch.requests],
                                  [r.extend_len for r in batch.requests], [r.prefix_pages for r in batch.requests], token_split)


def engine_dense(setting, batch, layer, kind, token_split=False):
    """Pools pre-populated at each page's storage owner, staging filled by the writers, one gather."""
    plan = engine_plan_of(setting, batch, token_split)
    row_bytes = setting.kinds[kind].row_bytes
    P = setting.page_size
    pools = [np.zeros((setting.pool_pages_per_rank(), P, row_bytes), np.uint8) for _ in range(setting.cp)]
    for g in {g for r in batch.requests for g in r.prefix_pages}:
        pools[g % setting.cp][g // setting.cp] = cpkv.prefix_page_rows(setting, SEED, layer, kind, g)
    staging = [np.zeros((max(1, len(plan.writers)), P, row_bytes), np.uint8) for _ in range(setting.cp)]
    engine_plan.fill_staging(plan, staging, lambda i: cpkv.current_rows(setting, SEED, layer, kind, int(plan.current_request[i]),
                                                                        int(plan.current_first_token[i]), int(plan.rows_valid[i])))
    return engine_plan.gather(plan, pools, staging)


@given(cs.batches())
def test_the_engine_plan_equals_the_models_plan(drawn):
    setting, batch = drawn
    layout = cpkv.layout_batch(setting, batch)
    plan = engine_plan_of(setting, batch)
    assert np.array_equal(plan.writers, layout.writers)
    assert np.array_equal(plan.current_slot, layout.current_slots)
    assert plan.rows_valid.tolist() == [p.rows_valid for p in layout.current]
    assert np.array_equal(plan.descriptors, cpkv.staging_direct_plan(layout))


@hsettings(max_examples=25)
@given(cs.batches(requests_max=6, tokens_max=256))
def test_the_engine_gather_produces_the_models_dense_buffer(drawn):
    setting, batch = drawn
    active = [layer for layer in range(setting.layer_count) if setting.kind_active(0, layer)]
    assume(active)
    layout = cpkv.layout_batch(setting, batch)
    dense = engine_dense(setting, batch, active[-1], 0)
    cpkv.assert_dense_equal([dense] * setting.cp, setting, layout, SEED, active[-1], 0)


def test_a_token_granularity_split_is_caught_at_the_first_row_of_the_second_writer():
    # cp 2, P 4, 6 extend tokens: token zigzag over 4 chunks gives tokens 0-1 to rank 0 and 2-3 to
    # rank 1, so page 0 has two writers; the gather reads it from rank 0, whose rows 2-3 are zero.
    setting = cpkv.Setting(cp=2, page_size=4, kinds=["kv_fp8"], layer_pattern="S", pool_pages=4)
    batch = cpkv.Batch([cpkv.Request(0, 6)])
    layout = cpkv.layout_batch(setting, batch)
    expected = cpkv.expected_dense(setting, layout, SEED, 0, 0)
    with pytest.raises(cpkv.DenseMismatchError) as error:
        cpkv.assert_dense_equal([engine_dense(setting, batch, 0, 0, token_split=True)] * 2, setting, layout, SEED, 0, 0)
    mismatch = error.value.mismatch
    assert (error.value.rank, mismatch.slot, mismatch.row) == (0, 0, 2)
    assert mismatch.byte == int(np.flatnonzero(expected[2])[0]) and mismatch.actual == 0
    assert str(error.value).startswith("mismatch: rank 0 layer 0 kind kv_fp8 slot 0 row 2 ")


def test_the_strategies_find_the_token_split_bug_on_their_own():
    zigzag = cs.settings(cp_max=4, page_size_log2_max=3, split="zigzag").filter(lambda s: s.kind_active(0, 0))

    def caught(drawn):
        setting, batch = drawn
        layout = cpkv.layout_batch(setting, batch)
        return cpkv.check_dense(engine_dense(setting, batch, 0, 0, token_split=True), setting, layout, SEED, 0, 0) is not None

    counterexample = find(zigzag.flatmap(lambda s: cs.batches(s).map(lambda b: (s, b))), caught)
    assert counterexample[0].cp >= 2

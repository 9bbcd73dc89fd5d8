"""Property tests in Python: the strategies draw what the C++ generators draw, and the model accepts it.

Why it matters: an engine's suite writes @given(cpkv.strategies.batches()) and must explore the
same space as properties/src/properties.cpp (cp 1..8, P 1..256, the five kind sets, three split
policies, one-token / page-exact / partial extends, shared scattered prefix pages, caps at the edge).
"""

from __future__ import annotations

import pytest
from hypothesis import Phase, find, given, settings as hsettings
from hypothesis import strategies as st

import cpkv
import cpkv.strategies as cs


@given(cs.batches())
def test_every_drawn_setting_and_batch_is_accepted_by_the_model(drawn):
    setting, batch = drawn
    cpkv.validate(setting, batch)  # raises on anything the model refuses
    layout = cpkv.layout_batch(setting, batch)
    assert layout.current_pages_total == sum(-(-r.extend_len // setting.page_size) for r in batch.requests)


@given(cs.batches())
def test_drawn_batches_stay_in_the_generators_bounds(drawn):
    setting, batch = drawn
    P = setting.page_size
    assert 1 <= len(batch) <= cs.REQUESTS_MAX
    tokens = sum(r.prefix_len + r.extend_len for r in batch.requests)
    assert len(batch) == 1 or tokens <= cs.TOKENS_MAX
    for r in batch.requests:
        assert 1 <= r.extend_len <= 4 * P
        assert r.prefix_len % P == 0 and 0 <= r.prefix_len // P <= 4
        assert all(0 <= g < setting.pool_pages for g in r.prefix_pages)


@given(cs.settings())
def test_drawn_settings_stay_in_the_generators_bounds(setting):
    assert 1 <= setting.cp <= 8
    assert setting.page_size in [1 << k for k in range(9)]
    assert tuple(setting.kind_names) in cs.KIND_SETS
    assert 1 <= setting.layer_count <= 8 and set(setting.layer_pattern) <= {"F", "S"}
    assert setting.split in cpkv.SPLIT_POLICIES
    assert 1 <= setting.pool_pages <= 128
    assert (setting.max_total_extend_tokens, setting.max_batch_requests, setting.staging_mib) == (None, None, None)


@hsettings(max_examples=30)
@given(cs.settings(cp=7, page_size=128, layer_pattern="SFS"))
def test_fixed_setting_fields_are_exact_and_the_rest_still_drawn(setting):
    # issue 23: settings(cp=..., page_size=...) is exact. cp 7, P 128 and pattern SFS are about 1 draw
    # in 8 * 9 * 8 * 8 of the unfixed strategy: reached by filtering, Hypothesis's health check fails
    # (it found 0 good of 50, 2026-12-02); drawn directly, every example has them.
    assert (setting.cp, setting.page_size, setting.layer_pattern) == (7, 128, "SFS")
    assert tuple(setting.kind_names) in cs.KIND_SETS and 1 <= setting.pool_pages <= 128


def test_unfixed_fields_still_vary_and_a_strategy_is_drawn_from():
    fixed = cs.settings(cp=2, page_size=4)
    assert reach(fixed, lambda s: s.kind_names == ["indexer_k"]).cp == 2
    assert reach(fixed, lambda s: s.split == "round_robin").page_size == 4
    assert reach(cs.settings(cp=st.sampled_from([3, 5])), lambda s: s.cp == 5).cp == 5


def test_a_fixed_value_the_model_refuses_is_one_located_error_at_once():
    with pytest.raises(cpkv.InputError, match="page_size: 3 is not a power of two"):
        cs.settings(cp=2, page_size=3)
    with pytest.raises(cpkv.InputError, match="cp: 9 exceeds"):
        cs.settings(cp=9)


def reach(strategy, condition):
    """An example of the strategy meeting the condition (generation only: no time spent shrinking)."""
    return find(strategy, condition, settings=hsettings(phases=[Phase.generate], max_examples=2000, database=None, derandomize=True))


def test_the_corners_the_cpp_generators_reach_are_reachable():
    # Each corner of the C++ generators' space must be drawn.
    assert reach(cs.settings(), lambda s: s.cp == 8).cp == 8
    assert reach(cs.settings(), lambda s: s.page_size == 256).page_size == 256
    assert reach(cs.settings(), lambda s: s.split == "round_robin" and s.kind_names == ["kv_bf16", "indexer_k"])
    one_setting = cpkv.Setting(cp=3, page_size=8, kinds=["kv_fp8"], layer_pattern="FS", pool_pages=4)
    shapes = cs.batches(one_setting)
    assert reach(shapes, lambda b: any(r.extend_len == 1 for r in b.requests))
    assert reach(shapes, lambda b: any(r.extend_len % 8 == 0 and r.extend_len > 8 for r in b.requests))
    assert reach(shapes, lambda b: any(r.extend_len % 8 not in (0, 1) for r in b.requests))
    # Shared prefix pages across requests (a prefix-cache hit).
    assert reach(shapes, lambda b: len(b) > 1 and set(b.requests[0].prefix_pages) & set(b.requests[1].prefix_pages))


@hsettings(max_examples=60)
@given(cs.cases())
def test_drawn_cases_have_caps_the_model_accepts(case):
    assert 1 <= len(case.batches) <= cs.BATCHES_MAX
    assert case.variant in cpkv.VARIANTS and 1 <= case.seed <= 999
    capacity = cpkv.staging_capacity(case.setting)
    for batch in case.batches:
        layout = cpkv.layout_batch(case.setting, batch)
        cpkv.overflow_verdict(layout.current_pages_total, capacity.staging_slots)


def test_tight_caps_put_batches_on_both_sides_of_the_overflow_edge():
    def overflows(case):
        capacity = cpkv.staging_capacity(case.setting)
        return any(cpkv.layout_batch(case.setting, b).current_pages_total > capacity.staging_slots for b in case.batches)
    assert overflows(reach(cs.cases(tight_caps=True), overflows))
    assert not overflows(reach(cs.cases(tight_caps=True), lambda c: not overflows(c)))


@hsettings(max_examples=10)
@given(cs.cases(cp_max=3, layers_max=2, requests_max=4, tokens_max=64))
def test_every_drawn_case_replays_byte_exact_on_the_scheduled_simulator(case):
    # Property 6 (byte exactness) from Python: the simulator under the drawn schedule equals the model.
    report = cpkv.replay_batches(case.setting, case.batches, variant=case.variant, schedule="round-robin", seed=case.seed,
                                 layers=case.layers)
    run = report["runs"][0]
    assert run["passed"], run


@given(st.data())
def test_batches_takes_a_setting_strategy_too(data):
    setting = data.draw(cs.settings(cp_max=2))
    batch = data.draw(cs.batches(st.just(setting)))
    cpkv.validate(setting, batch)

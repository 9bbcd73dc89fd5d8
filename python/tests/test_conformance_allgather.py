"""Section 12's exchanges without staging under the conformance harness (issue 37): the contract
(ctx.declare_staging(None), the token split's helpers, events.write(rows=), events.collective,
ctx.check_current) and the references AllGatherZigzag / AllGatherContinuous with their planted bugs,
over real gloo ranks. Every expectation is from PROTOCOL.md sections 2, 3 and 12, worked by hand on
traces/samples/tiny.jsonl (cp 2, P 4) in the comments."""

from __future__ import annotations

import inspect
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import cpkv  # noqa: E402
from cpkv import conformance  # noqa: E402
from cpkv.conformance import _check, _happens_before, _tokens, reference  # noqa: E402

SOURCE = os.environ.get("CPKV_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
TINY = os.path.join(SOURCE, "traces", "samples", "tiny.jsonl")
IMPLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "allgather_impls.py")
R = cpkv.Request
SEED = 5
WINDOW_S = 20.0


def tiny():
    reader = cpkv.read_trace(TINY)
    return reader.setting, list(reader)


# --- the token map, from the model's owner rule (no ranks) -----------------------------------------

def test_batch_tokens_of_tiny_batch_0_by_hand():
    # Batch 0: request 0 prefix 8 extend 6 (dense slots 0-1 prefix, 2-3 current), request 1 extend 9
    # (slots 4-6). Zigzag over 2*cp = 4 blocks: extend 6 -> blocks 2,2,1,1: rank 0 offsets 0,1,5,
    # rank 1 2,3,4; extend 9 -> 3,2,2,2: rank 0 offsets 0,1,2,7,8, rank 1 3,4,5,6. So rank 0 sends
    # 8 rows and rank 1 7 (+1 padding): max_rank_tokens 8.
    setting, batches = tiny()
    layout = cpkv.layout_batch(setting, batches[0])
    zig = _tokens.token_map(layout, batches[0], "zigzag_tokens")
    assert zig.max_rank_tokens == 8
    assert zig.per_rank[0]["request"].tolist() == [0, 0, 0, 1, 1, 1, 1, 1]
    assert zig.per_rank[0]["token"].tolist() == [8, 9, 13, 0, 1, 2, 7, 8]
    assert zig.per_rank[0]["dense_row"].tolist() == [8, 9, 13, 16, 17, 18, 23, 24]
    assert zig.per_rank[0]["order"].tolist() == [0, 1, 5, 6, 7, 8, 13, 14]
    assert zig.per_rank[1]["token"].tolist() == [10, 11, 12, 3, 4, 5, 6]
    # Continuous: token t to rank t % 2.
    cont = _tokens.token_map(layout, batches[0], "continuous_tokens")
    assert cont.per_rank[0]["token"].tolist() == [8, 10, 12, 0, 2, 4, 6, 8]
    assert cont.per_rank[1]["token"].tolist() == [9, 11, 13, 1, 3, 5, 7]
    assert cont.max_rank_tokens == 8
    # Token order: request 0's 6 tokens, then request 1's 9; request 1 starts at current index 2.
    found = _tokens.rows_of(zig, 4, np.array([1, 0]), np.array([7, 13]))
    assert found["order"].tolist() == [13, 5]
    assert found["current_row"].tolist() == [(2 + 1) * 4 + 3, 1 * 4 + 1]
    assert found["dense_row"].tolist() == [23, 13]
    with pytest.raises(ValueError, match="token 7 of request 0 is not current .its current tokens are 8..13"):
        _tokens.rows_of(zig, 4, np.array([0]), np.array([7]))


# --- the batch-level checks over synthetic events (no ranks) ---------------------------------------

def _summary(rank, events):
    return {"rank": rank, "events": events, "events_used": True, "refused_at": None}


def _judge(summaries):
    setting, batches = tiny()
    replay = _check.EventReplay(setting, 2, batches[:1])
    return _happens_before.Judges(replay, 2).replay(0, summaries)


def _rank_events(rank, rows, t0, late_write=False):
    """A rank's layer 0: write its rows, enter the all-gather sending them, leave it (times in ns)."""
    write = [(t0 + (3 if late_write else 0), "token_write", rank, 0, r, 0, 0) for r in rows]
    enter = [(t0 + 1, "collective_enter", rank, 0, 1, 77, 0)] + [(t0 + 1, "collective_row", rank, 0, 1, r, 0) for r in rows]
    return sorted(write + enter + [(t0 + 10, "collective_exit", rank, 0, 1, 77, 0)])


def test_token_events_in_order_are_clean_and_a_row_with_two_writers_is_invariant_1():
    assert _judge([_summary(0, _rank_events(0, [0, 1], 100)), _summary(1, _rank_events(1, [2, 3], 100))]) == []
    lines = _judge([_summary(0, _rank_events(0, [0, 1], 100)), _summary(1, _rank_events(1, [1, 2], 100))])
    assert any(line.startswith("invariant 1") and "current row 1 (page 0 row 1) has 2 writers on layer 0" in line for line in lines), lines


def test_a_write_after_entering_the_collective_is_invariant_2_by_happens_before():
    lines = _judge([_summary(0, _rank_events(0, [0, 1], 100, late_write=True)), _summary(1, _rank_events(1, [2, 3], 100))])
    assert any("rank 0's fill of its all-gather row for current row 0 on layer 0 and rank 1's read of it through the collective" in line
               for line in lines), lines


def test_ranks_entering_different_collectives_is_invariant_7():
    other = [(e[0], e[1], e[2], e[3], e[4], 99 if e[1].startswith("collective_e") else e[5], e[6]) for e in _rank_events(1, [2], 100)]
    lines = _judge([_summary(0, _rank_events(0, [0], 100)), _summary(1, other)])
    assert any(line.startswith("invariant 7") and "collective 1" in line for line in lines), lines


def test_no_staging_makes_overflow_not_apply_and_a_refusal_says_so():
    # tiny.jsonl batch 2 has 8 current pages > 6 staging slots: with staging, a rank that composes it is a finding.
    fits = [dict(_summary(r, []), refused_at=None, wrote_before_refusal=False) for r in range(2)]
    assert _check.overflow_findings(2, fits, 8, None) == []
    assert "overflows the declared staging" in _check.overflow_findings(2, fits, 8, 6)[0]
    refused = [dict(fits[0], refused_at=0), fits[1]]
    line = _check.overflow_findings(2, refused, 8, None)[0]
    assert line.startswith("invariant 3 (overflow determinism): rank 0 batch 2: refused the batch, but it declared no staging") and "overflow does not apply" in line


def test_each_reference_adapter_is_under_60_lines():
    base = len(inspect.getsourcelines(reference._AllGather)[0])
    for cls in (reference.AllGatherZigzag, reference.AllGatherContinuous):
        assert base + len(inspect.getsourcelines(cls)[0]) < 60


# --- real runs: the references, their planted bugs, the contract's checks -------------------------

def _padding_case(split):
    # The padding shows only where a rank that is not the last pads. Zigzag, cp 2, extend 7: blocks
    # 2,2,2,1, rank 0 offsets 0,1,6 (3), rank 1 2..5 (4). Continuous, cp 3, extend 4: rank 0 offsets
    # 0,3 (2), rank 1 1 (1 + padding), rank 2 2.
    cp = 2 if split == "zigzag" else 3
    setting = cpkv.Setting(cp=cp, page_size=4, kinds=["kv_fp8"], layer_pattern="F", pool_pages=12,
                           max_total_extend_tokens=16, max_batch_requests=2)
    return setting, [cpkv.Batch([R(4, 7 if cp == 2 else 4, [3])])]


@pytest.fixture(scope="module")
def outcomes():
    setting, batches = tiny()
    names = {"zigzag": "cpkv.conformance.reference:AllGatherZigzag", "continuous": "cpkv.conformance.reference:AllGatherContinuous"}
    specs, keys = [], []
    for split, impl in names.items():
        for mutant in [None, "skipped_reorder", "wrong_rank_count"]:
            keys.append((split, mutant))
            specs.append(conformance.case(impl, setting, batches, seed=SEED, window_s=WINDOW_S, mutant=mutant, require_attention=True))
    for name in ("AssemblyOffByOne", "WriteInsideCollective", "EveryRowTwice", "RefusesWithoutStaging"):
        keys.append((name, None))
        specs.append(conformance.case(f"{IMPLS}:{name}", setting, batches, seed=SEED, window_s=WINDOW_S))
    found = dict(zip(keys, conformance.run_cases(specs)))
    swarm = conformance.case(names["zigzag"], setting, batches, seed=2, window_s=WINDOW_S, swarm=True)
    found[("zigzag", "swarm")] = conformance.run_cases([swarm])[0]
    for split in names:
        setting, batches = _padding_case(split)
        found[(split, "padding_left_in")] = conformance.run_cases([conformance.case(names[split], setting, batches, seed=SEED,
                                                                                     window_s=WINDOW_S, mutant="padding_left_in")])[0]
    return found


def _explain(o) -> str:
    return "\n".join(o.mismatches + o.findings + [o.failure or ""])


@pytest.mark.parametrize("split", ["zigzag", "continuous"])
def test_the_reference_passes_every_batch_of_tiny_with_no_invariant_3(outcomes, split):
    # Batch 2 (8 current pages > 6 staging slots) is refused by the staging references; not here.
    o = outcomes[(split, None)]
    assert o.passed, _explain(o)
    assert len(o.batches) == 3 and not any(any(b["refused"]) for b in o.batches)
    assert {"invariant 3"}.isdisjoint(o.checks_fired())
    assert all(b["events"] > 0 for b in o.batches)  # its writes and collectives reached the checkers


def test_the_swarm_holding_a_rank_inside_the_collective_still_passes(outcomes):
    o = outcomes[("zigzag", "swarm")]
    assert o.passed, _explain(o)


@pytest.mark.parametrize("split", ["zigzag", "continuous"])
@pytest.mark.parametrize("bug", ["skipped_reorder", "wrong_rank_count", "padding_left_in"])
def test_each_planted_bug_is_caught_as_a_wrong_gather_before_the_assembly(outcomes, split, bug):
    o = outcomes[(split, bug)]
    assert not o.passed and o.checks_fired()[0] == "bytes", _explain(o)
    assert "so the gather is wrong: current row" in o.mismatches[0], o.mismatches[0]


def test_wrong_rank_count_names_the_lost_row_by_hand(outcomes):
    # Batch 0, zigzag: rank 1 sends 7 rows and takes every rank's count as 7, so it loses rank 0's
    # 8th row: request 1 token 8, token order 14, which stays zero.
    line = next(m for m in outcomes[("zigzag", "wrong_rank_count")].mismatches if "rank 1 " in m)
    assert "current row 14 in token order (request 1 token 8, rank 0's all-gather row 7)" in line, line
    assert "the wrong row is zeros" in line, line


def test_a_wrong_assembly_is_told_apart_from_a_wrong_gather(outcomes):
    o = outcomes[("AssemblyOffByOne", None)]
    assert not o.passed and o.mismatches, _explain(o)
    assert "the current rows in token order were right before the dense assembly (ctx.check_current), so the assembly is wrong" in o.mismatches[0]


def test_a_write_inside_the_collective_is_invariant_2_and_a_doubled_writer_invariant_1(outcomes):
    late, twice = outcomes[("WriteInsideCollective", None)], outcomes[("EveryRowTwice", None)]
    assert late.checks_fired() == ["invariant 2"], _explain(late)
    assert "read of it through the collective" in late.findings[0]
    assert "invariant 1" in twice.checks_fired() and not twice.mismatches, _explain(twice)


def test_a_refusal_without_staging_is_invariant_3_saying_overflow_does_not_apply(outcomes):
    o = outcomes[("RefusesWithoutStaging", None)]
    assert o.checks_fired() == ["invariant 3"], _explain(o)
    assert "declared no staging (ctx.declare_staging(None)): overflow does not apply" in o.findings[0]

"""Reuse hazards judged by happens-before, not by this run's timing (issue 35, item 8).

Why it matters: PROTOCOL.md section 6 says a rank may write a parity half again only after every
peer's reads of it are ordered before the write by the barriers. The state checker sees a hazard
only when the run's timing made the write and the read overlap; on an idle machine, or with no
delays, a broken exchange then passes most of the time. Here the order the synchronization imposes
(vector clocks: a barrier pass joins every arrival of its phase, a collective joins all) decides, so
a write that nothing orders after a peer's read is a finding on every run. Expectations come from
section 6, not from the harness's output: a zero of the wrong half and a single half are hazards on
every seed; the correct references are not.
"""

from __future__ import annotations

import os
import subprocess

import pytest

torch = pytest.importorskip("torch")

import cpkv  # noqa: E402
from cpkv import conformance  # noqa: E402
from cpkv.conformance import _check  # noqa: E402
from cpkv.conformance._happens_before import HappensBefore, judge_event_log  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("CPKV_SOURCE_DIR", os.path.join(HERE, "..", ".."))
TINY = os.path.join(SOURCE, "traces", "samples", "tiny.jsonl")
GOLDEN = os.path.join(SOURCE, "tests", "golden")
RACES = os.path.join(HERE, "conformance_races.py")
SEEDS = range(1, 7)
# Generous: these cases only pass or fail on their findings, never by running into a wait's bound.
WINDOW_S = 20.0
R = cpkv.Request


def whole_pages_case():
    """cp 2, P 4, four layers, and batches of whole current pages only (no partial page: a fill covers
    every byte of its pages, so a zero that lands in the wrong half leaves this rank's bytes right)."""
    setting = cpkv.Setting(cp=2, page_size=4, kinds=["kv_fp8", "indexer_k"], layer_pattern="FSFS", pool_pages=16,
                           max_total_extend_tokens=24, max_batch_requests=2)
    return setting, [cpkv.Batch([R(8, 8, [5, 2]), R(0, 12, [])]), cpkv.Batch([R(4, 16, [3])])]


def summaries(*ranks):
    """Per-rank summaries as the batch sync hands them to rank 0: events (ns, what, rank, layer, a, b, c)."""
    return [{"rank": r, "events": list(events), "events_used": True} for r, events in enumerate(ranks)]


def two_layers(rank0_layer1_zero_ns: int):
    """Two ranks, two layers, one current page each (index 0 on rank 0, 1 on rank 1), a counting
    barrier per layer. Rank 0 zeroes its page of HALF 0 on layer 1 (the wrong half: layer 1 is half 1)
    at the given time; rank 1 reads rank 0's half 0 on layer 0 at t=40 and arrives at layer 1's
    barrier at t=90."""
    t = rank0_layer1_zero_ns
    rank0 = [(1, "layer_begin", 0, 0, 0, 0, 0), (10, "write", 0, 0, 0, 0, 0), (11, "write", 0, 0, 0, 0, 1), (12, "arrive", 0, 0, 1, 0, 0),
             (30, "passed", 0, 0, 1, 0, 0), (31, "read", 0, 0, 0, 0, 0), (32, "read", 0, 0, 1, 0, 1), (33, "layer_end", 0, 0, 0, 0, 0),
             (34, "layer_begin", 0, 1, 0, 0, 0), (t, "write", 0, 1, 0, 0, 0), (t + 1, "write", 0, 1, 1, 0, 1), (t + 2, "arrive", 0, 1, 2, 0, 0),
             (t + 80, "passed", 0, 1, 2, 0, 0), (t + 90, "layer_end", 0, 1, 0, 0, 0)]
    rank1 = [(2, "layer_begin", 1, 0, 0, 0, 0), (13, "write", 1, 0, 0, 1, 0), (14, "write", 1, 0, 0, 1, 1), (15, "arrive", 1, 0, 1, 0, 0),
             (35, "passed", 1, 0, 1, 0, 0), (40, "read", 1, 0, 0, 0, 0), (41, "read", 1, 0, 1, 0, 1), (42, "layer_end", 1, 0, 0, 0, 0),
             (43, "layer_begin", 1, 1, 0, 0, 0), (88, "write", 1, 1, 1, 1, 0), (89, "write", 1, 1, 1, 1, 1), (90, "arrive", 1, 1, 2, 0, 0),
             (95 + t, "passed", 1, 1, 2, 0, 0), (96 + t, "layer_end", 1, 1, 0, 0, 0)]
    return rank0, rank1


def fixed(rank0):
    """The same log with rank 0's layer-1 writes in half 1, as the protocol has them."""
    return [(ns, what, rank, layer, 1 if (what == "write" and layer == 1) else a, b, c) for ns, what, rank, layer, a, b, c in rank0]


def state_checker_lines(batch_summaries):
    setting = cpkv.Setting(cp=2, page_size=4, kinds=["kv_fp8"], layer_pattern="FS", pool_pages=8, max_total_extend_tokens=8,
                           max_batch_requests=2)
    replay = _check.EventReplay(setting, 2, [cpkv.Batch([R(0, 8, [])])])
    return replay.replay(0, batch_summaries)


def test_a_zero_of_the_wrong_half_is_concurrent_with_the_read_it_overwrites_whatever_the_timing():
    """Lucky timing (rank 1 finished reading at t=41; rank 0 zeroes at t=60): the state checker,
    judging this interleaving, sees nothing; happens-before sees that no barrier orders rank 1's read
    of layer 0 before rank 0's zero on layer 1 (rank 0 passed barrier 1 on rank 1's arrival, which came
    before the read), so the read may see zeros on another run."""
    lucky = summaries(*two_layers(60))
    assert state_checker_lines(lucky) == []
    lines = HappensBefore(2).judge(0, lucky)
    assert lines, "a zero of the wrong half must be a finding whatever the timing"
    assert lines[0].startswith("invariant 2 (parity-half reuse safety): batch 0: rank 0's zero of its half 0 slot 0 on layer 1 "
                               "and rank 1's read of it on layer 0 are concurrent"), lines


def test_the_protocols_order_has_no_concurrent_write_and_read():
    """The same two layers with the layer-1 writes in half 1 (section 5): every read of a half is
    ordered after the fill it reads and before the owner's next write of that half."""
    rank0, rank1 = two_layers(60)
    assert HappensBefore(2).judge(0, summaries(fixed(rank0), rank1)) == []


def test_an_arrival_before_the_fill_makes_the_read_concurrent_with_the_fill():
    """arrive_before_fill (section 9): a peer may pass the barrier before the fill it then reads."""
    rank0, rank1 = two_layers(60)
    early = [(1, "layer_begin", 0, 0, 0, 0, 0), (10, "arrive", 0, 0, 1, 0, 0), (11, "write", 0, 0, 0, 0, 0), (12, "write", 0, 0, 0, 0, 1)]
    early += fixed(rank0)[4:]
    lines = HappensBefore(2).judge(0, summaries(early, rank1))
    assert any("rank 0's fill of its half 0 slot 0 on layer 0 and rank 1's read of it on layer 0 are concurrent" in line for line in lines), lines


@pytest.fixture(scope="module")
def seeded():
    """Six seeds with no injected delays, per implementation, one session each."""
    setting, batches = whole_pages_case()
    impls = {"zeroes_the_other_half": (f"{RACES}:ZeroesTheOtherHalf", None), "single_half": ("cpkv.conformance.reference:StagingDirect", "single_half"),
             "correct_staging_direct": ("cpkv.conformance.reference:StagingDirect", None), "correct_v2": ("cpkv.conformance.reference:V2", None)}
    out = {}
    for name, (impl, mutant) in impls.items():
        cases = [conformance.case(impl, setting, batches, seed=seed, delays=False, mutant=mutant, window_s=WINDOW_S) for seed in SEEDS]
        out[name] = conformance.run_cases(cases)
    return out


def _caught_by_happens_before(outcome) -> bool:
    return any(line.startswith("invariant 2") and "(happens-before" in line for line in outcome.findings)


def test_a_zero_of_the_wrong_half_whose_bytes_are_right_is_caught_on_every_seed_without_delays(seeded):
    outcomes = seeded["zeroes_the_other_half"]
    assert len(outcomes) == len(SEEDS)
    caught = [seed for seed, o in zip(SEEDS, outcomes) if _caught_by_happens_before(o)]
    assert caught == list(SEEDS), [o.findings for o in outcomes]


def test_a_single_parity_half_is_caught_on_every_seed_without_delays(seeded):
    outcomes = seeded["single_half"]
    caught = [seed for seed, o in zip(SEEDS, outcomes) if _caught_by_happens_before(o)]
    assert caught == list(SEEDS), [o.findings + o.mismatches for o in outcomes]


@pytest.mark.parametrize("name", ["correct_staging_direct", "correct_v2"])
def test_the_correct_references_have_no_concurrent_write_and_read(seeded, name):
    for seed, outcome in zip(SEEDS, seeded[name]):
        assert outcome.passed, (seed, outcome.mismatches + outcome.findings + [outcome.failure or ""])


# --- the simulator's event log (docs/event-log.md) --------------------------------------------------

def _golden(name: str):
    with open(os.path.join(GOLDEN, name)) as f:
        return f.read().splitlines()


def test_the_simulators_log_of_a_correct_run_has_no_race():
    assert judge_event_log(_golden("event-log-tiny-seed7-none.log"), cp=2) == []


def test_the_simulators_log_of_a_single_half_run_shows_the_race():
    lines = judge_event_log(_golden("event-log-tiny-seed7-single_half.log"), cp=2, halves=1)
    assert lines and all(line.startswith("invariant 2 (parity-half reuse safety)") for line in lines), lines


@pytest.mark.parametrize("mutant", ["no_barrier", "arrive_before_fill"])
def test_the_simulators_log_of_a_planted_bug_shows_the_race_whatever_the_schedule(tmp_path, cli, mutant):
    """A scheduled run of a planted bug, under the round-robin schedule (whose interleaving may or may
    not have made the read and the write overlap): its log shows the race; the same schedule of the
    correct protocol shows none."""
    logs = {}
    for name in (mutant, "none"):
        log = tmp_path / f"{name}.log"
        run = subprocess.run([cli, "replay", TINY, "--variant", "staging_direct", "--schedule", "round-robin", "--seed", "7", "--mutant", name,
                              "--event-log", str(log)], capture_output=True, text=True, timeout=300)
        assert log.exists(), run.stderr
        logs[name] = log.read_text().splitlines()
    assert judge_event_log(logs["none"], cp=2) == []
    lines = judge_event_log(logs[mutant], cp=2)
    assert any(" and rank " in line and "are concurrent" in line for line in lines), lines

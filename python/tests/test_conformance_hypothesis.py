"""Hypothesis drives the harness over a persistent session and shrinks a caught bug to a minimal case.

Why it matters: an engine team writes property tests over its own exchange; a failure must come back
as the smallest batch that shows it, printed so that it rebuilds, with a trace and a command.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("hypothesis")

import cpkv  # noqa: E402
from cpkv import Batch, Request  # noqa: E402,F401  (eval of the printed example)
from cpkv.conformance import hypothesis_search  # noqa: E402

# No example here runs into a wait's bound (skip_zero is caught by its bytes; the correct reference
# passes), so the bound is one no loaded machine's stall reaches: it costs nothing when nothing waits.
WINDOW_S = 20.0


def test_a_skipped_zero_shrinks_to_one_request_with_a_partial_page(tmp_path):
    setting = cpkv.Setting(**hypothesis_search.DEFAULT_SETTING)
    report = hypothesis_search.search("cpkv.conformance.reference:StagingDirect", "skip_zero", setting, seed=1, max_examples=20,
                                      window_s=WINDOW_S, out_dir=str(tmp_path))
    assert report is not None, "skip_zero was not caught in 20 examples"
    example = report.splitlines()[0].split(": ", 1)[1]
    batches = eval(example)
    # The spec's minimal witness: one batch, one request, whose last current page is partial (its tail
    # must be zero and is staging poison instead).
    assert len(batches) == 1 and len(batches[0]) == 1, example
    assert batches[0].requests[0].extend_len % setting.page_size != 0, example
    assert "0xa5 staging poison" in report and "replay: cpkv replay " in report and "--backend torch --impl cpkv.conformance.reference:StagingDirect " in report


def test_the_correct_reference_passes_every_example(tmp_path):
    setting = cpkv.Setting(**hypothesis_search.DEFAULT_SETTING)
    assert hypothesis_search.search("cpkv.conformance.reference:V2", None, setting, seed=1, max_examples=8, window_s=WINDOW_S,
                                    out_dir=str(tmp_path)) is None

"""The pytest plugin and the picklable, printable model values the conformance harness relies on.

Why it matters: spawned ranks receive Setting and Batch by pickling, and a Hypothesis falsifying
example or a failing case is only reproducible if its printout rebuilds it.
"""

from __future__ import annotations

import os
import pickle

import pytest

import cpkv
from cpkv import Batch, Request, Setting  # noqa: F401  (eval of the reprs below needs the names)

SOURCE = os.environ.get("CPKV_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
TINY = os.path.join(SOURCE, "traces", "samples", "tiny.jsonl")

pytest_plugins = ["pytester"]


def test_setting_batch_and_request_pickle_and_their_reprs_rebuild_them():
    reader = cpkv.read_trace(TINY)
    setting, batch = reader.setting, list(reader)[0]
    assert pickle.loads(pickle.dumps(setting)) == setting
    assert pickle.loads(pickle.dumps(batch)) == batch
    assert pickle.loads(pickle.dumps(batch.requests[0])) == batch.requests[0]
    assert eval(repr(setting)) == setting
    assert eval(repr(batch)) == batch
    assert "prefix_pages=[5, 2]" in repr(batch)


def test_the_plugin_parametrises_over_a_traces_batches(pytester):
    pytester.makepyfile("""
        import cpkv

        def test_each_batch_is_valid(cpkv_batch, cpkv_seed):
            setting, batch, index = cpkv_batch
            cpkv.validate(setting, batch)
            assert cpkv_seed == 9
    """)
    result = pytester.runpytest("-p", "cpkv.pytest_plugin", "--cpkv-trace", TINY, "--cpkv-seed", "9", "-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)


def test_without_a_trace_the_batch_tests_skip_saying_why(pytester):
    pytester.makepyfile("def test_each(cpkv_batch):\n    pass\n")
    result = pytester.runpytest("-p", "cpkv.pytest_plugin", "-q", "-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*needs --cpkv-trace FILE*"])

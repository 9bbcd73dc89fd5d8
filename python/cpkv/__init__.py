"""cpkv: the context-parallel shared-KV compose exchange testbed, from Python.

The same C++ model, trace format and rank simulator as the ``cpkv`` command, for a serving
engine's scheduler, model runner and kernel tests (PROTOCOL.md is the specification).

Capture
    ``TraceWriter(path, setting)`` writes trace format v1, one ``add_batch(...)`` per scheduled
    batch, byte for byte as the C++ writer; ``read_trace(path)`` streams it back with the reader's
    validation (a bad line raises ``TraceError`` with file, line, field and reason).

Differential checking
    ``layout_batch`` (slots, writers, current indices), ``staging_capacity`` and
    ``overflow_verdict``, ``variant_plan`` (each variant's gathers for a rank, as NumPy arrays),
    ``page_inverse``, ``ragged_index_plan``, ``layer_bytes``; the content of any row
    (``prefix_row_key``, ``current_row_key``, ``row_content``, ``prefix_page_rows``,
    ``current_rows``); ``expected_dense`` as a NumPy array; ``compare_dense``, ``check_dense``,
    ``first_mismatch`` and ``assert_dense_equal`` name the first wrong rank, slot, row and byte.

Attention plans (PROTOCOL.md section 11; docs/attention.md)
    ``RaggedSegment`` (request, q_base, q_len, kv_len, k_base), ``expected_attention_plan`` (the
    plain oracle of a rank's plan), ``check_attention_plan`` (invariant 9 on one rank: None or a
    located ``AttentionFinding``), ``check_attention_coverage`` (over the group), ``rank_queries``,
    ``request_key_base``, ``QuerySplit``; ``cpkv.attention``: converters from engines' forms
    (FlashAttention, FlashInfer, zigzag halves) and a bit-reproducible reference attention.

Property tests
    ``cpkv.strategies``: Hypothesis strategies (``settings()``, ``batches()``, ``cases()``) that
    draw what the C++ generators draw.

Replay and plan
    ``plan(path)`` and ``replay(path, backend="sim")`` return what ``cpkv plan --json FILE`` and
    ``cpkv replay --json`` write; ``replay(path, backend="torch", impl="module:Class")`` runs the
    conformance harness (``cpkv.conformance``) and returns what its ``--json`` writes;
    ``replay_batches`` replays batches held in memory.

Bad input raises ``InputError`` or ``TraceError`` (both ValueErrors) with the command's one line.
Every number comes from the C++ model; this package only converts and arranges.
"""

from __future__ import annotations

import os as _os
import sys as _sys

# No torch here (issue 34, item 22): a trace library paid 2.4 s and 234 MB for it; only
# cpkv.conformance imports torch. `import cpkv` before `import torch` once aborted in torch's CUDA
# start on the GPU machine ("free(): invalid pointer", PyTorch 2.11 with pybind11 3.1): the module
# exported 869 symbols (fmt, std:: and nlohmann instances, cpkv's own). It now exports its init
# function only (python/exports.map), and both orders pass there (2026-12-06, one H100).
from . import _cpkv
from ._check import assert_dense_equal, first_mismatch
from ._cpkv import (
    BUFFER_KINDS,
    FORMAT_NAME,
    AttentionFinding,
    FORMAT_VERSION,
    LIMITS,
    QUERY_SPLITS,
    SKIP,
    SPLIT_POLICIES,
    VARIANTS,
    ZERO_FILL,
    Batch,
    BatchLayout,
    BufferKind,
    CurrentPage,
    LayerBytes,
    Mismatch,
    PageInverse,
    QuerySplit,
    RaggedIndexPlan,
    RaggedIndexSegment,
    RaggedSegment,
    Request,
    RowSource,
    Setting,
    Slot,
    StagingCapacity,
    TraceHeader,
    TraceReader,
    TraceWriter,
    VariantPlan,
    Verdict,
    check_attention_coverage,
    check_attention_plan,
    check_dense,
    compare_dense,
    current_row_key,
    current_rows,
    expected_attention_plan,
    expected_dense,
    expected_row,
    layer_bytes,
    layout_batch,
    overflow_verdict,
    page_inverse,
    prefix_page_rows,
    prefix_row_key,
    ragged_index_plan,
    rank_queries,
    read_trace,
    request_key_base,
    MUTANTS,
    replay,
    replay_batches,
    row_content,
    row_source,
    staging_capacity,
    staging_direct_plan,
    validate,
    variant_plan,
)
from ._errors import DenseMismatchError, InputError, TraceError
from ._plan import plan, plan_batch

__version__ = "0.1.0"

__all__ = [
    # errors
    "TraceError", "InputError", "DenseMismatchError",
    # setting and batch
    "Setting", "BufferKind", "Request", "Batch", "validate", "BUFFER_KINDS", "SPLIT_POLICIES", "VARIANTS", "LIMITS",
    # traces
    "TraceWriter", "TraceReader", "TraceHeader", "read_trace", "FORMAT_NAME", "FORMAT_VERSION",
    # layout, staging, plans
    "layout_batch", "BatchLayout", "Slot", "CurrentPage", "row_source", "RowSource",
    "staging_capacity", "StagingCapacity", "overflow_verdict", "Verdict",
    "variant_plan", "VariantPlan", "staging_direct_plan", "ZERO_FILL", "SKIP",
    "page_inverse", "PageInverse", "ragged_index_plan", "RaggedIndexPlan", "RaggedIndexSegment", "layer_bytes", "LayerBytes",
    # attention plans (invariant 9)
    "RaggedSegment", "QuerySplit", "QUERY_SPLITS", "AttentionFinding", "expected_attention_plan", "check_attention_plan",
    "check_attention_coverage", "rank_queries", "request_key_base",
    # content and checking
    "prefix_row_key", "current_row_key", "row_content", "prefix_page_rows", "current_rows",
    "expected_row", "expected_dense", "compare_dense", "check_dense", "Mismatch", "first_mismatch", "assert_dense_equal",
    # plan and replay
    "plan", "plan_batch", "replay", "replay_batches", "MUTANTS",
]

# help(cpkv) and reprs name the package, not the extension module.
for _name in __all__:
    _value = globals()[_name]
    if isinstance(_value, type) and getattr(_value, "__module__", "").startswith("cpkv."):
        try:
            _value.__module__ = "cpkv"
        except (AttributeError, TypeError):
            pass
del _name, _value

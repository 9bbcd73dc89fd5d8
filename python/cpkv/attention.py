"""cpkv.attention: a rank's attention plan in the neutral form, converters from the forms engines
write, and a bit-reproducible reference attention (PROTOCOL.md section 11; docs/attention.md).

The neutral form is a list of segments ``(request, q_base, q_len, kv_len, k_base)``: the queries are
the current tokens ``q_base .. q_base + q_len - 1`` of ``request`` (offsets within its extend),
packed in the rank's query order; the last of them sees ``kv_len`` keys (``prefix_len + q_base +
q_len``; query ``t`` sees keys ``0 .. prefix_len + t``); key ``j`` of the request is dense row
``k_base + j``. As objects it is a list of ``cpkv.RaggedSegment``; as a tensor an ``(n, 5)`` int64
array with those columns (what ``compose_layer`` may return under the key ``"attention"``).

Converters (pure NumPy; a torch tensor is read through ``.detach().cpu()``) take each engine form's
arrays plus what those arrays cannot say: the request and the ``q_base`` of each sequence (an
engine's sequence is a run of query tokens of one request), and each request's ``k_base`` (where
its keys begin in the buffer the kernel reads; ``key_bases(setting, batch)`` gives cpkv's dense
layout). Sequences with no query token (padding) are dropped.

``reference(q, dense, segments)`` is an attention over a dense buffer whose result depends only on
the set of keys each query sees, so a rank's output equals the single-device output of the same
queries bit for bit exactly when its plan (and its dense bytes) are right. This module imports
torch only inside the functions that take tensors.
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Sequence, Union

import numpy as np

from . import _cpkv
from ._errors import InputError

RaggedSegment = _cpkv.RaggedSegment
QuerySplit = _cpkv.QuerySplit
COLUMNS = ("request", "q_base", "q_len", "kv_len", "k_base")

__all__ = ["RaggedSegment", "QuerySplit", "COLUMNS", "as_array", "as_segments", "key_bases", "single_device_plan",
           "from_cu_seqlens", "from_seqused_k", "from_indptr", "from_zigzag_halves", "reference", "qkv_of_rows",
           "query_rows", "output_difference", "HEAD_DIM"]


def _host(values: Any) -> np.ndarray:
    """Any array-like (list, NumPy, a torch tensor on any device) as a NumPy array on the host."""
    if hasattr(values, "detach") and hasattr(values, "cpu"):
        values = values.detach().cpu().numpy()
    return np.asarray(values)


def _ints(values: Any, field: str) -> np.ndarray:
    """A 1-D array of integers as int64; InputError naming `field` otherwise."""
    array = _host(values)
    if array.ndim != 1:
        raise InputError(field, f"shape {array.shape}, expected a 1-D array")
    if array.size and array.dtype.kind not in "iu":
        raise InputError(field, f"dtype {array.dtype}, expected integers")
    return array.astype(np.int64)


def as_array(plan: Any) -> np.ndarray:
    """A plan (a list of RaggedSegment or of 5-tuples, an (n, 5) array or tensor) as an (n, 5) int64
    NumPy array; InputError naming what is wrong with any other value."""
    if isinstance(plan, (list, tuple)):
        rows = [s.as_tuple() if isinstance(s, RaggedSegment) else tuple(s) for s in plan]
        if any(len(r) != 5 for r in rows):
            raise InputError("plan", "every segment needs 5 numbers: request, q_base, q_len, kv_len, k_base")
        return np.array(rows, dtype=np.int64).reshape(len(rows), 5)
    array = _host(plan)
    if array.ndim != 2 or array.shape[1] != 5:
        raise InputError("plan", f"shape {array.shape}, expected (n, 5): request, q_base, q_len, kv_len, k_base")
    if array.size and array.dtype.kind not in "iu":
        raise InputError("plan", f"dtype {array.dtype}, expected int64")
    return array.astype(np.int64)


def as_segments(plan: Any) -> List[RaggedSegment]:
    """A plan in any form as a list of cpkv.RaggedSegment."""
    return [RaggedSegment(*map(int, row)) for row in as_array(plan)]


def key_bases(setting: _cpkv.Setting, batch: _cpkv.Batch) -> np.ndarray:
    """int64 per request: cpkv's dense row of its key 0 (section 3: each request's prefix slots, then
    its current slots, P rows each)."""
    return np.asarray(_cpkv.request_key_base(setting, batch), dtype=np.int64)


def single_device_plan(setting: _cpkv.Setting, batch: _cpkv.Batch) -> np.ndarray:
    """The plan of one device computing the whole batch: one segment per request, every token."""
    base = key_bases(setting, batch)
    rows = [(r, 0, q.extend_len, q.prefix_len + q.extend_len, base[r]) for r, q in enumerate(batch.requests)]
    return np.array(rows, dtype=np.int64).reshape(len(rows), 5)


def _per_request(k_base: Union[Sequence[int], Mapping[int, int], Any], requests: np.ndarray) -> np.ndarray:
    """Each sequence's k_base from a per-request sequence (indexed by request) or mapping."""
    if isinstance(k_base, Mapping):
        missing = [int(r) for r in requests if int(r) not in k_base]
        if missing:
            raise InputError("k_base", f"no k_base for request {missing[0]}")
        return np.array([int(k_base[int(r)]) for r in requests], dtype=np.int64)
    bases = _ints(k_base, "k_base")
    if requests.size and (requests.min() < 0 or requests.max() >= bases.size):
        raise InputError("k_base", f"{bases.size} entries (one per request), but a sequence names request {int(requests.max())}")
    return bases[requests]


def _segments(request: Any, q_base: Any, q_len: np.ndarray, kv_len: np.ndarray, k_base: Any) -> np.ndarray:
    """The (n, 5) plan of sequences with these columns, those without a query dropped."""
    requests, bases = _ints(request, "request"), _ints(q_base, "q_base")
    for field, column in (("request", requests), ("q_base", bases), ("kv_len", kv_len)):
        if column.size != q_len.size:
            raise InputError(field, f"{column.size} entries for {q_len.size} sequences")
    if np.any(q_len < 0):
        raise InputError("q_len", f"sequence {int(np.argmax(q_len < 0))} has a negative length")
    keep = q_len > 0
    out = np.stack([requests, bases, q_len, kv_len, _per_request(k_base, requests)], axis=1) if q_len.size else np.zeros((0, 5), np.int64)
    return out[keep].astype(np.int64)


def _lengths(cu: Any, field: str) -> np.ndarray:
    offsets = _ints(cu, field)
    if offsets.size < 1:
        raise InputError(field, "empty: cumulative offsets start with 0 and have one entry per sequence more")
    if offsets[0] != 0:
        raise InputError(field, f"starts at {int(offsets[0])}, expected 0")
    lengths = np.diff(offsets)
    if np.any(lengths < 0):
        raise InputError(field, f"decreases after entry {int(np.argmax(lengths < 0))}")
    return lengths


def from_cu_seqlens(cu_seqlens_q: Any, cu_seqlens_k: Any, *, request: Any, q_base: Any, k_base: Any) -> np.ndarray:
    """FlashAttention varlen (``flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, ...,
    causal=True)``): sequence i has ``cu_seqlens_q[i+1] - cu_seqlens_q[i]`` queries and
    ``cu_seqlens_k[i+1] - cu_seqlens_k[i]`` keys; causal masks align the queries to the end of the
    keys, so that key count is the kv_len of the sequence's last query. request[i], q_base[i]: the
    request and extend offset of sequence i's first query; k_base: per request (a sequence indexed by
    request, or a mapping), the dense row of its key 0. Returns the (n, 5) int64 plan."""
    q_len, kv_len = _lengths(cu_seqlens_q, "cu_seqlens_q"), _lengths(cu_seqlens_k, "cu_seqlens_k")
    if kv_len.size != q_len.size:
        raise InputError("cu_seqlens_k", f"{kv_len.size} sequences, cu_seqlens_q has {q_len.size}")
    return _segments(request, q_base, q_len, kv_len, k_base)


def from_seqused_k(cu_seqlens_q: Any, seqused_k: Any, *, request: Any, q_base: Any, k_base: Any) -> np.ndarray:
    """FlashAttention with ``seqused_k`` (keys in a padded or paged buffer): sequence i's queries from
    ``cu_seqlens_q`` and ``seqused_k[i]`` keys used (its last query's kv_len). The other arguments
    as from_cu_seqlens."""
    q_len = _lengths(cu_seqlens_q, "cu_seqlens_q")
    return _segments(request, q_base, q_len, _ints(seqused_k, "seqused_k"), k_base)


def from_indptr(qo_indptr: Any, kv_indptr: Any, *, request: Any, q_base: Any, k_base: Any) -> np.ndarray:
    """FlashInfer ragged prefill (``BatchPrefillWithRaggedKVCacheWrapper.plan(qo_indptr, kv_indptr,
    ..., causal=True)``): the same reading as from_cu_seqlens (queries aligned to the end of the
    sequence's keys)."""
    q_len, kv_len = _lengths(qo_indptr, "qo_indptr"), _lengths(kv_indptr, "kv_indptr")
    if kv_len.size != q_len.size:
        raise InputError("kv_indptr", f"{kv_len.size} sequences, qo_indptr has {q_len.size}")
    return _segments(request, q_base, q_len, kv_len, k_base)


def from_zigzag_halves(q_len_prev: Any, q_len_next: Any, kv_len_prev: Any, kv_len_next: Any, *, request: Any, q_base_prev: Any,
                       q_base_next: Any, k_base: Any) -> np.ndarray:
    """A zigzag token split's per-half lengths (upstream CP prefill: rank k holds token blocks k
    ("prev") and 2cp-1-k ("next") of each request): entry i is one request's two halves on this rank,
    request[i] that request, q_base_prev[i] / q_base_next[i] the extend offsets the halves begin at.
    The plan lists each request's prev half then its next half (the rank's query order: request by
    request, tokens ascending); an empty half is dropped."""
    q_prev, q_next = _ints(q_len_prev, "q_len_prev"), _ints(q_len_next, "q_len_next")
    prev = _segments(request, q_base_prev, q_prev, _ints(kv_len_prev, "kv_len_prev"), k_base)  # rows: entries with q_prev > 0
    nxt = _segments(request, q_base_next, q_next, _ints(kv_len_next, "kv_len_next"), k_base)
    rows, taken = [], [0, 0]
    for i in range(q_prev.size):
        for half, lengths, kept in ((0, q_prev, prev), (1, q_next, nxt)):
            if lengths[i] > 0:
                rows.append(kept[taken[half]])
                taken[half] += 1
    return np.array(rows, dtype=np.int64).reshape(len(rows), 5)


# --- the reference attention -------------------------------------------------------------------

# Head dimension of q, k and v. k, v and q of a row are its bytes 0..15, 16..31 and 32..47 (modulo
# the row's bytes), each byte's low four bits minus 8: integers in -8..7.
HEAD_DIM = 16
# Scores are floor(q.k / 8): integers. Weights are 2 ** max(score - row max, WEIGHT_EXP_MIN), built
# from their exponent bits, so every product and sum below is exact in float64 as long as a query
# sees fewer than KEYS_MAX keys (8 * KEYS_MAX * 2**24 < 2**53): the only rounding is the final
# division, correctly rounded on CPU and CUDA alike. Hence the result of a query does not depend on
# the order, blocking or device of the sums, only on the keys it sees.
SCORE_DIVISOR = 8
WEIGHT_EXP_MIN = -24
KEYS_MAX = 1 << 26
# Queries computed together (bounds the (block, kv_len) score matrix).
QUERY_BLOCK = 256


def qkv_of_rows(rows: Any):
    """(q, k, v): float64 (n, HEAD_DIM) tensors of integers in -8..7 derived from uint8 rows (n, row_bytes)."""
    import torch

    rows = torch.as_tensor(rows)
    if rows.dtype != torch.uint8 or rows.dim() != 2:
        raise InputError("rows", f"dtype {rows.dtype} shape {tuple(rows.shape)}, expected uint8 (n, row_bytes)")
    columns = torch.arange(3 * HEAD_DIM, device=rows.device) % rows.shape[1]
    nibbles = (rows[:, columns] & 15).to(torch.float64) - 8
    return nibbles[:, 2 * HEAD_DIM:], nibbles[:, :HEAD_DIM], nibbles[:, HEAD_DIM:2 * HEAD_DIM]


def query_rows(setting: _cpkv.Setting, batch: _cpkv.Batch, plan: Any) -> np.ndarray:
    """int64 per query of the plan (in its order): the dense row of that token's own KV row, the row
    its q is derived from (qkv_of_rows(dense[query_rows(...)])[0])."""
    segments = as_array(plan)
    base = key_bases(setting, batch)
    rows = []
    for request, q_base, q_len, _, _ in segments:
        start = base[request] + batch.requests[int(request)].prefix_len + q_base
        rows.append(np.arange(start, start + q_len, dtype=np.int64))
    return np.concatenate(rows) if rows else np.zeros(0, np.int64)


def _exact_power_of_two(exponent):
    """2.0 ** exponent for integer-valued float64 exponents in [-1022, 1023], from the bits."""
    import torch

    return ((exponent.to(torch.int64) + 1023) << 52).view(torch.float64)


def _segment_block(q, keys, values, visible_count):
    """Attention of a block of queries over keys[0:max visible]: query i sees keys 0..visible_count[i]-1."""
    import torch

    scores = torch.floor((q @ keys.T) / SCORE_DIVISOR)
    visible = torch.arange(keys.shape[0], device=q.device)[None, :] < visible_count[:, None]
    top = scores.masked_fill(~visible, float("-inf")).max(dim=1, keepdim=True).values
    exponent = torch.clamp(torch.where(visible, scores - top, torch.zeros_like(scores)), min=WEIGHT_EXP_MIN)
    weights = torch.where(visible, _exact_power_of_two(exponent), torch.zeros_like(scores))
    return (weights @ values) / weights.sum(dim=1, keepdim=True)


def reference(q: Any, dense: Any, segments: Any):
    """The reference attention of one rank: q, float64 (n, HEAD_DIM) integers in -8..7 (qkv_of_rows
    gives them), one row per query of the plan in its order; dense, the (rows, row_bytes) uint8
    buffer the keys are read from (k and v of each row by qkv_of_rows); segments, the plan in any
    form. Returns float64 (n, HEAD_DIM) on q's device. Query i of segment (r, q_base, q_len, kv_len,
    k_base) sees dense rows k_base .. k_base + kv_len - q_len + i. Bit-reproducible (see
    WEIGHT_EXP_MIN): the same keys give the same row on any device, in any call."""
    import torch

    plan = as_array(segments)
    q = torch.as_tensor(q)
    dense = torch.as_tensor(dense)
    if q.dtype != torch.float64 or q.dim() != 2 or q.shape[1] != HEAD_DIM:
        raise InputError("q", f"dtype {q.dtype} shape {tuple(q.shape)}, expected float64 (n, {HEAD_DIM})")
    if q.numel() and not bool(((q == torch.round(q)) & (q >= -8) & (q <= 7)).all()):
        raise InputError("q", "values must be integers in -8..7 (qkv_of_rows): the result is exact only for them")
    total = int(plan[:, 2].sum()) if plan.size else 0
    if total != q.shape[0]:
        raise InputError("q", f"{q.shape[0]} rows, the plan holds {total} queries")
    rows = dense.reshape(dense.shape[0], -1)
    if rows.dtype != torch.uint8 or rows.device != q.device:
        raise InputError("dense", f"dtype {rows.dtype} on {rows.device}, expected uint8 rows on {q.device} (q's device)")
    out = torch.empty_like(q)
    at = 0
    for index, (_, _, q_len, kv_len, k_base) in enumerate(plan.tolist()):
        first_count = kv_len - q_len + 1
        if q_len < 1 or first_count < 1 or k_base < 0 or k_base + kv_len > rows.shape[0] or kv_len >= KEYS_MAX:
            raise InputError("segments", f"segment {index}: q_len {q_len} kv_len {kv_len} k_base {k_base}: its keys are not rows of "
                                         f"the {rows.shape[0]}-row dense buffer")
        _, keys, values = qkv_of_rows(rows[k_base:k_base + kv_len])
        for block in range(0, q_len, QUERY_BLOCK):
            n = min(QUERY_BLOCK, q_len - block)
            count = torch.arange(first_count + block, first_count + block + n, device=q.device)
            last = first_count + block + n - 1
            out[at + block:at + block + n] = _segment_block(q[at + block:at + block + n], keys[:last], values[:last], count)
        at += q_len
    return out


def _tokens_outside(batch: _cpkv.Batch, plan: np.ndarray) -> Optional[str]:
    for i, (request, q_base, q_len, _, _) in enumerate(plan.tolist()):
        if not 0 <= request < len(batch.requests) or q_len < 1 or q_base < 0 or q_base + q_len > batch.requests[request].extend_len:
            return f"segment {i} names no tokens of the batch (request {request} tokens {q_base}..{q_base + q_len - 1})"
    return None


def output_difference(setting: _cpkv.Setting, batch: _cpkv.Batch, dense: Any, expected_dense: Any, plan: Any) -> Optional[str]:
    """The end-to-end question of a CP attention ("is the output the same as without CP?"): reference()
    over a rank's `dense` buffer with its `plan`, against reference() of one device holding the whole
    batch (`expected_dense`: the specification's buffer, single_device_plan), query by query, bit for
    bit. Every q comes from the token's own row of `expected_dense`, so both sides ask the same
    question. None when every row is equal; else one line naming the first query that differs."""
    import torch

    segments = as_array(plan)
    outside = _tokens_outside(batch, segments)
    if outside:
        return outside
    expected_dense = torch.as_tensor(expected_dense)
    dense = torch.as_tensor(dense).reshape(expected_dense.shape)
    device = expected_dense.device
    single = single_device_plan(setting, batch)
    rows = torch.from_numpy(query_rows(setting, batch, single)).to(device)
    want = reference(qkv_of_rows(expected_dense[rows])[0], expected_dense, single)
    mine = torch.from_numpy(query_rows(setting, batch, segments)).to(device)
    try:
        got = reference(qkv_of_rows(expected_dense[mine])[0], dense, segments)
    except InputError as error:
        return f"the plan cannot be run: {error.reason}"
    first_query = np.concatenate([[0], np.cumsum([r.extend_len for r in batch.requests])])
    tokens = [(r, q_base + i) for r, q_base, q_len, _, _ in segments.tolist() for i in range(q_len)]
    index = torch.tensor([int(first_query[r]) + t for r, t in tokens], dtype=torch.int64, device=device)
    wrong = (got != want[index]).any(dim=1).nonzero().reshape(-1).tolist()
    if not wrong:
        return None
    i = wrong[0]
    column = int((got[i] != want[index[i]]).nonzero()[0])
    request, token = tokens[i]
    return (f"query {i} (request {request} token {token}) differs from the single-device result of the whole request "
            f"({len(wrong)} of {len(tokens)} queries differ): column {column} got {float(got[i, column])!r} expected "
            f"{float(want[index[i], column])!r}")

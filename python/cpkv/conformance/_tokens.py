"""Section 12's token split as the harness hands it to an exchange without staging (docs/conformance.md).

Who computes which current token comes from the C++ model (model::token_owner, through the variant
plan of `allgather_zigzag` / `allgather_continuous`: its reorder_source names, for every current row
of the batch, its owner and its position among the owner's tokens), so the harness, the simulator and
the cost model share one rule. This module only re-indexes that plan: per rank in its send order,
and for any token set, the token's place in the batch's token order, its current row and its dense row.

Token order: the batch's current tokens request by request, each request's in sequence order, with no
gaps (what an engine's re-ordering after the all-gather produces, before the dense assembly).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

import numpy as np

from .. import _cpkv

# ctx.split's names of the token splits, and the variant whose plan gives each one's owners.
VARIANT_OF_SPLIT = {"zigzag_tokens": "allgather_zigzag", "continuous_tokens": "allgather_continuous"}


@dataclass
class TokenMap:
    """One batch under one token split, as host arrays (int64)."""

    max_rank_tokens: int            # what every rank sends to the all-gather (the others pad)
    per_rank: List[Dict[str, np.ndarray]]  # per rank, in its send order: request, token, dense_row, order, current_row
    request: np.ndarray             # per token in token order: its request
    token: np.ndarray               # its position in the request's sequence (prefix first)
    dense_row: np.ndarray           # the dense row that holds it
    current_row: np.ndarray         # current index * P + row (the simulator's and the plan's numbering)
    prefix_len: np.ndarray          # per request
    extend_len: np.ndarray          # per request
    order_base: np.ndarray          # per request: its first token's place in token order
    first_index: np.ndarray         # per request: its first current index
    first_slot: np.ndarray          # per request: its first current slot


def token_map(layout: _cpkv.BatchLayout, batch: _cpkv.Batch, split: str) -> TokenMap:
    """The batch's tokens under a token split, from the model's plan (one plan: the owners do not
    depend on the rank the plan is made for)."""
    plan = _cpkv.variant_plan(layout, VARIANT_OF_SPLIT[split], 0)
    page = layout.page_size
    source = np.asarray(plan.reorder_source, dtype=np.int64)
    current_row = np.nonzero(source >= 0)[0].astype(np.int64)  # ascending: request by request, token by token
    index, within = current_row // page, current_row % page
    prefix = np.array([r.prefix_len for r in batch.requests], dtype=np.int64)
    extend = np.array([r.extend_len for r in batch.requests], dtype=np.int64)
    first_index = np.asarray(layout.request_first_current_index, dtype=np.int64)
    first_slot = np.asarray(layout.request_first_current_slot, dtype=np.int64)
    request = np.searchsorted(first_index, index, side="right") - 1
    offset = (index - first_index[request]) * page + within
    dense_row = np.asarray(layout.current_slots, dtype=np.int64)[index] * page + within
    order_base = np.concatenate(([0], np.cumsum(extend)[:-1])).astype(np.int64)
    rows = max(1, int(plan.allgather_rank_rows))
    owner, position = source[current_row] // rows, source[current_row] % rows
    per_rank = []
    for k in range(layout.cp):
        mine = np.nonzero(owner == k)[0]
        mine = mine[np.argsort(position[mine], kind="stable")]
        per_rank.append({"request": request[mine], "token": prefix[request[mine]] + offset[mine], "dense_row": dense_row[mine],
                         "order": mine.astype(np.int64), "current_row": current_row[mine]})
    return TokenMap(int(plan.allgather_rank_rows), per_rank, request.astype(np.int64), prefix[request] + offset, dense_row, current_row,
                    prefix, extend, order_base, first_index, first_slot)


def rows_of(tokens: TokenMap, page: int, requests: np.ndarray, positions: np.ndarray) -> Dict[str, np.ndarray]:
    """Where any set of current tokens (request, position in its sequence) lives: its place in token
    order, its current row and its dense row. ValueError names the first token that is not current."""
    requests = np.asarray(requests, dtype=np.int64).reshape(-1)
    positions = np.asarray(positions, dtype=np.int64).reshape(-1)
    if requests.shape != positions.shape:
        raise ValueError(f"{requests.size} requests but {positions.size} tokens")
    bad = np.nonzero((requests < 0) | (requests >= tokens.prefix_len.size))[0]
    if bad.size:
        raise ValueError(f"item {int(bad[0])}: request {int(requests[bad[0]])} is not one of the batch's {tokens.prefix_len.size}")
    offset = positions - tokens.prefix_len[requests]
    bad = np.nonzero((offset < 0) | (offset >= tokens.extend_len[requests]))[0]
    if bad.size:
        r = int(requests[bad[0]])
        raise ValueError(f"item {int(bad[0])}: token {int(positions[bad[0]])} of request {r} is not current "
                         f"(its current tokens are {int(tokens.prefix_len[r])}..{int(tokens.prefix_len[r] + tokens.extend_len[r]) - 1})")
    return {"order": tokens.order_base[requests] + offset,
            "current_row": (tokens.first_index[requests] + offset // page) * page + offset % page,
            "dense_row": (tokens.first_slot[requests] + offset // page) * page + offset % page}

"""An engine developer's own staging_direct compose plan and gather, written from PROTOCOL.md alone.

This is what a serving engine's model runner would hold: per batch, the writer of every current
page and one (table_index, source_page) descriptor per dense slot; per layer, a slot-dense gather
over a 2*cp pointer table (pool bases of ranks 0..cp-1, then staging bases). It shares no code with
cpkv: the tests compare it with the C++ model byte for byte (python/tests/test_engine_plan.py), as an
engine would compare its own plan builder and kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Sequence

import numpy as np


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def zigzag_writers(pages: int, cp: int) -> List[int]:
    """Cut the pages into 2*cp contiguous blocks (block j: pages // (2cp) plus one if j < pages % (2cp));
    rank k takes blocks k and 2cp-1-k."""
    blocks = 2 * cp
    writers: List[int] = []
    for j in range(blocks):
        size = pages // blocks + (1 if j < pages % blocks else 0)
        writers += [j if j < cp else blocks - 1 - j] * size
    return writers


def contiguous_writers(pages: int, cp: int) -> List[int]:
    """Rank k takes pages [pages*k/cp, pages*(k+1)/cp)."""
    return [k for k in range(cp) for _ in range(pages * k // cp, pages * (k + 1) // cp)]


@dataclass
class EnginePlan:
    writers: np.ndarray      # int32, by current index
    current_slot: np.ndarray  # int64, by current index
    rows_valid: np.ndarray   # int32, by current index
    current_request: np.ndarray  # int32, by current index
    current_first_token: np.ndarray  # int64, by current index: sequence position of the page's first row
    row_writers: List[np.ndarray]  # by current index: the rank that computes each valid row
    descriptors: np.ndarray  # (slots, 2) int64: table_index, source_page


def build_plan(cp: int, page_size: int, split: str, prefix_lens: Sequence[int], extend_lens: Sequence[int],
               page_tables: Sequence[Sequence[int]], token_split: bool = False) -> EnginePlan:
    """The staging_direct plan of a batch. token_split=True is the classic bug of splitting at token
    granularity, as public zigzag code splits tokens: a page's rows can then be computed by two
    ranks while the gather reads the page from one (the owner of its first row). It is kept here so
    the tests can show that the comparison with the model catches it."""
    writers, slots, valid, requests, first_tokens, row_writers, descriptors = [], [], [], [], [], [], []
    slot = 0
    for r, (prefix_len, extend_len) in enumerate(zip(prefix_lens, extend_lens)):
        for g in page_tables[r]:
            descriptors.append((g % cp, g // cp))
            slot += 1
        pages = ceil_div(extend_len, page_size)
        token_owner = zigzag_writers(extend_len, cp) if token_split else None
        if token_owner is not None:
            mine = token_owner[::page_size]
        elif split == "zigzag":
            mine = zigzag_writers(pages, cp)
        elif split == "contiguous":
            mine = contiguous_writers(pages, cp)
        elif split == "zigzag_tokens":  # a token-split trace: each page to its first token's owner
            mine = zigzag_writers(extend_len, cp)[::page_size]
        elif split == "continuous_tokens":
            mine = [(p * page_size) % cp for p in range(pages)]
        else:  # round_robin: by the batch current index
            mine = [(len(writers) + p) % cp for p in range(pages)]
        for p in range(pages):
            descriptors.append((cp + mine[p], len(writers)))
            writers.append(mine[p])
            slots.append(slot)
            valid.append(min(page_size, extend_len - p * page_size))
            owners = token_owner[p * page_size:p * page_size + valid[-1]] if token_owner is not None else [mine[p]] * valid[-1]
            row_writers.append(np.array(owners, np.int32))
            requests.append(r)
            first_tokens.append(prefix_len + p * page_size)
            slot += 1
    return EnginePlan(np.array(writers, np.int32), np.array(slots, np.int64), np.array(valid, np.int32), np.array(requests, np.int32),
                      np.array(first_tokens, np.int64), row_writers, np.array(descriptors, np.int64).reshape(-1, 2))


def fill_staging(plan: EnginePlan, staging: Sequence[np.ndarray], page_rows: Callable[[int], np.ndarray]) -> None:
    """Zero, then fill: every rank writes the rows it computes of current page i into its own staging
    slot i (partial pages keep zero tails). page_rows(i): the (rows_valid, row_bytes) rows of page i."""
    for half in staging:
        half[:] = 0
    for i, owners in enumerate(plan.row_writers):
        rows = page_rows(i)
        for row, rank in enumerate(owners):
            staging[rank][i, row] = rows[row]


def gather(plan: EnginePlan, pools: Sequence[np.ndarray], staging: Sequence[np.ndarray]) -> np.ndarray:
    """The slot-dense gather kernel, on the host: dense slot s = table[d[s, 0]][d[s, 1]].

    pools[k]: (local pages, P, row_bytes) of rank k; staging[k]: (staging slots, P, row_bytes), the
    half of this layer. Returns the dense buffer (slots * P, row_bytes)."""
    table = list(pools) + list(staging)
    pages = [table[t][p] for t, p in plan.descriptors]
    return np.concatenate(pages, axis=0) if pages else np.zeros((0, 0), np.uint8)


def main(argv: Sequence[str]) -> int:
    """Prints the plan of one batch of a trace (default: batch 0 of traces/samples/tiny.jsonl): the
    writer of every current page and every dense slot's descriptor, to check by hand against
    PROTOCOL.md sections 2, 3 and 5 (tests/model_tiny_batch.hpp works the tiny batch out on paper)."""
    import argparse
    import json
    import pathlib

    default_trace = pathlib.Path(__file__).resolve().parents[2] / "traces" / "samples" / "tiny.jsonl"
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("trace", nargs="?", default=str(default_trace), help="a batch trace (traces/README.md)")
    parser.add_argument("--batch", type=int, default=0, help="0-based batch of the trace")
    args = parser.parse_args(argv)
    with open(args.trace, encoding="utf-8") as lines:
        header = json.loads(next(lines))
        batch = next((json.loads(line) for k, line in enumerate(lines) if k == args.batch), None)
    if batch is None:
        parser.error(f"{args.trace} has no batch {args.batch}")
    cp, page_size, split = header["cp"], header["page_size"], header.get("split", "zigzag")
    requests = batch["requests"]
    plan = build_plan(cp, page_size, split, [r["prefix_len"] for r in requests], [r["extend_len"] for r in requests],
                      [r["prefix_pages"] for r in requests])
    print(f"{args.trace} batch {args.batch}: cp {cp}, page size {page_size}, split {split}, {len(requests)} requests")
    print(f"writers by current index: {plan.writers.tolist()}")
    for slot, (table_index, source_page) in enumerate(plan.descriptors.tolist()):
        source = f"rank {table_index} pool page {source_page}" if table_index < cp else \
            f"rank {table_index - cp} staging slot {source_page}"
        print(f"slot {slot}: (table_index {table_index}, source_page {source_page}) = {source}")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))

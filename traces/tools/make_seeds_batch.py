#!/usr/bin/env python3
"""Writes traces/samples/seeds_batch.jsonl: one batch shaped like the seeds' traced scenario.

The production system (PROTOCOL.md section 7, shared/seeds/) measured its compose exchange on one
traced batch: cp = 8 H200s, page size 64, DeepSeek-V3.2 (61 layers, the indexer on every layer, so
every layer is 'F'), fp8 main KV (656 B a row) plus indexer K (132 B a row), 12 requests with 44.6K
query (extend) tokens in total, each with a cached prefix of about as many tokens again, the prefix
pages scattered over the pool as an allocator leaves them. The original per-request lengths were
not published, so this script draws a batch of that shape from one fixed seed.

Every random choice comes from one splitmix64 stream (the same mixer as model/content.hpp), not
from Python's `random`, so the output is byte-identical on any Python 3. The seed and what it drew
are printed to stderr, and the seed is recorded in the trace header's "source".

Regenerate the committed sample (from the repository root):
    python3 traces/tools/make_seeds_batch.py --output traces/samples/seeds_batch.jsonl
"""

import argparse
import json
import sys

SEED = 8644600  # fixed (cp 8, page 64, 44600 tokens): the committed sample is this seed's output

CP = 8
PAGE_SIZE = 64
LAYER_COUNT = 61  # DeepSeek-V3.2
POOL_PAGES = 16384  # 1M tokens of pool at P = 64: 23x the pages the batch touches, small enough for the simulator
REQUEST_COUNT = 12
EXTEND_TOKENS_TOTAL = 44600  # the seeds' "44.6K q tokens"
MAX_TOTAL_EXTEND_TOKENS = 49152  # admission caps of the traced deployment
MAX_BATCH_REQUESTS = 16

# Relative weights of a short request (a chat turn) and a long one (a document chunk).
SHORT_WEIGHT_RANGE = (50, 600)
LONG_WEIGHT_RANGE = (2000, 9000)
# A prefix is 75% .. 125% of its request's extend, rounded to whole pages, at least one page.
PREFIX_PER_MILLE_RANGE = (750, 1250)

MASK64 = (1 << 64) - 1


class SplitMix64:
    """splitmix64: a tiny, well-known 64-bit generator; fully determined by the seed."""

    def __init__(self, seed):
        self.state = seed & MASK64

    def next_u64(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        x = self.state
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
        return x ^ (x >> 31)

    def below(self, bound):
        """A uniform integer in [0, bound), without modulo bias (rejection)."""
        assert 0 < bound <= (1 << 64)
        limit = ((1 << 64) // bound) * bound
        while True:
            x = self.next_u64()
            if x < limit:
                return x % bound

    def between(self, low, high):
        """A uniform integer in [low, high]."""
        return low + self.below(high - low + 1)


def draw_extend_lengths(rng):
    """REQUEST_COUNT extend lengths, a mix of short and long, summing to EXTEND_TOKENS_TOTAL."""
    weights = []
    for _ in range(REQUEST_COUNT):
        weight_range = LONG_WEIGHT_RANGE if rng.below(2) == 1 else SHORT_WEIGHT_RANGE
        weights.append(rng.between(*weight_range))
    weight_total = sum(weights)
    # Largest-remainder rounding: exact total, every length at least 1.
    exact = [w * EXTEND_TOKENS_TOTAL / weight_total for w in weights]
    lengths = [max(1, int(e)) for e in exact]
    by_remainder = sorted(range(REQUEST_COUNT), key=lambda r: (int(exact[r]) - exact[r], r))
    for r in by_remainder[: EXTEND_TOKENS_TOTAL - sum(lengths)]:
        lengths[r] += 1
    return lengths


def draw_prefix_lengths(rng, extend_lengths):
    prefix_lengths = []
    for extend in extend_lengths:
        per_mille = rng.between(*PREFIX_PER_MILLE_RANGE)
        pages = max(1, (extend * per_mille + 500 * PAGE_SIZE) // (1000 * PAGE_SIZE))
        prefix_lengths.append(pages * PAGE_SIZE)
    return prefix_lengths


def draw_distinct_pages(rng, count):
    """`count` distinct page ids of [0, POOL_PAGES) in random order (sparse partial Fisher-Yates)."""
    assert count <= POOL_PAGES
    swapped = {}
    pages = []
    for i in range(count):
        j = i + rng.below(POOL_PAGES - i)
        pages.append(swapped.get(j, j))
        swapped[j] = swapped.get(i, i)
    return pages


def make_trace(seed):
    rng = SplitMix64(seed)
    extend_lengths = draw_extend_lengths(rng)
    prefix_lengths = draw_prefix_lengths(rng, extend_lengths)
    pages = draw_distinct_pages(rng, sum(p // PAGE_SIZE for p in prefix_lengths))

    requests = []
    next_page = 0
    for prefix_len, extend_len in zip(prefix_lengths, extend_lengths):
        page_count = prefix_len // PAGE_SIZE
        requests.append({
            "prefix_len": prefix_len,
            "extend_len": extend_len,
            "prefix_pages": pages[next_page:next_page + page_count],
        })
        next_page += page_count

    assert sum(extend_lengths) == EXTEND_TOKENS_TOTAL
    assert sum(1 for e in extend_lengths if e % PAGE_SIZE != 0) >= 3, "want partial last pages"
    assert min(extend_lengths) < 1000 and max(extend_lengths) > 5000, "want short and long requests"

    header = {
        "format": "cpkv-batch-trace",
        "version": 1,
        "cp": CP,
        "page_size": PAGE_SIZE,
        "buffer_kinds": ["kv_fp8", "indexer_k"],
        "layers": {"count": LAYER_COUNT, "pattern": "F" * LAYER_COUNT},
        "pool_pages": POOL_PAGES,
        "split": "zigzag",
        "caps": {
            "max_total_extend_tokens": MAX_TOTAL_EXTEND_TOKENS,
            "max_batch_requests": MAX_BATCH_REQUESTS,
            "staging_mib": None,
        },
        "source": {
            "kind": "generated",
            "generator": "traces/tools/make_seeds_batch.py",
            "seed": seed,
            "description": "one batch shaped like the seeds' traced scenario (DeepSeek-V3.2 on "
                           "8xH200: 12 requests, 44.6K extend tokens, cached prefixes of about as "
                           "many tokens, scattered prefix pages); lengths and page ids are drawn, "
                           "not captured",
        },
    }
    batch = {"batch": 0, "requests": requests}
    return header, batch, extend_lengths, prefix_lengths


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=SEED, help="PRNG seed (default: the committed sample's)")
    parser.add_argument("--output", default="-", help="file to write (default: stdout)")
    args = parser.parse_args()

    header, batch, extend_lengths, prefix_lengths = make_trace(args.seed)
    current_pages_total = sum((e + PAGE_SIZE - 1) // PAGE_SIZE for e in extend_lengths)
    print(f"make_seeds_batch: seed={args.seed} requests={REQUEST_COUNT} "
          f"extend_tokens_total={sum(extend_lengths)} prefix_tokens_total={sum(prefix_lengths)} "
          f"current_pages_total={current_pages_total} extend_lens={extend_lengths} "
          f"prefix_lens={prefix_lengths}", file=sys.stderr)

    text = "".join(json.dumps(obj, separators=(",", ":")) + "\n" for obj in (header, batch))
    if args.output == "-":
        sys.stdout.write(text)
    else:
        with open(args.output, "w", encoding="utf-8", newline="\n") as out:
            out.write(text)


if __name__ == "__main__":
    main()

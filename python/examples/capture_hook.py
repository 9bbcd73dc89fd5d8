"""Where a trace-capture hook sits in a serving engine's prefill path (run: capture_hook.py OUT.jsonl).

In an SGLang-style engine the scheduler picks a batch, the model runner builds the forward batch
(page table, prefix and extend lengths) and runs the layers; compose runs inside every layer. The
hook goes between the two, once per scheduled prefill batch, where the batch-logical values are final
and nothing has run yet:

    batch = scheduler.get_next_batch_to_run()
    if batch.forward_mode.is_extend():
        capture.on_prefill(batch)              # <- here: one trace line per scheduled batch
    result = model_runner.forward(batch)

The toy scheduler below stands in for the engine, so the example runs anywhere.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from typing import List

import cpkv


@dataclass
class Req:                 # what the engine's request object holds at prefill time
    prefix_indices: List[int]  # KV pool token slots of the cached prefix (whole pages)
    extend_input_len: int      # tokens computed in this batch


class PrefillCapture:
    """The hook: translates the engine's batch into a trace line (page ids = token slot // P)."""

    def __init__(self, path: str, setting: cpkv.Setting) -> None:
        self.page_size = setting.page_size
        self.writer = cpkv.TraceWriter(path, setting, source={"kind": "engine-capture", "engine": "toy"})

    def on_prefill(self, reqs: List[Req]) -> None:
        self.writer.add_batch(
            prefix_lens=[len(r.prefix_indices) for r in reqs],
            extend_lens=[r.extend_input_len for r in reqs],
            prefix_pages=[[t // self.page_size for t in r.prefix_indices[::self.page_size]] for r in reqs])

    def close(self) -> None:
        self.writer.close()


def toy_scheduler(setting: cpkv.Setting, steps: int, seed: int) -> List[List[Req]]:
    """Batches of 1..3 requests with page-aligned cached prefixes at scattered pool pages."""
    rng = random.Random(seed)
    P = setting.page_size
    out = []
    for _ in range(steps):
        reqs = []
        for _ in range(rng.randint(1, 3)):
            pages = rng.sample(range(setting.pool_pages), rng.randint(0, 3))
            reqs.append(Req([g * P + t for g in pages for t in range(P)], rng.randint(1, 3 * P)))
        out.append(reqs)
    return out


def main(path: str, seed: int = 7) -> None:
    setting = cpkv.Setting(cp=2, page_size=4, kinds=["kv_fp8", "indexer_k"], layer_pattern="FS", pool_pages=32,
                           max_total_extend_tokens=24, max_batch_requests=3)
    print(f"capture_hook: seed {seed}, writing {path}")
    capture = PrefillCapture(path, setting)
    for reqs in toy_scheduler(setting, steps=4, seed=seed):
        capture.on_prefill(reqs)       # the hook
        # model_runner.forward(batch) would run here
    capture.close()
    for line in cpkv.plan(path):
        print(f"batch {line['batch']}: {line['requests']} requests, {line['current_pages_total']} current pages, "
              f"verdict {line['verdict_detail']}, writers {line['writers']}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "captured.jsonl")

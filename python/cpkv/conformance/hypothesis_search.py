"""Hypothesis over a foreign implementation: draw batches with cpkv.strategies, run each under the
harness in one persistent Session (the rank processes start once), and let Hypothesis shrink a
caught bug to a minimal batch list. The falsifying example prints as the constructor calls that
rebuild it (Batch and Request reprs), and the shrunk case is written as a trace with a reproducer.

    python3 -m cpkv.conformance.hypothesis_search --impl cpkv.conformance.reference:StagingDirect --mutant skip_zero

Exit 0: no example failed (max_examples run); 1: a failure, shrunk and printed.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from hypothesis import HealthCheck, assume, given, settings as hsettings, strategies as st

from .. import _cpkv
from .. import strategies as cs
from . import Session, case
from ._shrink import counterexample_path, reproducer, write_trace

# A setting small enough for a few runs a second on two cores: cp 2, P 4, both kinds, layers FS.
DEFAULT_SETTING = dict(cp=2, page_size=4, kinds=["kv_fp8", "indexer_k"], layer_pattern="FS", pool_pages=32,
                       max_total_extend_tokens=32, max_batch_requests=4)


def search(impl: str, mutant: Optional[str], setting: _cpkv.Setting, seed: int, max_examples: int, window_s: float,
           out_dir: str, require_attention: bool = False, attention_output: bool = False) -> Optional[str]:
    """None if every example passed, else the report of the shrunk failure (its lines, trace, reproducer)."""
    found: List[str] = []
    with Session() as session:
        @hsettings(max_examples=max_examples, deadline=None, database=None, derandomize=True,
                   suppress_health_check=list(HealthCheck))
        @given(st.lists(cs.batches(setting, requests_max=4, tokens_max=48), min_size=1, max_size=3))
        def passes(batches):
            # The trace format rejects a page repeated within one request's prefix, which the
            # strategies can draw; such a batch could not be written as the counterexample.
            assume(all(len(set(r.prefix_pages)) == len(r.prefix_pages) for b in batches for r in b.requests))
            spec = case(impl, setting, batches, seed=seed, mutant=mutant, window_s=window_s, require_attention=require_attention,
                        attention_output=attention_output)
            outcome = session.run(spec)
            if not outcome.passed:
                trace = write_trace(spec, counterexample_path(out_dir, spec), f"hypothesis: {outcome.first_check()}")
                found[:] = [f"falsifying example (shrunk by Hypothesis): {batches!r}", *(outcome.mismatches + outcome.findings + [outcome.failure or ""])[:3],
                            f"counterexample: {trace}", f"replay: {reproducer(spec, trace)}"]
            assert outcome.passed, outcome.first_check()

        try:
            passes()
        except Exception:  # the assertion, or Hypothesis's group of distinct failures
            if not found:
                raise
            return "\n".join(line for line in found if line)
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m cpkv.conformance.hypothesis_search")
    p.add_argument("--impl", required=True)
    p.add_argument("--mutant")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-examples", type=int, default=20)
    p.add_argument("--window", type=float, default=3.0)
    p.add_argument("--out", default="conformance-counterexamples")
    p.add_argument("--require-attention", action="store_true", help='every layer must return an "attention" plan')
    p.add_argument("--attention-output", action="store_true", help="compare cpkv.attention.reference over each plan with the single device")
    a = p.parse_args(argv)
    report = search(a.impl, a.mutant, _cpkv.Setting(**DEFAULT_SETTING), a.seed, a.max_examples, a.window, a.out,
                    a.require_attention, a.attention_output)
    print(report or f"no failure in {a.max_examples} examples")
    return 1 if report else 0


if __name__ == "__main__":
    sys.exit(main())

"""A run's report: the table `python3 -m cpkv.conformance` prints and the JSON `--json` writes.

The JSON is `cpkv replay --json`'s: its common part (trace, seed, layers, mode, mutant, the rejected
batches with the model's verdicts) is the harness's own (harness/src/request.cpp: replay_json and
harness/src/replay_report.cpp: rejected_json, through the checked request's binding); the run
object is the harness's run_json over the figures counted here (python/src/request_bindings.cpp:
foreign_run_json: "passed" is the harness's verdict); the implementation is the run's "variant". What
the harness cannot observe of a foreign implementation (the bytes it copied from peers, its
collectives, the simulator's scheduling steps) is null. What only the harness has is added beside
(docs/conformance.md, "The JSON"): per run `compose_ms`, `host_syncs_per_layer`, `graph_capturable`,
`link_limit_ms`, `builtin_staging_direct_ms` and `timings_of_record`; at the top `conformance` (the impl, device, knobs, every check that
fired, the located lines, the per-batch records and the reproducer).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from .. import _cpkv
from . import _adversity as adv
from . import _checked
from ._launch import Outcome
from . import _timing
from ._probes import percentile, summarize_capture
from ._rank import RunSpec

def _per_rank(o: Outcome, key: str, rank: int) -> list:
    return [b[key][rank] for b in o.batches if key in b and rank < len(b[key])]


def rank_totals(o: Outcome, cp: int) -> List[dict]:
    """run_json's per-rank object. barriers: the arrivals the implementation announced
    (ctx.events.arrive), null if it announced none."""
    ranks = []
    for rank in range(cp):
        arrivals = _per_rank(o, "arrivals", rank)
        ranks.append({"batches": len(o.batches), "layers": sum(len(c) for c in _per_rank(o, "compose_s", rank)),
                      "barriers": sum(arrivals) if any(arrivals) else None, "collectives": None,
                      "overflows": sum(1 for refused in _per_rank(o, "refused", rank) if refused),
                      "mismatches": sum(_per_rank(o, "mismatch_kinds", rank)),
                      "bytes_gathered_from_peers": None, "bytes_reduced": None})
    return ranks


def compose_ms(o: Outcome, device: str) -> Optional[dict]:
    """Per (batch, layer) the slowest rank's compose time (the group's layer ends with it): median
    and p90 in ms over every layer run."""
    layers: Dict[tuple, float] = {}
    for b in o.batches:
        for per_rank in b.get("compose_s", []):
            for layer, seconds in enumerate(per_rank):
                key = (b["batch"], layer)
                layers[key] = max(layers.get(key, 0.0), seconds * 1e3)
    if not layers:
        return None
    values = list(layers.values())
    return {"median": percentile(values, 0.5), "p90": percentile(values, 0.9), "layers": len(values),
            "clock": "CUDA events on the rank's stream" if device == "cuda" else "perf_counter"}


def host_syncs(o: Outcome) -> Optional[dict]:
    counts = [n for b in o.batches for per_rank in b.get("host_syncs", []) for n in per_rank if n is not None]
    if not counts:
        return None
    return {"max": max(counts), "mean": sum(counts) / len(counts), "rank_layers": len(counts)}


def rejected(spec: RunSpec, o: Outcome) -> List[Tuple[int, int, int]]:
    """The batches whose current pages exceed the staging (the implementation's declared staging
    where it declared one, else cpkv's capacity), each (batch, current pages total, staging slots):
    the harness's rejected_json writes them with the model's verdict, as `cpkv replay` lists them."""
    declared = next((b["declared_staging_slots"] for b in o.batches), _cpkv.staging_capacity(spec.setting).staging_slots)
    if declared is None:
        return []  # ctx.declare_staging(None): no staging, so no batch overflows (PROTOCOL.md section 12)
    out = []
    for index, batch in enumerate(spec.batches):
        total = _cpkv.layout_batch(spec.setting, batch).current_pages_total
        if _cpkv.overflow_verdict(total, declared).overflow:
            out.append((index, total, declared))
    return out


def violations_by_invariant(o: Outcome) -> Dict[str, int]:
    """Per invariant 1..9 (PROTOCOL.md section 9), the violations found: for invariant 6 the wrong
    dense buffers (layer, kind, rank), for invariant 9 the wrong plans (layer, rank) and coverage
    findings, for the others every finding line."""
    counts = {str(i): 0 for i in range(1, 10)}
    counts["6"] += sum(sum(b.get("mismatch_kinds", [])) for b in o.batches)
    counts["9"] += sum(sum(b.get("attention_wrong_layers", [])) + len(b.get("attention_coverage", [])) for b in o.batches)
    for line in o.findings:
        if line.startswith("invariant ") and line.split(" ")[1] in counts and line.split(" ")[1] != "9":
            counts[line.split(" ")[1]] += 1
    return counts


def run_json(spec: RunSpec, o: Outcome, mode: str) -> dict:
    """run_json's object (the harness's, from the figures counted here), then the conformance-only figures."""
    mismatch_lines = [f"invariant 6 (byte exactness): {line}" for line in o.mismatches]
    cuda = spec.device == "cuda"
    run = _cpkv.foreign_run_json({"variant": spec.impl, "mode": mode, "failure": o.failure or "", "deadlock": o.failure_kind == "hang",
                                  "violations": sum(sum(b.get("mismatch_kinds", [])) for b in o.batches) + len(o.findings),
                                  "violations_by_invariant": violations_by_invariant(o), "seconds": o.seconds,
                                  "ranks": rank_totals(o, spec.setting.cp), "violation_details": mismatch_lines + o.findings})
    return {**run,
            "compose_ms": compose_ms(o, spec.device), "host_syncs_per_layer": host_syncs(o) if cuda else "n/a",
            "graph_capturable": summarize_capture(o.capture) if cuda and o.capture else "n/a",
            "link_limit_ms": _timing.limit_ms(o.batches) if spec.timing else None,
            "builtin_staging_direct_ms": builtin_cell(spec, o), "timings_of_record": of_record(spec)}


def replay_json(checked: _checked.CheckedRun, spec: RunSpec, o: Outcome, mode: str, reproducer: str) -> dict:
    """`cpkv replay --json`'s object for one implementation's run (its common part the harness's, for
    the checked request), plus the harness's own `conformance` block."""
    report = _cpkv.replay_json(checked.replay_json, f"conformance/{mode}", [run_json(spec, o, mode)], rejected(spec, o))
    report["conformance"] = {"impl": spec.impl, "device": spec.device, "ranks": spec.setting.cp, "swarm": spec.swarm, "timing": spec.timing,
                            "knobs": adv.knobs(spec.seed, spec.swarm) if spec.delays and not spec.timing else None,
                            "checks_fired": o.checks_fired(), "mismatches": o.mismatches, "findings": o.findings,
                            "positions": o.positions, "leftovers": o.leftovers, "batches": o.batches,
                            "capture_batch": o.capture_batch, "reproducer": reproducer}
    return report


def of_record(spec: RunSpec) -> bool:
    """Timings are of record only at one rank per GPU (ranks sharing a GPU time-slice it)."""
    return spec.device == "cuda" and spec.timing and _timing.one_rank_per_gpu(spec.setting.cp)


def builtin_cell(spec: RunSpec, o: Outcome):
    if spec.device != "cuda" or not spec.timing:
        return "n/a"
    return o.builtin if o.builtin is not None else "n/a: not run (the API measures it only from the command line)"


def timing_lines(spec: RunSpec, o: Outcome) -> List[str]:
    """Under the compose line of --time: the link limit, the built-in staging_direct, the record."""
    lines = []
    limit = _timing.limit_ms(o.batches)
    if limit:
        lines.append(f"link limit per layer (the same bytes, one plain copy per source rank, same stream): median {limit['median']:.3f} ms, "
                     f"p90 {limit['p90']:.3f} ms; compose / limit: median {limit['compose_over_limit_median']:.2f}")
    builtin = builtin_cell(spec, o)
    shown = f"median {builtin['median']:.3f} ms per layer over {builtin['batches']} batches (`cpkv bench`)" if isinstance(builtin, dict) else builtin
    lines.append(f"cpkv staging_direct (built-in) on the same batches: {shown if spec.device == 'cuda' else 'n/a on cpu'}")
    if spec.device == "cuda" and not of_record(spec):
        lines.append("timings not of record: ranks share a GPU (time-sliced); one rank per GPU gives figures of record")
    return lines


def _capture_cell(o: Outcome, device: str) -> str:
    if device != "cuda" or not o.capture:
        return "n/a"
    verdicts = summarize_capture(o.capture)
    return f"{sum(v == 'yes' for v in verdicts)}/{len(verdicts)}"


def _syncs_cell(o: Outcome, device: str) -> str:
    counts = host_syncs(o)
    return f"{counts['max']}" if device == "cuda" and counts else "n/a"


def impl_cell(spec: RunSpec) -> str:
    """The whole implementation, class name and constructor arguments (as --impl takes them)."""
    from ._impl_spec import format_impl

    return format_impl(spec.impl, spec.impl_kwargs)


def layers_run(o: Outcome) -> int:
    """The layers every rank composed, summed over the batches run: a refused batch composes none (its
    layers are not run), a batch a rank left early counts the layers all ranks finished."""
    total = 0
    for b in o.batches:
        if any(b.get("refused", [])):
            continue
        per_rank = b.get("compose_s", [])
        total += min((len(c) for c in per_rank), default=0)
    return total


def table(spec: RunSpec, o: Outcome) -> List[str]:
    """The table (`cpkv replay`'s columns that apply, plus the host synchronizations and the CUDA-graph
    capturable layers), and under it each layer's capture verdict and the --time figures."""
    refused = sum(1 for b in o.batches if any(b["refused"]))
    result = "pass" if o.passed else f"FAIL: {', '.join(o.checks_fired())}"
    impl = impl_cell(spec)
    width = max(40, len(impl))
    lines = [f"{'impl':{width}s} {'batches':>8s} {'layers':>7s} {'overflow':>9s} {'mismatch':>9s} {'violation':>10s} "
             f"{'syncs/layer':>12s} {'graph':>6s}  result",
             f"{impl:{width}s} {len(o.batches):8d} {layers_run(o):7d} {refused:9d} {len(o.mismatches):9d} "
             f"{len(o.findings):10d} {_syncs_cell(o, spec.device):>12s} {_capture_cell(o, spec.device):>6s}  {result} "
             f"({o.seconds:.2f} s wall)"]
    counts = host_syncs(o)
    if spec.device == "cuda" and counts:
        lines.append(f"host synchronizations per layer (torch's GPU trace hooks): max {counts['max']}, mean {counts['mean']:.1f} "
                     f"over {counts['rank_layers']} rank-layers")
    if spec.device == "cuda" and o.capture:
        lines += [f"CUDA graph, batch {o.capture_batch} layer {layer}: {'capturable' if v == 'yes' else 'not capturable: ' + v[4:]}"
                  for layer, v in enumerate(summarize_capture(o.capture))]
    timed = compose_ms(o, spec.device)
    if spec.timing and timed:
        lines.append(f"compose per layer ({timed['clock']}, the slowest rank of each layer): median {timed['median']:.3f} ms, "
                     f"p90 {timed['p90']:.3f} ms over {timed['layers']} layers")
        lines += timing_lines(spec, o)
    return lines

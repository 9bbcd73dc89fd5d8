#!/usr/bin/python3
"""The cost model against a `cpkv bench --json` file, offline: per row and per variant |error|.

The model is cpkv's own (`cpkv replay CUT --backend model --ceilings CEILINGS.json`, the CostModel
`cpkv bench` prints beside every measurement): this script only cuts the bench's trace to what the
bench timed (its cp, its timed layer cycle), runs the model once per batch, and compares.

  scripts/model_check.py BENCH.json [BENCH.json ...] [--ceilings-from OTHER.json] [--cpkv build/cli/cpkv]

--ceilings-from takes the ceilings from another run (calibrated on OTHER, checked on BENCH).
The bench's own prediction (`model_us_per_layer`, the model of the code that ran) is shown as "bench".
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CPKV_LIMIT_S = 60  # one model replay of a bench trace takes milliseconds; a minute means it is stuck


def fail(message):
    print(f"model_check: {message}", file=sys.stderr)
    sys.exit(2)


def load_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{path}: {e}")


def cut_trace(trace_path, cp, cycle, out_path):
    """Writes the trace with the bench's cp and only its timed layer cycle to out_path."""
    with open(trace_path, encoding="utf-8") as f:
        lines = [line for line in f.read().splitlines() if line.strip()]
    header = json.loads(lines[0])
    header["cp"] = cp
    header["layers"] = {"count": cycle, "pattern": header["layers"]["pattern"][:cycle]}
    with open(out_path, "w", encoding="utf-8") as f:
        f.write("\n".join([json.dumps(header)] + lines[1:]) + "\n")


def modelled_us(cpkv, trace, ceilings, batch, cycle, tmp):
    out = os.path.join(tmp, f"model-{batch}.json")
    cmd = [cpkv, "replay", trace, "--backend", "model", "--ceilings", ceilings, "--batch", str(batch), "--json", out]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=CPKV_LIMIT_S, check=False)
    except subprocess.TimeoutExpired:
        fail(f"{' '.join(cmd)}: no answer in {CPKV_LIMIT_S} s")
    if run.returncode != 0:
        fail(f"{' '.join(cmd)}: exit {run.returncode}: {run.stderr.strip()}")
    summary = load_json(out)
    return {v["variant"]: 1000.0 * v["modelled_ms_total"] / cycle for v in summary["variants"]}, summary["ceilings"]


def check(bench_path, ceilings_path, cpkv, repo):
    bench = load_json(bench_path)
    cycle = bench["layers_timed"] if bench["layers_timed"] % 2 == 0 else bench["layers_timed"] - 1
    trace = bench["trace"] if os.path.isabs(bench["trace"]) else os.path.join(repo, bench["trace"])
    errors = {}
    with tempfile.TemporaryDirectory(prefix="cpkv-model-check-") as tmp:
        cut = os.path.join(tmp, "cut.jsonl")
        cut_trace(trace, bench["cp"], cycle, cut)
        cache = {}
        print(f"{os.path.basename(bench_path)} (trace {bench['trace']}, cp {bench['cp']}, {cycle} layers; ceilings of "
              f"{os.path.basename(ceilings_path)})")
        for row in bench["rows"]:
            b = row["batch"]
            if b not in cache:
                cache[b], ceilings = modelled_us(cpkv, cut, ceilings_path, b, cycle, tmp)
                if len(cache) == 1:
                    print("  ceilings: " + ", ".join(f"{k} {v:.4g}" for k, v in ceilings.items() if isinstance(v, (int, float))))
            measured = row["compose_us_per_layer_median"]
            predicted = cache[b][row["variant"]]
            error = predicted / measured - 1.0
            before = row["model_us_per_layer"] / measured - 1.0
            errors.setdefault(row["variant"], []).append((abs(error), abs(before)))
            print(f"  {b} {row['variant']:<16} measured {measured:7.1f} us | model {predicted:7.1f} ({100 * error:+4.0f}%) | "
                  f"bench {row['model_us_per_layer']:7.1f} ({100 * before:+4.0f}%)")
    return errors


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bench", nargs="+", help="cpkv bench --json files of one run (their rows are pooled per variant)")
    parser.add_argument("--ceilings-from", help="take the ceilings from this bench JSON instead of each file's own")
    parser.add_argument("--cpkv", default=None, help="the cpkv binary (default: build/cli/cpkv of this checkout)")
    args = parser.parse_args()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cpkv = args.cpkv or os.path.join(repo, "build", "cli", "cpkv")
    if not os.access(cpkv, os.X_OK):
        fail(f"{cpkv}: no cpkv binary (build the cpkv target, or pass --cpkv)")
    pooled = {}
    for path in args.bench:
        for variant, errs in check(path, args.ceilings_from or path, cpkv, repo).items():
            pooled.setdefault(variant, []).extend(errs)
    print("median |error| per variant (model | bench's own prediction):")
    for variant, errs in pooled.items():
        now = statistics.median(e for e, _ in errs)
        then = statistics.median(b for _, b in errs)
        print(f"  {variant:<16} {100 * now:5.1f}% | {100 * then:5.1f}%   ({len(errs)} rows)")
    rows = [e for errs in pooled.values() for e in errs]
    print(f"  {'all rows':<16} {100 * statistics.median(e for e, _ in rows):5.1f}% | {100 * statistics.median(b for _, b in rows):5.1f}%")


if __name__ == "__main__":
    main()

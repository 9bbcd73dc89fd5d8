#!/usr/bin/env python3
"""Compare `cpkv bench --json` files of two builds (A and B) taken in one visit, interleaved.

Usage: bench_ab.py --a A1.json [A2.json ...] --b B1.json [B2.json ...] [--key compose_us_per_layer_median] [--key-b KEY]

--key-b reads B's figure under another key (a plugin's `plugin_compose_us_per_layer_median`
against the built-in's compose), for an A/B of cpkv's own exchange against the same code behind
the plugin ABI.

For every (trace row: batch, variant) present in every file it prints the median over A's runs, the
median over B's runs and the ratio B/A, then the geometric mean of the ratios per variant. Rows
whose bytes were not exact in any run are refused (a timing of a wrong exchange is not a timing).
One clear line and exit 2 on bad input.
"""
import argparse
import json
import math
import statistics
import sys


def load(path, key):
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"bench_ab: {path}: {e}")
    rows = {}
    for row in doc.get("rows", []):
        if not row.get("byte_exact", False):
            sys.exit(f"bench_ab: {path}: batch {row.get('batch')} {row.get('variant')} was not byte-exact")
        value = row.get(key)
        if value is None:
            continue
        rows[(row["batch"], row["variant"])] = float(value)
    if not rows:
        sys.exit(f"bench_ab: {path}: no row has '{key}'")
    return doc.get("cp"), rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", nargs="+", required=True)
    ap.add_argument("--b", nargs="+", required=True)
    ap.add_argument("--key", default="compose_us_per_layer_median")
    ap.add_argument("--key-b", default=None)
    ap.add_argument("--label-a", default="A")
    ap.add_argument("--label-b", default="B")
    args = ap.parse_args()
    runs_a = [load(p, args.key) for p in args.a]
    runs_b = [load(p, args.key_b or args.key) for p in args.b]
    cps = {cp for cp, _ in runs_a + runs_b}
    if len(cps) != 1:
        sys.exit(f"bench_ab: the files were taken at different cp: {sorted(cps)}")
    keys = set.intersection(*(set(rows) for _, rows in runs_a + runs_b))
    if not keys:
        sys.exit("bench_ab: no (batch, variant) row is in every file")
    print(f"| batch | variant | {args.label_a} {args.key} | {args.label_b} | {args.label_b}/{args.label_a} |")
    print("| --- | --- | --- | --- | --- |")
    by_variant = {}
    for batch, variant in sorted(keys):
        a = statistics.median(rows[(batch, variant)] for _, rows in runs_a)
        b = statistics.median(rows[(batch, variant)] for _, rows in runs_b)
        by_variant.setdefault(variant, []).append(b / a)
        print(f"| {batch} | {variant} | {a:.2f} | {b:.2f} | {b / a:.3f} |")
    print()
    print(f"| variant | geometric mean {args.label_b}/{args.label_a} | rows |")
    print("| --- | --- | --- |")
    for variant, ratios in sorted(by_variant.items()):
        g = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        print(f"| {variant} | {g:.3f} | {len(ratios)} |")


if __name__ == "__main__":
    main()

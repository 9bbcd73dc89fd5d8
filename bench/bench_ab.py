#!/usr/bin/env python3
"""Compare `cpkv bench --json` files of two sides (A and B) taken in one visit, interleaved: two
builds, or cpkv's own exchange against an exchange plugin.

Usage: bench_ab.py --a A1.json [A2.json ...] --b B1.json [B2.json ...] [--key compose_us_per_layer_median] [--key-b KEY]

--key-b reads B's figure under another key: a plugin's `plugin_compose_us_per_layer_median`
against the built-in's `compose_us_per_layer_median`.
Two builds' default benches (the built-in plugin) compare under the default key: compose alone,
the plugin's CPKV_PART_COMPOSE (before issue 36, the in-process exchange's compose).

For every (batch, variant) present in every file it prints the median over A's runs, the median
over B's runs and the ratio B/A, then the geometric mean of the ratios per variant. Every file must
be of the same trace, cp and timed layers (else exit 1, naming the field); a row whose bytes were
not exact in any run is refused (a timing of a wrong exchange is not a timing), as is a file that
is not a bench report (one line naming it, exit 2).
"""
import argparse
import json
import math
import os
import statistics
import sys


SAME = ("trace", "cp", "layers_timed")  # what every file must share


def refuse(text, status=2):
    """One line on stderr, named for the script that runs (bench_ab, abi_ratio), and the exit status."""
    print(f"{os.path.splitext(os.path.basename(sys.argv[0]))[0]}: {text}", file=sys.stderr)
    sys.exit(status)


def read_report(path):
    """A `cpkv bench --json` file, or one line naming it and exit 2."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        refuse(f"{path}: {e}")


def load(path, key):
    doc = read_report(path)
    try:
        rows = {}
        for row in doc["rows"]:
            if not row.get("byte_exact", False):
                refuse(f"{path}: batch {row.get('batch')} {row.get('variant')} was not byte-exact")
            if row.get(key) is not None:
                rows[(row["batch"], row["variant"])] = float(row[key])
    except (KeyError, TypeError, ValueError) as e:
        refuse(f"{path}: not a cpkv bench report with '{key}' rows ({type(e).__name__}: {e})")
    if not rows:
        refuse(f"{path}: no row has '{key}'")
    return {field: doc.get(field) for field in SAME}, rows


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
    for field in SAME:
        seen = {json.dumps(shape[field]) for shape, _ in runs_a + runs_b}
        if len(seen) != 1:
            refuse(f"the files differ in {field}: {' vs '.join(sorted(seen))}", status=1)
    keys = set.intersection(*(set(rows) for _, rows in runs_a + runs_b))
    if not keys:
        refuse("no (batch, variant) row is in every file", status=1)
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

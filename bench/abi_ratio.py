#!/usr/bin/env python3
"""The ABI's cost per layer from `cpkv bench --json` files of the default bench of cpkv before
issue 36 (no --exchange), in which every variant ran in process and then through the built-in
plugin, both as replayed graphs. The in-process exchange is gone since, and today's bench writes no
such rows: this reads the recorded reports (docs/benchmarks/) only.

Usage: abi_ratio.py BENCH.json [BENCH.json ...]

Per (batch, variant): cpkv's in-process "with fill" and the built-in plugin's "plugin with fill" of
each file, and their ratio (`abi_over_in_process_with_fill`, taken in one run); then the ratios'
count, min, median, max and geometric mean. A row that was not byte-exact is refused (a timing of
a wrong exchange is not a timing); a file that is not a default bench's is refused. One line, exit 2.
"""
import statistics
import sys

from bench_ab import read_report, refuse  # the same reading of a bench report, and the same one-line refusal


def rows_of(path):
    doc = read_report(path)
    if not doc.get("exchange", {}).get("beside_in_process", False):
        refuse(f"{path}: not a default bench (its exchange is not the built-in plugin beside the in-process one)")
    for row in doc.get("rows", []):
        if not row.get("byte_exact", False):
            refuse(f"{path}: batch {row.get('batch')} {row.get('variant')} was not byte-exact")
        yield (row["batch"], row["variant"]), row


def main(paths):
    if not paths:
        refuse("give one or more `cpkv bench --json` files of the default bench")
    table = {}
    for path in paths:
        for key, row in rows_of(path):
            table.setdefault(key, []).append(row)
    ratios = []
    print("| batch | variant | in-process with fill us (runs) | through the ABI us (runs) | ABI / in-process (runs) |")
    print("|---|---|---|---|---|")
    for (batch, variant), rows in sorted(table.items()):
        ours = [r.get("abi_over_in_process_with_fill") for r in rows]
        ratios += [x for x in ours if x]
        cell = lambda key, fmt: " / ".join(fmt.format(r[key]) if r.get(key) else "-" for r in rows)
        print(f"| {batch} | {variant} | {cell('with_fill_us_per_layer_median', '{:.1f}')} | {cell('plugin_with_fill_us_per_layer_median', '{:.1f}')} | "
              f"{cell('abi_over_in_process_with_fill', '{:.3f}')} |")
    if not ratios:
        refuse("no row has both timings")
    print(f"\nratios: {len(ratios)}, min {min(ratios):.3f}, median {statistics.median(ratios):.3f}, max {max(ratios):.3f}, "
          f"geometric mean {statistics.geometric_mean(ratios):.4f}")


if __name__ == "__main__":
    main(sys.argv[1:])

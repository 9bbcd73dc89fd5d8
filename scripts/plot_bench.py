#!/usr/bin/python3
"""Draw the benchmark chart: per batch, every variant's time per batch beside the ideal.

Usage: scripts/plot_bench.py BENCH.json OUT.png [--title TEXT]
Needs matplotlib (Debian: python3-matplotlib).
"""
import argparse
import json
import sys

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("plot_bench.py: matplotlib is not installed (Debian: apt-get install python3-matplotlib)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench_json")
    parser.add_argument("out_png")
    parser.add_argument("--title", default="")
    args = parser.parse_args()
    with open(args.bench_json) as f:
        bench = json.load(f)
    rows = bench["rows"]
    batches = sorted({r["batch"] for r in rows})
    variants = []
    for r in rows:
        if r["variant"] not in variants:
            variants.append(r["variant"])
    layers = bench["layers_model"]
    fig, ax = plt.subplots(figsize=(10, 5))
    width = 0.8 / (len(variants) + 1)
    for vi, variant in enumerate(variants):
        xs, ys = [], []
        for b in batches:
            for r in rows:
                if r["batch"] == b and r["variant"] == variant:
                    xs.append(b + vi * width)
                    ys.append(r["ms_per_batch_compose"])
        ax.bar(xs, ys, width, label=variant)
    ideal = [next(r for r in rows if r["batch"] == b)["ideal_us_per_layer"] * layers / 1000.0 for b in batches]
    ax.bar([b + len(variants) * width for b in batches], ideal, width, label="ideal (measured ceilings)", color="black")
    ax.set_xticks([b + 0.4 for b in batches])
    ax.set_xticklabels([f"batch {b}" for b in batches])
    ax.set_ylabel(f"compose ms per batch ({layers} layers, fill excluded)")
    ax.set_title(args.title or f"compose exchange per batch, cp {bench['cp']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out_png, dpi=120)


if __name__ == "__main__":
    main()

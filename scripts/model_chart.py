#!/usr/bin/env python3
"""The chart of `cpkv replay TRACE --backend model --chart F.png` (cli/model_replay.cpp embeds this
file at build time and runs it with the interpreter configure found).

    model_chart.py TIMES.csv OUT.png TITLE

TIMES.csv: a header `batch,<variant>,...` and one row per batch, the modelled ms per variant (`nan`
where the overflow verdict rejects the batch for that variant). OUT.png gets two figures side by
side, as two panels of one image:
  1. the distribution of modelled time per variant: its ECDF (the share of batches at or below a
     time; a variant's rejected batches are left out, the legend says how many);
  2. the per-batch speed-up over v2 (v2's ms / the variant's ms; above 1 is faster than v2).
Series that are identical (every batch the same time) would hide each other: each line has its own
line style and marker, and the legend names the series it is identical to.
"""
import csv
import math
import sys

# One line style and one marker per variant of kVariantTable (9 with section 12's all-gathers).
LINESTYLES = ["-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 2)), (0, (8, 2, 2, 2)), (0, (2, 1))]
MARKERS = ["o", "s", "^", "D", "v", "x", "+", "*", "P"]
BASELINE = "v2"


def read_times(path):
    """(names, batches, series): the variant names, the batch numbers, name -> list of ms."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows or rows[0][0] != "batch":
        raise ValueError(f"{path}: no 'batch,...' header")
    names = rows[0][1:]
    batches = [int(r[0]) for r in rows[1:]]
    series = {name: [float(r[k + 1]) for r in rows[1:]] for k, name in enumerate(names)}
    return names, batches, series


def same(a, b):
    """Two series equal batch by batch (NaN equals NaN: both rejected)."""
    return len(a) == len(b) and all((math.isnan(x) and math.isnan(y)) or x == y for x, y in zip(a, b))


def identical_to(names, series):
    """name -> the other names whose series equals it, in the order of `names`."""
    return {n: [m for m in names if m != n and same(series[n], series[m])] for n in names}


def ecdf(values):
    """(xs, ys) of the step ECDF of the finite values: ys[i] = (i + 1) / count."""
    xs = sorted(v for v in values if not math.isnan(v))
    return xs, [(i + 1) / len(xs) for i in range(len(xs))]


def speedup(series, name):
    """Per batch, v2's ms over `name`'s (NaN where either is rejected or takes no time)."""
    base = series[BASELINE]
    return [b / t if not (math.isnan(b) or math.isnan(t)) and t > 0 else math.nan for b, t in zip(base, series[name])]


def label(name, twins, values):
    rejected = sum(1 for v in values if math.isnan(v))
    text = name + (f" ({rejected} rejected)" if rejected else "")
    return text + (f" [identical to {', '.join(twins)}]" if twins else "")


def style(k, points):
    """Line style and marker of the k-th series: no two alike, markers sparse enough to see the line."""
    return {"linestyle": LINESTYLES[k % len(LINESTYLES)], "marker": MARKERS[k % len(MARKERS)],
            "markevery": max(1, points // 12), "markersize": 4, "linewidth": 1.1, "fillstyle": "none"}


def draw(names, batches, series, title):
    """The figure: axes[0] the ECDF per variant, axes[1] the speed-up over v2 per batch."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    twins = identical_to(names, series)
    fig, (ecdf_ax, speed_ax) = plt.subplots(1, 2, figsize=(15, 5.5), dpi=110)
    for k, name in enumerate(names):
        xs, ys = ecdf(series[name])
        if xs:
            ecdf_ax.step(xs, ys, where="post", label=label(name, twins[name], series[name]), **style(k, len(xs)))
    ecdf_ax.set_xlabel("modelled exchange time per batch (ms)")
    ecdf_ax.set_ylabel("share of batches at or below (ECDF)")
    ecdf_ax.set_title("distribution of modelled time per variant", fontsize=9)
    if BASELINE in series:
        for k, name in enumerate(names):
            if name != BASELINE:
                speed_ax.plot(batches, speedup(series, name), label=label(name, [t for t in twins[name] if t != BASELINE], series[name]),
                              **style(k, len(batches)))
        speed_ax.axhline(1.0, color="black", linewidth=0.8)
    speed_ax.set_xlabel("batch")
    speed_ax.set_ylabel(f"speed-up over {BASELINE} ({BASELINE} ms / variant ms; > 1 is faster)")
    speed_ax.set_title(f"per-batch speed-up over {BASELINE}", fontsize=9)
    for ax in (ecdf_ax, speed_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def main(argv):
    if len(argv) != 4:
        print("usage: model_chart.py TIMES.csv OUT.png TITLE", file=sys.stderr)
        return 2
    names, batches, series = read_times(argv[1])
    # format="png": the output is cpkv's temporary file beside the target, whose name need not end in .png.
    draw(names, batches, series, argv[3]).savefig(argv[2], format="png")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

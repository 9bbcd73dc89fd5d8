#!/usr/bin/env python3
"""The A/B of an exchange plugin against cpkv's own exchange from two `cpkv bench --json` files of
one visit (same machine, same trace, cp and layers): per batch and variant, the built-in compose
median, the plugin's compose_layer median, and plugin / built-in. Exit 2 on a file that is not
such a report, naming it; exit 1 when the two runs do not match (trace, cp, layers) or share no row.

Usage: scripts/bench_ab.py BUILTIN.json PLUGIN.json
"""
import json
import sys


def load(path, key):
    try:
        with open(path, encoding="utf-8") as f:
            report = json.load(f)
        rows = {(r["batch"], r["variant"]): r[key] for r in report["rows"] if r.get(key) is not None}
        return report, rows
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"bench_ab.py: {path}: not a cpkv bench report with '{key}' rows ({e})", file=sys.stderr)
        sys.exit(2)


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    built_in, a = load(argv[1], "compose_us_per_layer_median")
    plugin, b = load(argv[2], "plugin_compose_us_per_layer_median")
    for field in ("trace", "cp", "layers_timed"):
        if built_in.get(field) != plugin.get(field):
            print(f"bench_ab.py: the runs differ in {field}: {built_in.get(field)} vs {plugin.get(field)}", file=sys.stderr)
            return 1
    shared = sorted(set(a) & set(b))
    if not shared:
        print("bench_ab.py: no (batch, variant) timed in both runs", file=sys.stderr)
        return 1
    name = plugin.get("exchange", {}).get("plugin", "plugin")
    print(f"| batch | variant | built-in compose us | {name} compose_layer us | {name} / built-in |")
    print("|---|---|---|---|---|")
    for batch, variant in shared:
        print(f"| {batch} | {variant} | {a[(batch, variant)]:.1f} | {b[(batch, variant)]:.1f} | {b[(batch, variant)] / a[(batch, variant)]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

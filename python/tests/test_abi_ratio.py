"""bench/abi_ratio.py: the ABI's cost per layer from the default bench's JSON (docs/plugins.md).

Why it matters: the ratio it prints is the figure of record that the plugin ABI costs nothing
measurable; a ratio of the wrong rows, or of a run whose bytes were wrong, would be a figure of
nothing. Hand-made reports: each row's ratio is `abi_over_in_process_with_fill` as the bench wrote
it, the summary is over every run's ratios; a report that is not a default bench's, or a row that
was not byte-exact, is refused in one line with exit 2.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "abi_ratio.py"


def report(tmp_path: Path, name: str, rows: list, beside: bool = True) -> Path:
    body = {"trace": "t.jsonl", "cp": 1, "rows": rows, "exchange": {"plugin": "fused", "path": "builtin", "beside_in_process": beside}}
    path = tmp_path / name
    path.write_text(json.dumps(body))
    return path


def row(batch: int, variant: str, in_process: float, abi: float, exact: bool = True) -> dict:
    return {"batch": batch, "variant": variant, "byte_exact": exact, "with_fill_us_per_layer_median": in_process,
            "plugin_with_fill_us_per_layer_median": abi, "abi_over_in_process_with_fill": abi / in_process}


def run(*args: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=60)


def test_every_runs_ratio_per_row_and_their_geometric_mean(tmp_path):
    a = report(tmp_path, "a.json", [row(0, "staging_direct", 40.0, 44.0), row(0, "v2", 50.0, 50.0)])
    b = report(tmp_path, "b.json", [row(0, "staging_direct", 40.0, 36.0), row(0, "v2", 50.0, 55.0)])
    done = run(a, b)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "| 0 | staging_direct | 40.0 / 40.0 | 44.0 / 36.0 | 1.100 / 0.900 |" in lines
    assert "| 0 | v2 | 50.0 / 50.0 | 50.0 / 55.0 | 1.000 / 1.100 |" in lines
    geomean = math.prod([1.1, 0.9, 1.0, 1.1]) ** 0.25
    assert lines[-1] == f"ratios: 4, min 0.900, median 1.050, max 1.100, geometric mean {geomean:.4f}", lines[-1]


def test_a_report_that_is_not_the_default_bench_or_a_wrong_row_is_refused(tmp_path):
    plugin_only = report(tmp_path, "p.json", [row(0, "staging_direct", 40.0, 44.0)], beside=False)
    done = run(plugin_only)
    assert done.returncode == 2 and "not a default bench" in done.stderr and done.stdout == ""
    wrong = report(tmp_path, "w.json", [row(1, "v2", 40.0, 44.0, exact=False)])
    done = run(wrong)
    assert done.returncode == 2 and "batch 1 v2 was not byte-exact" in done.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    done = run(bad)
    assert done.returncode == 2 and str(bad) in done.stderr and len(done.stderr.splitlines()) == 1

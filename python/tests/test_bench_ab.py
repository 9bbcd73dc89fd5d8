"""bench/bench_ab.py: the A/B of two sides' `cpkv bench --json` files per layer (two builds, or an
exchange plugin against cpkv's own exchange with --key-b).

Why it matters: `scripts/gpu-visit.sh bench` reports this ratio (two runs, or a baseline tree against this one); a ratio
of the wrong rows (another batch, variant, cp or trace) would be a figure of nothing. Hand-made
reports: the ratio is B's median over A's median of the same (batch, variant), with the geometric
mean per variant; files of another cp, trace or timed layers are refused (exit 1, naming the field);
a file that is not a report, or a row whose bytes were wrong, is named in one line (exit 2).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "bench_ab.py"


def report(tmp_path: Path, name: str, key: str, values: dict, cp: int = 1, exact: bool = True) -> Path:
    rows = [{"batch": b, "variant": v, "byte_exact": exact, key: us} for (b, v), us in values.items()]
    body = {"trace": "t.jsonl", "cp": cp, "layers_timed": 4, "rows": rows}
    path = tmp_path / name
    path.write_text(json.dumps(body))
    return path


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=60)


def plugin_ab(a: Path, b) -> subprocess.CompletedProcess:
    return run("--a", a, "--b", *([b] if isinstance(b, Path) else b), "--key-b", "plugin_compose_us_per_layer_median", "--label-a", "built-in",
               "--label-b", "plain")


def test_ratio_is_the_plugin_median_over_the_built_in_median_of_the_same_batch_and_variant(tmp_path):
    a = report(tmp_path, "a.json", "compose_us_per_layer_median", {(0, "staging_direct"): 20.0, (1, "staging_direct"): 10.0, (0, "v2"): 5.0})
    b1 = report(tmp_path, "b1.json", "plugin_compose_us_per_layer_median", {(0, "staging_direct"): 30.0, (1, "staging_direct"): 12.5})
    b2 = report(tmp_path, "b2.json", "plugin_compose_us_per_layer_median", {(0, "staging_direct"): 34.0, (1, "staging_direct"): 12.5})
    done = plugin_ab(a, [b1, b2])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "| batch | variant | built-in compose_us_per_layer_median | plain | plain/built-in |"
    # B's median over its two runs (30, 34: 32), over A's; v2 is in no B file and is left out.
    assert lines[2:4] == ["| 0 | staging_direct | 20.00 | 32.00 | 1.600 |", "| 1 | staging_direct | 10.00 | 12.50 | 1.250 |"]
    assert "| staging_direct | 1.414 | 2 |" in lines, lines  # the geometric mean of 1.6 and 1.25


def test_runs_of_another_cp_are_refused_and_a_file_that_is_not_a_report_is_named(tmp_path):
    a = report(tmp_path, "a.json", "compose_us_per_layer_median", {(0, "staging_direct"): 20.0})
    b = report(tmp_path, "b.json", "plugin_compose_us_per_layer_median", {(0, "staging_direct"): 30.0}, cp=2)
    done = plugin_ab(a, b)
    assert done.returncode == 1 and "differ in cp: 1 vs 2" in done.stderr, done.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    done = plugin_ab(a, bad)
    assert done.returncode == 2
    assert str(bad) in done.stderr and done.stdout == "" and len(done.stderr.splitlines()) == 1
    wrong = report(tmp_path, "w.json", "plugin_compose_us_per_layer_median", {(0, "staging_direct"): 30.0}, exact=False)
    done = plugin_ab(a, wrong)
    assert done.returncode == 2 and "batch 0 staging_direct was not byte-exact" in done.stderr

"""scripts/bench_ab.py: the A/B of an exchange plugin against cpkv's own exchange per layer.

Why it matters: `scripts/gpu-visit.sh bench-plugin` reports this ratio as the plugin's cost against
the built-in compose; a ratio of the wrong rows (another batch, variant, cp or trace) would be a
figure of nothing. Hand-made reports: the ratio is plugin median / built-in median of the same
(batch, variant); runs of another cp are refused (exit 1); a file that is not a report is named
(exit 2).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_ab.py"


def report(tmp_path: Path, name: str, key: str, values: dict, cp: int = 1, plugin: str | None = None) -> Path:
    rows = [{"batch": b, "variant": v, key: us} for (b, v), us in values.items()]
    body = {"trace": "t.jsonl", "cp": cp, "layers_timed": 4, "rows": rows}
    if plugin:
        body["exchange"] = {"plugin": plugin, "path": "./lib.so"}
    path = tmp_path / name
    path.write_text(json.dumps(body))
    return path


def run(*args: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=60)


def test_ratio_is_the_plugin_median_over_the_built_in_median_of_the_same_batch_and_variant(tmp_path):
    a = report(tmp_path, "a.json", "compose_us_per_layer_median", {(0, "staging_direct"): 20.0, (1, "staging_direct"): 10.0, (0, "v2"): 5.0})
    b = report(tmp_path, "b.json", "plugin_compose_us_per_layer_median", {(0, "staging_direct"): 30.0, (1, "staging_direct"): 12.5}, plugin="plain")
    done = run(a, b)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "| batch | variant | built-in compose us | plain compose_layer us | plain / built-in |"
    assert lines[2:] == ["| 0 | staging_direct | 20.0 | 30.0 | 1.50 |", "| 1 | staging_direct | 10.0 | 12.5 | 1.25 |"]


def test_runs_of_another_cp_are_refused_and_a_file_that_is_not_a_report_is_named(tmp_path):
    a = report(tmp_path, "a.json", "compose_us_per_layer_median", {(0, "staging_direct"): 20.0})
    b = report(tmp_path, "b.json", "plugin_compose_us_per_layer_median", {(0, "staging_direct"): 30.0}, cp=2)
    done = run(a, b)
    assert done.returncode == 1 and "differ in cp: 1 vs 2" in done.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    done = run(a, bad)
    assert done.returncode == 2
    assert str(bad) in done.stderr and done.stdout == ""

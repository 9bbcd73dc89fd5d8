"""The model replay's chart (scripts/model_chart.py, embedded in `cpkv` at build time; issue 26 item 2):
two figures, the ECDF of modelled time per variant and the per-batch speed-up over v2, where series
that are identical stay distinguishable (each its own line style and marker, and the legend names
the series it is identical to). Expectations are from the CSV written here, not from the script."""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path

import pytest

ROOT = Path(os.environ.get("CPKV_SOURCE_DIR", Path(__file__).resolve().parents[2]))
SCRIPT = ROOT / "scripts" / "model_chart.py"

pytest.importorskip("matplotlib")  # scripts/setup.sh installs python3-matplotlib


def load_chart():
    spec = importlib.util.spec_from_file_location("model_chart", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Four batches, five variants: fused_ar and v2_fallback identical, staging_direct rejected at batch 2.
TIMES = {
    "legacy_span_ar": [8.0, 9.0, 10.0, 12.0],
    "fused_ar": [4.0, 5.0, 6.0, 7.0],
    "v2": [2.0, 3.0, 4.0, 6.0],
    "v2_fallback": [4.0, 5.0, 6.0, 7.0],
    "staging_direct": [1.0, 1.5, math.nan, 2.0],
}


def write_csv(path: Path) -> Path:
    names = list(TIMES)
    lines = ["batch," + ",".join(names)]
    for b in range(4):
        lines.append(",".join([str(10 + b)] + [f"{TIMES[n][b]:.6f}" for n in names]))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_both_figures_identical_series_apart_and_a_png(tmp_path):
    chart = load_chart()
    names, batches, series = chart.read_times(write_csv(tmp_path / "t.csv"))
    assert batches == [10, 11, 12, 13]
    fig = chart.draw(names, batches, series, "title")
    ecdf_ax, speed_ax = fig.axes[:2]
    assert len(fig.axes) == 2, "two figures: the ECDF and the speed-up over v2"
    # ECDF: a line per variant, from 1/count up to 1, x the variant's finite times sorted.
    ecdf_lines = {line.get_label().split(" ")[0]: line for line in ecdf_ax.get_lines()}
    assert set(ecdf_lines) == set(TIMES)
    for name, line in ecdf_lines.items():
        finite = sorted(t for t in TIMES[name] if not math.isnan(t))
        assert list(line.get_xdata()) == finite, name
        assert list(line.get_ydata()) == [(i + 1) / len(finite) for i in range(len(finite))], name
    assert "1 rejected" in ecdf_lines["staging_direct"].get_label()
    # Identical series: told apart by style and named in the legend, both ways.
    a, b = ecdf_lines["fused_ar"], ecdf_lines["v2_fallback"]
    assert (a.get_linestyle(), a.get_marker()) != (b.get_linestyle(), b.get_marker())
    assert "identical to v2_fallback" in a.get_label() and "identical to fused_ar" in b.get_label()
    assert "identical" not in ecdf_lines["v2"].get_label()
    styles = {(line.get_linestyle(), line.get_marker()) for line in ecdf_ax.get_lines()}
    assert len(styles) == len(TIMES), "no two series drawn alike"
    # Speed-up over v2: v2's ms over the variant's, per batch; v2 itself is not drawn; NaN where rejected.
    speed = {line.get_label().split(" ")[0]: line for line in speed_ax.get_lines() if not line.get_label().startswith("_")}
    assert set(speed) == set(TIMES) - {"v2"}
    for name, line in speed.items():
        want = [v / t for v, t in zip(TIMES["v2"], TIMES[name])]
        got = list(line.get_ydata())
        assert list(line.get_xdata()) == batches
        assert all((math.isnan(w) and math.isnan(g)) or abs(w - g) < 1e-12 for w, g in zip(want, got)), name
    # The command line the CLI runs writes a PNG.
    out = tmp_path / "chart.tmp"  # cpkv's temporary name need not end in .png
    assert chart.main(["model_chart.py", str(tmp_path / "t.csv"), str(out), "a title"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_csv_without_its_header_is_refused(tmp_path):
    chart = load_chart()
    bad = tmp_path / "bad.csv"
    bad.write_text("x,v2\n1,2\n")
    with pytest.raises(ValueError, match="header"):
        chart.read_times(bad)
    assert chart.main(["model_chart.py"]) == 2

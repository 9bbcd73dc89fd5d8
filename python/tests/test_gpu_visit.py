"""scripts/gpu-visit.sh: the GPU suites are a table named by what they test, and every doc that
cites one names a suite that exists.

Why it matters: the script is how every GPU figure and GPU test result is made on the device
machine; a doc that tells a reader to run a mode the script no longer has, or a suite name that
runs nothing, sends the next visit's few minutes of device time nowhere. These run without a GPU:
`list` and a bad suite touch no build.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(os.environ.get("CPKV_SOURCE_DIR", Path(__file__).resolve().parents[2]))
SCRIPT = ROOT / "scripts" / "gpu-visit.sh"
SUITES = ["gpu", "mutants", "bench", "conformance", "plugin", "probe", "vmm", "guards", "imports", "allgather"]  # issue 36, item 4


def run(*args: str, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60, env=dict(os.environ, OUT=str(out)))


def test_list_names_the_suites_by_what_they_test(tmp_path):
    listed = run("list", out=tmp_path / "out")
    assert listed.returncode == 0, listed.stderr
    names = [line.split()[0] for line in listed.stdout.splitlines()[1:]]
    assert names == SUITES


def test_an_unknown_suite_is_one_line_and_exit_2_before_anything_runs(tmp_path):
    refused = run("gpu", "round2", out=tmp_path / "out")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == ["gpu-visit: 'round2' is no suite (scripts/gpu-visit.sh list)"]
    assert not (tmp_path / "out").exists()


def test_every_cited_suite_exists():
    cited = []
    for path in [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "python" / "tests").glob("*.py")),
                 *sorted((ROOT / "bench").glob("*.py"))]:
        for word in re.findall(r"scripts/gpu-visit\.sh ([a-z0-9_-]+)", path.read_text()):
            if word not in SUITES + ["all", "list"]:
                cited.append(f"{path.relative_to(ROOT)}: {word}")
    assert not cited, f"docs cite GPU suites the script does not have: {cited}"

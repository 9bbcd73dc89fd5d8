"""docs/ARCHITECTURE.md and docs/paths.md name only files and functions that exist.

Why it matters: the architecture page is how a new engineer (or an engine team adding a backend or
a foreign implementation) finds their way, and docs/paths.md follows its paths file by file; a page
that names files that moved or functions that no longer exist sends them to the wrong place. On
both pages every backticked path must exist in the repository (whole paths from the repository
root, as a reader would type them), and every backticked `path: name` pair must name an identifier
that occurs in that file. The architecture page's dependency table (folder -> the folders it
includes, the project libraries it links, the libraries whose headers it includes) must be the
tree's, both ways.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(os.environ.get("CPKV_SOURCE_DIR", Path(__file__).resolve().parents[2]))
DOC = ROOT / "docs" / "ARCHITECTURE.md"
# The pages whose files and `file: function` pairs are checked: the architecture and its counted walks.
PAGES = (DOC, ROOT / "docs" / "paths.md")
EXTENSIONS = (".cpp", ".hpp", ".cu", ".cuh", ".h", ".py", ".sh", ".md", ".txt", ".json", ".jsonl")


def resolve(token: str) -> Path | None:
    candidate = ROOT / token
    return candidate if candidate.exists() else None


def backticked(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", text)


def looks_like_path(token: str) -> bool:
    return " " not in token and ("/" in token or token.endswith(EXTENSIONS)) and not token.startswith(("-", "$", "http"))


def missing_files(text: str) -> list[str]:
    """The backticked paths of a page that resolve nowhere in the repository."""
    missing = []
    for token in backticked(text):
        path = token.split(":")[0].strip()
        if looks_like_path(path) and resolve(path.rstrip("/")) is None:
            missing.append(path)
    return sorted(set(missing))


def wrong_functions(text: str) -> list[str]:
    """The backticked `file: name` pairs of a page whose name does not occur in that file."""
    wrong = []
    for token in backticked(text):
        match = re.fullmatch(r"([\w./-]+\.\w+): (\w[\w:]*)", token)
        if not match:
            continue
        path = resolve(match.group(1))
        name = match.group(2).split("::")[-1]
        if path is None or not re.search(rf"\b{re.escape(name)}\b", path.read_text()):
            wrong.append(token)
    return wrong


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_named_file_exists(page: Path):
    missing = missing_files(page.read_text())
    assert not missing, f"docs/{page.name} names files that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_named_function_occurs_in_its_file(page: Path):
    wrong = wrong_functions(page.read_text())
    assert not wrong, f"docs/{page.name} names functions not in their files: {wrong}"


def test_the_pages_cite_files_and_functions():
    """Each page cites some, so the two checks above cannot pass by finding nothing to check."""
    for page in PAGES:
        text = page.read_text()
        assert any(looks_like_path(t.split(":")[0].strip()) for t in backticked(text)), page.name
        assert any(re.fullmatch(r"[\w./-]+\.\w+: \w[\w:]*", t) for t in backticked(text)), page.name


def test_the_checker_itself_sees_a_missing_file_and_a_missing_function(tmp_path):
    """The two checks can fail: a made-up path does not resolve, a made-up name does not occur."""
    assert resolve("harness/src/no_such_file.cpp") is None
    assert resolve("cpkv/harness/request.hpp") is None  # an include path is not a path in the repository
    assert resolve("harness/include/cpkv/harness/request.hpp") is not None
    assert not re.search(r"\bno_such_function\b", (ROOT / "harness/src/request.cpp").read_text())
    page = "`harness/src/request.cpp: check_run` and `harness/src/no_such_file.cpp`, `harness/src/request.cpp: no_such_function`"
    assert missing_files(page) == ["harness/src/no_such_file.cpp"]
    assert wrong_functions(page) == ["harness/src/request.cpp: no_such_function"]


# The dependency table: what each folder's sources include and its CMake targets link, read from
# the tree. A folder that includes (or links) a folder the table does not list for it breaks the
# layering the page promises, and a listed dependency that no include or link has is a false claim.
FOLDERS = ("model", "traces", "harness", "sim", "backends", "properties", "include", "examples", "kernels", "gpu", "cli", "python", "fuzz",
           "tests", "bench")
SOURCES = (".cpp", ".hpp", ".cu", ".cuh", ".h", ".c")
# Third-party headers by the first part of their <path>: the library the table names.
LIBRARIES = {"fmt": "fmt", "nlohmann": "nlohmann-json", "boost": "Boost", "rapidcheck": "RapidCheck", "rapidcheck.h": "RapidCheck",
             "CLI": "CLI11", "gtest": "GoogleTest", "gmock": "GoogleTest", "pybind11": "pybind11", "benchmark": "Google Benchmark",
             "cuda_runtime.h": "CUDA", "cuda.h": "CUDA", "cudaTypedefs.h": "CUDA", "cuda": "CUDA", "nccl.h": "NCCL"}
GENERATED = {"model_chart_script.hpp"}  # written into the build folder by cli/CMakeLists.txt


def folder_of(path: Path, root: Path) -> str:
    return path.resolve().relative_to(root.resolve()).parts[0]


def include_folder(name: str, source: Path, root: Path) -> str | None:
    """The folder a quoted include resolves to: beside the including file, under a folder's
    include/ (cpkv/AREA/...), or a folder's own header found from its include path; None if none."""
    beside = source.parent / name
    if beside.exists():
        return folder_of(beside, root)
    if name.startswith("cpkv/"):
        for top in FOLDERS:
            if (root / top / "include" / name).exists() or (root / top / name).exists():
                return top
    found = [top for top in FOLDERS if (root / top / name).exists()]
    own = folder_of(source, root)
    return own if own in found else (found[0] if len(found) == 1 else None)


def scanned(folder: Path, root: Path) -> tuple[set[str], set[str], set[str]]:
    """(folders included, libraries included, includes that resolve nowhere) of every source under folder."""
    includes, libraries, unresolved = set(), set(), set()
    for source in sorted(folder.rglob("*")):
        if source.suffix not in SOURCES or not source.is_file():
            continue
        for quoted, angled in re.findall(r'^\s*#\s*include\s*(?:"([^"]+)"|<([^>]+)>)', source.read_text(errors="replace"), re.M):
            if quoted:
                top = include_folder(quoted, source, root)
                if top is None and quoted not in GENERATED:
                    unresolved.add(f"{source.relative_to(root)}: {quoted}")
                elif top is not None and top != folder.name:
                    includes.add(top)
            elif angled.split("/")[0] in LIBRARIES:
                libraries.add(LIBRARIES[angled.split("/")[0]])
    return includes, libraries, unresolved


def linked(folder: Path) -> set[str]:
    """The project libraries the folder's CMake targets name (cpkv::NAME, cpkv_kernels), itself left out."""
    text = "\n".join(p.read_text() for p in folder.rglob("CMakeLists.txt"))
    names = set(re.findall(r"\bcpkv::(\w+)", text)) | ({"kernels"} if re.search(r"\bcpkv_kernels\b", text) else set())
    return {n for n in names if n in FOLDERS and n != folder.name}


def table_of(text: str) -> dict[str, dict[str, set[str]]]:
    """The page's `| folder | includes | links | libraries |` rows: folder -> column -> names."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        match = re.fullmatch(r"`(\w+)/`", cells[0]) if len(cells) == 4 else None
        if match:
            names = [set() if c in ("-", "") else {n.strip() for n in c.split(",")} for c in cells[1:]]
            rows[match.group(1)] = dict(zip(("includes", "links", "libraries"), names))
    return rows


def disagreements(root: Path, rows: dict[str, dict[str, set[str]]]) -> list[str]:
    found = []
    for name in FOLDERS:
        folder = root / name
        if not folder.is_dir():
            continue
        includes, libraries, unresolved = scanned(folder, root)
        found += [f"{name}/: unresolved include {u}" for u in sorted(unresolved)]
        row = rows.get(name)
        if row is None:
            found.append(f"{name}/: no row in the table")
            continue
        for column, actual in (("includes", includes), ("links", linked(folder)), ("libraries", libraries)):
            if actual - row[column]:
                found.append(f"{name}/ {column} {sorted(actual - row[column])}, which the table does not list")
            if row[column] - actual:
                found.append(f"{name}/: the table lists {column} {sorted(row[column] - actual)}, which no source or CMake file has")
    return found


def test_the_dependency_table_is_the_one_the_includes_and_links_have():
    rows = table_of(DOC.read_text())
    assert set(rows) == set(FOLDERS), f"the table's folders: {sorted(rows)}"
    problems = disagreements(ROOT, rows)
    assert not problems, "docs/ARCHITECTURE.md's dependency table is not the tree's:\n" + "\n".join(problems)


def test_gpu_reads_no_trace_header():
    """The plugin host gets the trace JSON from the harness; gpu/ itself includes nothing of traces/."""
    includes, _, _ = scanned(ROOT / "gpu", ROOT)
    assert "traces" not in includes


def test_the_table_check_sees_an_unlisted_include_and_an_unused_claim(tmp_path):
    """A made-up tree: model/ including a traces header the table does not list fails, and so does
    a table row claiming a dependency no source has."""
    (tmp_path / "traces" / "include" / "cpkv" / "traces").mkdir(parents=True)
    (tmp_path / "traces" / "include" / "cpkv" / "traces" / "trace.hpp").write_text("#pragma once\n")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "plan.cpp").write_text('#include "cpkv/traces/trace.hpp"\n#include <fmt/format.h>\n')
    rows = table_of("| folder | includes | links | libraries |\n|---|---|---|---|\n| `model/` | - | - | fmt |\n| `traces/` | model | - | - |\n")
    problems = disagreements(tmp_path, rows)
    assert any("model/ includes ['traces']" in p for p in problems), problems
    assert any("traces/: the table lists includes ['model']" in p for p in problems), problems

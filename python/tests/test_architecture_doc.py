"""docs/ARCHITECTURE.md names only files and functions that exist.

Why it matters: the architecture page is how a new engineer (or an engine team adding a backend or
a foreign implementation) finds their way; a page that names files that moved or functions that no
longer exist sends them to the wrong place. Every backticked path must exist in the repository
(whole paths from the repository root, as a reader would type them), and every
backticked `path: name` pair must name an identifier that occurs in that file.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(os.environ.get("CPKV_SOURCE_DIR", Path(__file__).resolve().parents[2]))
DOC = ROOT / "docs" / "ARCHITECTURE.md"
EXTENSIONS = (".cpp", ".hpp", ".cu", ".cuh", ".h", ".py", ".sh", ".md", ".txt", ".json", ".jsonl")


def resolve(token: str) -> Path | None:
    candidate = ROOT / token
    return candidate if candidate.exists() else None


def backticked(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", text)


def looks_like_path(token: str) -> bool:
    return " " not in token and ("/" in token or token.endswith(EXTENSIONS)) and not token.startswith(("-", "$", "http"))


def test_every_named_file_exists():
    missing = []
    for token in backticked(DOC.read_text()):
        path = token.split(":")[0].strip()
        if looks_like_path(path) and resolve(path.rstrip("/")) is None:
            missing.append(path)
    assert not missing, f"docs/ARCHITECTURE.md names files that do not exist: {sorted(set(missing))}"


def test_every_named_function_occurs_in_its_file():
    wrong = []
    for token in backticked(DOC.read_text()):
        match = re.fullmatch(r"([\w./-]+\.\w+): (\w[\w:]*)", token)
        if not match:
            continue
        path = resolve(match.group(1))
        name = match.group(2).split("::")[-1]
        if path is None or not re.search(rf"\b{re.escape(name)}\b", path.read_text()):
            wrong.append(token)
    assert not wrong, f"docs/ARCHITECTURE.md names functions not in their files: {wrong}"


def test_the_checker_itself_sees_a_missing_file_and_a_missing_function(tmp_path):
    """The two checks can fail: a made-up path does not resolve, a made-up name does not occur."""
    assert resolve("harness/src/no_such_file.cpp") is None
    assert resolve("cpkv/harness/request.hpp") is None  # an include path is not a path in the repository
    assert resolve("harness/include/cpkv/harness/request.hpp") is not None
    assert not re.search(r"\bno_such_function\b", (ROOT / "harness/src/request.cpp").read_text())

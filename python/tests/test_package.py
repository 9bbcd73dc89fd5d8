"""The package reads well: help(cpkv), a docstring on every public name, stubs that match, a working example.

Why it matters: an engine developer meets cpkv through help() and an editor's type hints; a name
without a docstring or a stub that names a function that does not exist misleads them.
"""

from __future__ import annotations

import ast
import inspect
import os
import pathlib
import pydoc
import subprocess
import sys

import cpkv
import cpkv.strategies
from conftest import SOURCE_DIR

PACKAGE_SOURCE = SOURCE_DIR / "python" / "cpkv"


def public_callables():
    for name in cpkv.__all__:
        value = getattr(cpkv, name)
        if callable(value):
            yield name, value
            if isinstance(value, type):
                for attr, member in vars(value).items():
                    if not attr.startswith("_") and (callable(member) or isinstance(member, property)):
                        yield f"{name}.{attr}", member


def test_every_public_function_class_and_method_has_a_docstring():
    missing = [name for name, value in public_callables() if not (inspect.getdoc(value) or "").strip()]
    assert missing == []


def test_help_renders_the_package_overview_and_every_public_name():
    text = pydoc.render_doc(cpkv, renderer=pydoc.plaintext)
    assert "Differential checking" in text
    for name in ("TraceWriter", "read_trace", "expected_dense", "plan", "replay", "TraceError"):
        assert name in text


def stub_names(path: pathlib.Path):
    tree = ast.parse(path.read_text())
    return {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))} | {
        target.id for node in tree.body if isinstance(node, ast.AnnAssign) for target in [node.target]}


def test_the_extension_stub_names_exactly_what_the_extension_defines():
    from cpkv import _cpkv
    defined = {name for name in dir(_cpkv) if not name.startswith("_")}
    assert stub_names(PACKAGE_SOURCE / "_cpkv.pyi") == defined


def test_the_extension_stub_names_every_method_of_every_class():
    from cpkv import _cpkv
    tree = ast.parse((PACKAGE_SOURCE / "_cpkv.pyi").read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            stubbed = {item.name for item in node.body if isinstance(item, ast.FunctionDef) and not item.name.startswith("_")}
            stubbed |= {item.target.id for item in node.body if isinstance(item, ast.AnnAssign)}
            actual = {name for name in vars(getattr(_cpkv, node.name)) if not name.startswith("_")}
            assert stubbed == actual, node.name


def test_the_capture_example_writes_a_trace_the_cli_plans(cli, tmp_path):
    out = tmp_path / "captured.jsonl"
    run = subprocess.run([sys.executable, str(SOURCE_DIR / "python/examples/capture_hook.py"), str(out)], capture_output=True, text=True, check=True)
    assert "batch 3:" in run.stdout
    assert len(list(cpkv.read_trace(str(out)))) == 4
    assert subprocess.run([cli, "plan", str(out)], capture_output=True).returncode == 0


def test_the_readme_example_runs(tmp_path):
    text = (SOURCE_DIR / "README.md").read_text()  # the project README's Python section
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(cpkv.__file__).resolve().parents[1]))
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["[[0, 1], [0, 1, 1]]", "True"]

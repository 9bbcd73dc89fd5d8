"""What was run, kept whole: an implementation's constructor arguments and the environment it read,
so that every replay line reproduces its run (issue 35, 7e).

- ``--impl module:Class(k=v, ...)`` and ``--impl-arg k=v`` (repeatable) pass constructor arguments;
  every value is a Python literal read with ``ast.literal_eval`` (never eval): numbers, strings,
  True/False/None, tuples, lists, dicts. ``format_impl`` writes them back in the same form.
- A planted bug that rides in an environment variable: the replay line names, as ``NAME=value``
  before the command, every environment variable set in this run whose name the implementation's
  source file spells as a string literal (os.environ["NAME"], os.getenv("NAME")): what an
  implementation reads from the environment is part of what was run.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shlex
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Tuple

from ._context import ContractError

DEFAULT_WINDOW_S = 20.0  # cpkv.conformance.DEFAULT_WINDOW_S: a case's wait bound that its line need not name

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Environment variables the harness and torch set for every run: never the implementation's choice.
_HARNESS_ENV_PREFIXES = ("MASTER_", "TORCHELASTIC_", "OMP_", "CUDA_", "NCCL_", "GLOO_", "PYTHON", "CPKV_CLI", "CPKV_SOURCE_DIR")
_HARNESS_ENV = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "PATH", "HOME", "PWD", "USER"}


def _literal(text: str, where: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise ContractError(f"{where}: {text!r} is not a Python literal (a number, string, True/False/None, tuple, list or dict)") from None


def _keyword(name: str, where: str) -> str:
    if not _NAME.match(name):
        raise ContractError(f"{where}: {name!r} is not an argument name")
    return name


def parse_impl(text: str) -> Tuple[str, Dict[str, Any]]:
    """'module:Class(k=v, ...)' -> ('module:Class', {k: v}); without parentheses, no arguments."""
    if not text.endswith(")") or "(" not in text:
        return text, {}
    head, _, body = text.partition("(")
    where = f"--impl {text}"
    try:
        call = ast.parse(f"f({body}", mode="eval").body
    except SyntaxError:
        raise ContractError(f"{where}: the arguments are not k=v, ... (Python literals)") from None
    if not isinstance(call, ast.Call) or call.args:
        raise ContractError(f"{where}: constructor arguments must be named (k=v, ...)")
    kwargs: Dict[str, Any] = {}
    for keyword in call.keywords:
        if keyword.arg is None:
            raise ContractError(f"{where}: **arguments are not supported; name each one")
        kwargs[keyword.arg] = _literal(ast.get_source_segment(f"f({body}", keyword.value) or "", where)
    return head, kwargs


def parse_impl_args(pairs: Optional[List[str]]) -> Dict[str, Any]:
    """['k=v', ...] from --impl-arg -> {k: v}."""
    out: Dict[str, Any] = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep:
            raise ContractError(f"--impl-arg {pair}: expected NAME=VALUE (VALUE a Python literal)")
        out[_keyword(name.strip(), f"--impl-arg {pair}")] = _literal(value.strip(), f"--impl-arg {pair}")
    return out


def resolve(impl: str, impl_args: Optional[List[str]]) -> Tuple[str, Dict[str, Any]]:
    """--impl (with or without arguments) and --impl-arg together: (module:Class, arguments);
    an argument given both ways is bad input."""
    name, kwargs = parse_impl(impl)
    for key, value in parse_impl_args(impl_args).items():
        if key in kwargs:
            raise ContractError(f"--impl-arg {key}: given twice (also in --impl {impl})")
        kwargs[key] = value
    return name, kwargs


def _written(value: Any) -> str:
    # A string in double quotes (JSON's escapes are Python's too), so a shell's single quotes around
    # the whole --impl stay readable; anything else as repr, which literal_eval reads back.
    return json.dumps(value) if isinstance(value, str) else repr(value)


def format_impl(impl: str, kwargs: Dict[str, Any]) -> str:
    """The --impl text that passes these arguments: 'module:Class(k=v, ...)', or the bare name."""
    if not kwargs:
        return impl
    return f"{impl}({', '.join(f'{k}={_written(v)}' for k, v in sorted(kwargs.items()))})"


def _source_of(impl: str) -> str:
    """The text of the file that defines `impl` ('file.py:Class' or 'module:Class'), found without
    running it (importlib finds a module's file; its package's __init__ may run, as any import's)."""
    module, _, _ = impl.rpartition(":")
    try:
        path = module if module.endswith(".py") else (importlib.util.find_spec(module) or SimpleNamespace(origin=None)).origin
        with open(path or "", encoding="utf-8") as f:
            return f.read()
    except (OSError, ImportError, ValueError, AttributeError):
        return ""


def environment_read(impl: str) -> Dict[str, str]:
    """Every environment variable set now whose name the implementation's source file spells as a
    string literal (the variables it may read), except the harness's and torch's own."""
    try:
        tree = ast.parse(_source_of(impl))
    except (SyntaxError, ValueError):
        return {}
    names = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    return {name: os.environ[name] for name in sorted(names)
            if name in os.environ and name not in _HARNESS_ENV and not name.startswith(_HARNESS_ENV_PREFIXES)}


def with_environment(command: str, environment: Dict[str, str]) -> str:
    """The command with NAME=value assignments before it (a shell line)."""
    prefix = " ".join(f"{name}={shlex.quote(value)}" for name, value in environment.items())
    return f"{prefix} {command}" if prefix else command


def bug_name(mutant: Optional[str], kwargs: Dict[str, Any]) -> str:
    """What a counterexample is named by: the planted bug (--mutant, or the implementation's own
    argument that names it), else its arguments, else 'nomutant'."""
    if mutant:
        return mutant
    for key in ("mutant", "bug"):
        if isinstance(kwargs.get(key), str):
            return str(kwargs[key])
    if kwargs:
        return re.sub(r"[^A-Za-z0-9_.=-]+", "_", ",".join(f"{k}={v}" for k, v in sorted(kwargs.items())))[:60]
    return "nomutant"


def spec_options(spec, batch: Optional[int] = None) -> Dict[str, Any]:
    """A case (a RunSpec) as the torch backend's replay request (its fields' names): every option it
    ran with that a command line can say."""
    wait_ms = round(spec.window_s * 1e3)
    return {"impl": format_impl(spec.impl, spec.impl_kwargs), "ranks": spec.setting.cp, "device": spec.device, "seed": spec.seed,
            "layers": spec.layers, "batch": batch, "mutant": spec.mutant or "none", "swarm": spec.swarm,
            "no_delays": not spec.delays and not spec.timing, "time": spec.timing,
            "wait_ms_max": None if wait_ms == round(DEFAULT_WINDOW_S * 1e3) else wait_ms, "ipc_missing_rank": spec.ipc_fail_rank,
            "require_attention": spec.require_attention, "attention_output": spec.attention_output}


def spec_reproducer(spec, trace: str, batch: Optional[int] = None) -> str:
    """The one command that replays a case (a RunSpec) whose batches are `trace`'s (or its batch
    `batch`): the harness's replay line for the same request (harness/src/request.cpp: replay_line,
    `cpkv replay TRACE --backend torch --impl ...`; the knobs the environment sets written as flags),
    after the environment its implementation's source names. The command line's failures, the pytest
    plugin's counterexamples and the shrunk cases all print this builder's line. A case the command
    line cannot name (a class defined inside a function) has no reproducer, and says so."""
    from .. import _cpkv
    from .._errors import InputError

    try:
        checked = _cpkv.check_torch_request(trace, spec_options(spec, batch))
    except InputError as error:
        return f"(none: {error})"
    return with_environment(checked.replay_line(spec.layers), environment_read(spec.impl))

"""Loading an implementation named by --impl, and trying it first in a bounded child process.

An implementation is foreign code: its import may exit the interpreter (status 0 included: a
launcher that imported it in-process printed nothing and exited 0, a false pass), sleep for good,
raise KeyboardInterrupt, or name something that is not a class (issue 34, items 6 and 16). So the
command line imports it first in a child process of its own session with a time bound, and reports
what the child did in one line (exit 2) before any rank starts.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
from typing import Optional

from ._context import ContractError

# Importing an implementation (torch and CUDA included) on a loaded machine: generous; a bound only.
IMPORT_S_MAX = 120.0
REQUIRED_METHODS = ("setup", "compose_layer", "end_batch", "teardown")


def _load_file(path: str):
    """A module from a file, registered in sys.modules before it runs (a @dataclass under
    `from __future__ import annotations` looks its module up there) and with its folder on sys.path
    (it may import a sibling module): as `python3 FILE` would run it."""
    name = "cpkv_impl_" + "".join(ch if ch.isalnum() else "_" for ch in os.path.splitext(os.path.basename(path))[0])
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None or not os.path.isfile(path):
        raise ImportError(f"no file {path}")
    folder = os.path.dirname(os.path.abspath(path))
    if folder not in sys.path:
        sys.path.insert(0, folder)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def load_impl(text: str):
    """The class named by 'module:Class' or 'file.py:Class'; a ContractError line when it cannot be."""
    module_name, sep, class_name = text.rpartition(":")
    if not sep or not module_name or not class_name:
        raise ContractError(f"--impl {text}: expected module:Class or path/to/file.py:Class")
    try:
        module = _load_file(module_name) if module_name.endswith(".py") else importlib.import_module(module_name)
    except Exception as error:  # any import failure is the user's input, reported in one line
        raise ContractError(f"--impl {text}: cannot import {module_name}: {type(error).__name__}: {error}") from None
    except KeyboardInterrupt:
        raise ContractError(f"--impl {text}: importing {module_name} raised KeyboardInterrupt") from None
    except SystemExit as error:
        raise ContractError(f"--impl {text}: importing {module_name} called sys.exit({error.code!r})") from None
    cls = getattr(module, class_name, None)
    if cls is None:
        raise ContractError(f"--impl {text}: {module_name} has no {class_name}")
    if not isinstance(cls, type):
        raise ContractError(f"--impl {text}: {class_name} is {type(cls).__name__} {_short(cls)}, not a class")
    return cls


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_impl_class(text: str, mutant: Optional[str]) -> None:
    """The class imports, is a class, and has the four methods (in the process that calls it)."""
    cls = load_impl(text)
    missing = [m for m in REQUIRED_METHODS if not callable(getattr(cls, m, None))]
    if missing:
        raise ContractError(f"--impl {text}: {cls.__name__} has no {', '.join(missing)}")
    if mutant and cls.__module__ != "cpkv.conformance.reference":
        raise ContractError(f"--mutant {mutant}: planted bugs exist only in cpkv.conformance.reference, not {text}")


def _probe_child(text: str, mutant: str, result_fd: int) -> None:
    """The probe process: check the class, write one JSON answer to result_fd, exit 0."""
    with os.fdopen(result_fd, "w") as out:
        try:
            check_impl_class(text, mutant or None)
            answer = {"ok": True}
        except ContractError as error:
            answer = {"error": str(error)}
        out.write(json.dumps(answer))
        out.flush()
    os._exit(0)  # no atexit handler of the implementation's


def _exit_words(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited (exit code {code})"


def probe_impl(text: str, mutant: Optional[str] = None, bound_s: Optional[float] = None) -> None:
    """Import the implementation in a bounded child first: ContractError (one line) when it does not
    import, is not a class with the four methods, exits, is killed, or takes longer than bound_s
    (default IMPORT_S_MAX; the command line's --import-s-max, or $CPKV_IMPORT_S_MAX read there)."""
    if bound_s is None:
        bound_s = IMPORT_S_MAX
    read_fd, write_fd = os.pipe()
    code = f"import sys; from cpkv.conformance._impl_loader import _probe_child; _probe_child(sys.argv[1], sys.argv[2], {write_fd})"
    try:
        child = subprocess.Popen([sys.executable, "-c", code, text, mutant or ""], pass_fds=(write_fd,), stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    finally:
        os.close(write_fd)
    try:
        try:
            _, err = child.communicate(timeout=bound_s)
        except subprocess.TimeoutExpired:
            _kill_session(child)
            raise ContractError(f"--impl {text}: importing it did not finish within {bound_s:.0f} s (a hang at import?)") from None
        finally:
            _kill_session(child)  # whatever the import forked dies with the probe
        with os.fdopen(read_fd, "r") as answer_file:
            read_fd = -1
            answer_text = answer_file.read()
    finally:
        if read_fd >= 0:
            os.close(read_fd)
    answer = json.loads(answer_text) if answer_text.startswith("{") else None
    if answer is None:
        last = err.decode(errors="replace").strip().splitlines()[-1:] if err else []
        said = f"; its last line: {last[0][:200]}" if last else ""
        raise ContractError(f"--impl {text}: the process importing it {_exit_words(child.returncode)} before the import "
                            f"finished{said}")
    if "error" in answer:
        raise ContractError(answer["error"])


def _kill_session(child: subprocess.Popen) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass

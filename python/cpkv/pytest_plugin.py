"""pytest plugin for an engine's test suite: ``pytest -p cpkv.pytest_plugin``.

Options
    ``--cpkv-trace FILE``   parametrise every test that takes ``cpkv_batch`` over the trace's batches
    ``--cpkv-seed S``       the content and delay seed (default 1; printed in the header)
    ``--cpkv-swarm``        draw every delay knob from the seed (as ``cpkv replay --swarm``)
    ``--cpkv-window S``     the bound of every wait of a conformance run (default 20 s)
    ``--cpkv-counterexamples DIR``  where a failing case is written as a trace (default: pytest's tmp)
    ``--cpkv-require-attention``  every layer must return an "attention" plan (docs/attention.md)
    ``--cpkv-attention-output``  also compare cpkv.attention.reference over each rank's plan with the single device

Fixtures
    ``cpkv_seed``, ``cpkv_swarm``: the options' values.
    ``cpkv_batch``: ``(setting, batch, index)`` of one trace batch (needs ``--cpkv-trace``).
    ``cpkv_conformance``: ``run(impl, setting, batches, **options)`` runs an implementation under the
    conformance harness with the session's seed and swarm; on failure it shrinks the case, writes it
    as a trace, and fails the test with the located lines, the trace's path and a one-line reproducer.
    A wrong attention plan (invariant 9) fails it as a wrong byte does, with the checker's line.
"""

from __future__ import annotations

import os
from typing import Any, List

import pytest


def pytest_addoption(parser) -> None:
    group = parser.getgroup("cpkv")
    group.addoption("--cpkv-trace", default=None, help="parametrise cpkv_batch over this trace's batches")
    group.addoption("--cpkv-seed", type=int, default=1, help="content and delay seed")
    group.addoption("--cpkv-swarm", action="store_true", help="draw every delay knob from the seed")
    group.addoption("--cpkv-window", type=float, default=20.0, help="seconds before a wait is reported")
    group.addoption("--cpkv-counterexamples", default=None, help="directory for failing cases, as traces")
    group.addoption("--cpkv-require-attention", action="store_true", help='every layer must return an "attention" plan')
    group.addoption("--cpkv-attention-output", action="store_true",
                    help="compare cpkv.attention.reference over each rank's plan with the single device, bit for bit")


def pytest_report_header(config) -> str:
    return (f"cpkv: seed {config.getoption('--cpkv-seed')}{' swarm' if config.getoption('--cpkv-swarm') else ''}"
            f"{' trace ' + config.getoption('--cpkv-trace') if config.getoption('--cpkv-trace') else ''}")


def pytest_generate_tests(metafunc) -> None:
    if "cpkv_batch" not in metafunc.fixturenames:
        return
    path = metafunc.config.getoption("--cpkv-trace")
    if path is None:
        metafunc.parametrize("cpkv_batch", [pytest.param(None, marks=pytest.mark.skip(reason="needs --cpkv-trace FILE"))])
        return
    import cpkv

    reader = cpkv.read_trace(path)
    batches = list(reader)
    metafunc.parametrize("cpkv_batch", [(reader.setting, b, i) for i, b in enumerate(batches)],
                         ids=[f"batch{i}" for i in range(len(batches))])


@pytest.fixture
def cpkv_seed(request) -> int:
    return request.config.getoption("--cpkv-seed")


@pytest.fixture
def cpkv_swarm(request) -> bool:
    return request.config.getoption("--cpkv-swarm")


@pytest.fixture
def cpkv_conformance(request, tmp_path):
    from cpkv import conformance
    from cpkv.conformance._impl_spec import spec_reproducer
    from cpkv.conformance._shrink import shrink, size, write_trace

    config = request.config
    directory = config.getoption("--cpkv-counterexamples") or str(tmp_path)

    def run(impl: Any, setting, batches: List, **options: Any):
        options.setdefault("seed", config.getoption("--cpkv-seed"))
        options.setdefault("swarm", config.getoption("--cpkv-swarm"))
        options.setdefault("window_s", config.getoption("--cpkv-window"))
        options.setdefault("require_attention", config.getoption("--cpkv-require-attention"))
        options.setdefault("attention_output", config.getoption("--cpkv-attention-output"))
        spec = conformance.case(impl, setting, batches, **options)
        outcome = conformance.run_cases([spec])[0]
        if outcome.passed:
            return outcome
        small, small_outcome, _ = shrink(spec, outcome.first_check())
        shown = small_outcome or outcome
        trace = write_trace(small, _counterexample_path(directory, small), f"{spec.impl}: {outcome.first_check()}")
        lines = (shown.mismatches + shown.findings + [shown.failure or ""])[:6]
        pytest.fail("\n".join([f"cpkv conformance: {', '.join(outcome.checks_fired())} (shrunk {size(spec)} -> {size(small)})",
                               *[line for line in lines if line], f"counterexample: {os.path.abspath(trace)}",
                               f"replay: {spec_reproducer(small, trace)}"]), pytrace=False)

    return run


def _counterexample_path(directory: str, spec) -> str:
    """counterexample-CLASS-BUG-seedS.jsonl: BUG is the planted bug (--mutant, or the implementation's
    own argument naming it: a foreign bug is named by its bug, not 'nomutant')."""
    from cpkv.conformance._impl_spec import bug_name

    os.makedirs(directory, exist_ok=True)
    impl = spec.impl.rpartition(":")[2] or "impl"
    return os.path.join(directory, f"counterexample-{impl}-{bug_name(spec.mutant, spec.impl_kwargs)}-seed{spec.seed}.jsonl")

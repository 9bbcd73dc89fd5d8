"""Shared fixtures of the cpkv Python suite. ctest sets PYTHONPATH (the build folder's package),
CPKV_CLI (the cpkv command) and CPKV_SOURCE_DIR; run by hand, the defaults below find them."""

from __future__ import annotations

import os
import pathlib
import sys

import pytest
from hypothesis import HealthCheck, settings

SOURCE_DIR = pathlib.Path(os.environ.get("CPKV_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
CLI = os.environ.get("CPKV_CLI", str(SOURCE_DIR / "build" / "cli" / "cpkv"))
SAMPLES = sorted((SOURCE_DIR / "traces" / "samples").glob("*.jsonl"))
sys.path.insert(0, str(SOURCE_DIR / "python" / "examples"))

# Derandomized by default: every run draws the same examples (the seed is each test's own digest),
# so CI is repeatable. --hypothesis-seed=N explores other draws: derandomize would override the seed
# (Hypothesis consults it first), so a given seed loads the same profile without it, and seeds 1 and
# 2 draw different cases. Example counts keep the suite under 20 s.
_PROFILE = dict(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.register_profile("cpkv", derandomize=True, **_PROFILE)
settings.register_profile("cpkv-seeded", derandomize=False, **_PROFILE)


def pytest_configure(config: pytest.Config) -> None:
    seeded = config.getoption("hypothesis_seed", default=None) is not None
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "cpkv-seeded" if seeded else "cpkv"))


@pytest.fixture
def cli() -> str:
    if not os.access(CLI, os.X_OK):
        pytest.fail(f"the cpkv command is not at {CLI} (set CPKV_CLI)")
    return CLI


@pytest.fixture
def tiny() -> str:
    return str(SOURCE_DIR / "traces" / "samples" / "tiny.jsonl")

"""Replay and plan from Python return the numbers the cpkv command's JSON holds.

Why it matters: an engine's scripts call cpkv.plan / cpkv.replay instead of parsing the command's
output; the two must never drift. The command is run as a subprocess and compared field by field.
"""

from __future__ import annotations

import inspect
import json
import subprocess

import pytest

import cpkv
from cpkv import _cpkv
from cpkv import _plan as cpkv_plan_module
from conftest import SAMPLES


def cli_plan(cli, tmp_path, path, *args):
    out = tmp_path / "plan.json"
    subprocess.run([cli, "plan", str(path), "--json", str(out), *args], check=True, capture_output=True, text=True)
    return [json.loads(line) for line in out.read_text().splitlines()]


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
@pytest.mark.parametrize("variant", ["staging_direct", "legacy_span_ar", "v2", "allgather_zigzag", "allgather_continuous"])
def test_plan_equals_the_cli_json_on_every_sample(cli, tmp_path, sample, variant):
    assert cpkv.plan(str(sample), variant=variant) == cli_plan(cli, tmp_path, sample, "--variant", variant)


def test_plan_with_batch_and_rank_equals_the_cli_json(cli, tmp_path, tiny):
    assert cpkv.plan(tiny, batch=2, rank=1) == cli_plan(cli, tmp_path, tiny, "--batch", "2", "--rank", "1")
    assert cpkv.plan(tiny, batch=2)[0]["verdict"] == "overflow"


@pytest.mark.parametrize("variant", ["allgather_zigzag", "allgather_continuous"])
def test_token_split_plan_with_batch_and_rank_equals_the_cli_json(cli, tmp_path, tiny, variant):
    # Section 12: batch 2 overflows staging (8 current pages > 6 slots), but a token split has no staging.
    mine = cpkv.plan(tiny, batch=2, rank=1, variant=variant)
    assert mine == cli_plan(cli, tmp_path, tiny, "--batch", "2", "--rank", "1", "--variant", variant)
    assert mine[0]["verdict"] == "no_staging" and mine[0]["staging_slots"] is None
    assert [r["rank"] for r in mine[0]["ranks"]] == [1]


def test_plan_objects_are_the_one_builders_through_the_binding(tiny):
    """One builder of the plan's shape (harness/src/plan_report.cpp: plan_json) behind the command and
    cpkv.plan: each object is the binding's, and the Python module spells no field of its own. The
    tests above still compare the options handling (batch, rank, variant) of the two front ends."""
    reader = cpkv.read_trace(tiny)
    batches = list(reader)
    for variant in ("staging_direct", "allgather_zigzag"):
        built = [_cpkv.plan_json(reader.setting, each, index, None, variant) for index, each in enumerate(batches)]
        assert cpkv.plan(tiny, variant=variant) == built
    assert '"bytes_pulled_from"' not in inspect.getsource(cpkv_plan_module)  # a key of the shape, not the docstring's mention


@pytest.mark.parametrize("kwargs, option, field", [
    ({"rank": 2}, ["--rank", "2"], "rank"),
    ({"batch": 3}, ["--batch", "3"], "batch"),
    ({"variant": "nope"}, ["--variant", "nope"], "variant"),
])
def test_plan_refuses_what_the_cli_refuses_with_the_same_reason(cli, tiny, kwargs, option, field):
    run = subprocess.run([cli, "plan", tiny, *option], capture_output=True, text=True)
    assert run.returncode == 2
    with pytest.raises(cpkv.InputError) as error:
        cpkv.plan(tiny, **kwargs)
    assert error.value.field == field
    assert run.stderr == f"cpkv: error: --{field}: {error.value.reason}\n"


def cli_replay(cli, tmp_path, path, *args):
    out = tmp_path / "replay.json"
    run = subprocess.run([cli, "replay", str(path), "--json", str(out), *args], capture_output=True, text=True)
    assert run.returncode in (0, 1), run.stderr  # 1: the run found a mismatch or violation (a planted bug)
    return json.loads(out.read_text())


def without_seconds(report):
    for run in report["runs"]:
        assert run.pop("seconds") >= 0
    return report


@pytest.mark.parametrize("args, kwargs", [
    (["--variant", "staging_direct"], {"variant": "staging_direct"}),
    (["--variant", "all", "--ranks-as", "threads", "--layers", "all"], {"variant": "all", "ranks_as": "threads", "layers": "all"}),
    (["--variant", "v2", "--schedule", "random", "--seed", "5"], {"variant": "v2", "schedule": "random", "seed": 5}),
    (["--variant", "staging_direct", "--schedule", "round-robin", "--mutant", "skip_zero"],
     {"variant": "staging_direct", "schedule": "round-robin", "mutant": "skip_zero"}),
])
def test_replay_sim_equals_the_cli_json(cli, tiny, tmp_path, args, kwargs):
    ours = without_seconds(cpkv.replay(tiny, backend="sim", **kwargs))
    theirs = without_seconds(cli_replay(cli, tmp_path, tiny, *args))
    assert ours == theirs
    assert ours["runs"] and all(run["ranks"] for run in ours["runs"])


@pytest.mark.parametrize("kwargs, mode", [
    ({"ranks_as": "threads"}, "sim/threads"),
    ({"schedule": "round-robin"}, "sim/scheduled"),
])
def test_replay_json_spells_mode_one_way_the_backends_name(tiny, kwargs, mode):
    # README, "The replay --json object": the top-level mode and every run's are the backend's name.
    report = cpkv.replay(tiny, backend="sim", variant="v2,staging_direct", **kwargs)
    assert report["mode"] == mode
    assert [run["mode"] for run in report["runs"]] == [mode, mode]


def test_replay_of_a_planted_bug_fails_and_names_the_invariant(tiny):
    report = cpkv.replay(tiny, variant="staging_direct", schedule="round-robin", mutant="skip_zero")
    run = report["runs"][0]
    assert not run["passed"]
    assert run["mismatches"] > 0 or run["violations"] > 0


def test_replay_batches_runs_batches_held_in_memory(tiny):
    reader = cpkv.read_trace(tiny)
    setting, batches = reader.setting, list(reader)
    from_memory = without_seconds(cpkv.replay_batches(setting, batches, variant="staging_direct", schedule="round-robin"))
    from_file = without_seconds(cpkv.replay(tiny, variant="staging_direct", schedule="round-robin"))
    assert from_memory["trace"] is None
    assert from_memory["runs"] == from_file["runs"]
    assert from_memory["runs"][0]["ranks"][0]["overflows"] == 1  # batch 2 overflows (6 staging slots)


@pytest.mark.parametrize("kwargs, field", [
    ({"backend": "cuda"}, "backend"),
    ({"variant": "nope"}, "variant"),
    ({"mutant": "nope"}, "mutant"),
    ({"ranks_as": "fibers"}, "ranks_as"),
    ({"layers": 0}, "layers"),
    ({"layers": "some"}, "layers"),
    ({"batch": 9}, "batch"),
    ({"ipc_missing_rank": 2}, "ipc_missing_rank"),
])
def test_replay_refuses_impossible_options_before_any_rank_starts(tiny, kwargs, field):
    with pytest.raises(cpkv.InputError) as error:
        cpkv.replay(tiny, **kwargs)
    assert error.value.field == field


def without_timing(summary):
    assert summary.pop("timing")["evaluations"] >= 1
    return summary


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_replay_model_equals_the_cli_json(cli, sample, tmp_path):
    """backend='model' goes through the same request and the same model replay (harness/model_replay.hpp)."""
    ours = without_timing(cpkv.replay(str(sample), backend="model"))
    out = tmp_path / "model.json"
    subprocess.run([cli, "replay", str(sample), "--backend", "model", "--json", str(out)], check=True, capture_output=True)
    theirs = without_timing(json.loads(out.read_text()))
    assert ours == theirs
    assert ours["backend"] == "model" and len(ours["variants"]) == len(cpkv.VARIANTS)


def test_replay_takes_a_comma_separated_list_of_variants_in_the_order_given(tiny):
    report = cpkv.replay(tiny, variant="v2,staging_direct,v2", schedule="round-robin")
    assert [run["variant"] for run in report["runs"]] == ["v2", "staging_direct"]


@pytest.mark.parametrize("kwargs, option", [
    ({"mutant": "nope"}, ["--mutant", "nope"]),
    ({"variant": "v2,nope"}, ["--variant", "v2,nope"]),
    ({"backend": "model", "mutant": "skip_zero"}, ["--backend", "model", "--mutant", "skip_zero"]),
    ({"backend": "model", "swarm": True}, ["--backend", "model", "--swarm"]),
    ({"schedule": "random", "swarm": True}, ["--schedule", "random", "--swarm"]),
    ({"stuck_ms_max": 0}, ["--stuck-ms-max", "0"]),
])
def test_replay_refuses_what_the_cli_refuses_with_the_same_reason(cli, tiny, kwargs, option):
    """One request check (harness/request.hpp) behind both front ends: the same field, the same reason."""
    run = subprocess.run([cli, "replay", tiny, *option], capture_output=True, text=True)
    assert run.returncode == 2 and run.stdout == ""
    with pytest.raises(cpkv.InputError) as error:
        cpkv.replay(tiny, **kwargs)
    flag = error.value.field.replace("_", "-")
    assert run.stderr.startswith(f"cpkv: error: --{flag}: ")
    if option != ["--stuck-ms-max", "0"]:  # CLI11 range-checks that one itself, in its own words
        assert run.stderr == f"cpkv: error: --{flag}: {error.value.reason}\n"


def test_mutants_are_the_table_the_cli_lists(cli, tiny):
    """cpkv.MUTANTS and the CLI's unknown-mutant message both come from harness/mutants.hpp."""
    run = subprocess.run([cli, "replay", tiny, "--backend", "cuda", "--mutant", "token_split"], capture_output=True, text=True)
    gpu = [name for name, (_, held) in cpkv.MUTANTS.items() if "cuda" in held]
    assert gpu == ["single_half", "no_barrier", "skip_zero", "barrier_passes_early"]
    plugin = [name for name, (_, held) in cpkv.MUTANTS.items() if held == ("cuda-plugin",)]
    assert plugin == ["stale_page_inverse", "reused_plan", "unzeroed_rows"]  # the harness's own, around an exchange plugin
    assert all(1 <= invariant <= 9 and ("sim" in held or name in plugin) for name, (invariant, held) in cpkv.MUTANTS.items())
    if "'cuda' is not one of" not in run.stderr:  # a build with the GPU backend: the GPU subset and the harness's are named
        # The default exchange is the built-in plugin: it holds the GPU's planted bugs and invariant 9's
        # (which it plants in the plan it returns); the harness holds its own around any plugin.
        attention = [name for name, (invariant, _) in cpkv.MUTANTS.items() if invariant == 9]
        assert run.stderr.endswith(f"(it holds: {', '.join(gpu + attention)}; the harness holds: none, {', '.join(plugin)})\n"), run.stderr

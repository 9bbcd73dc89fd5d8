"""Capture: a trace written from Python is the C++ writer's bytes, and a bad trace raises one line.

Why it matters: an engine captures its batches from Python and replays them with the cpkv command;
the file must be exactly what the C++ side writes and reads, and a bad capture must say file,
line, field and reason as the command does.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import numpy as np
import pytest

import cpkv
from conftest import SAMPLES, SOURCE_DIR


def rewrite(src: str, dst: pathlib.Path) -> None:
    reader = cpkv.read_trace(src)
    with cpkv.TraceWriter(str(dst), reader.setting, source=reader.header.source) as writer:
        for batch in reader:
            writer.add_batch(batch)


def test_a_trace_written_from_python_is_byte_identical_to_what_the_cpp_writer_wrote(cli, tmp_path):
    # `cpkv import` writes with the C++ TraceWriter; reading it into Python objects and writing it
    # back through the Python writer must reproduce every byte (header, source, page ids).
    imported = tmp_path / "imported.jsonl"
    subprocess.run([cli, "import", "mooncake", str(SOURCE_DIR / "traces/data/mooncake/synthetic_trace.jsonl"), "-o", str(imported),
                    "--max-requests", "24", "--max-batches", "6", "--source-note", "pytest"], check=True, capture_output=True)
    rewritten = tmp_path / "rewritten.jsonl"
    rewrite(str(imported), rewritten)
    assert imported.read_bytes() == rewritten.read_bytes()
    assert len(imported.read_bytes().splitlines()) == 7


def test_every_sample_trace_reads_back_to_the_same_header_and_batches(tmp_path):
    for sample in SAMPLES:
        out = tmp_path / sample.name
        rewrite(str(sample), out)
        original = [json.loads(line) for line in sample.read_text().splitlines()]
        again = [json.loads(line) for line in out.read_text().splitlines()]
        assert again == original, sample.name


def test_add_batch_takes_a_batch_a_request_list_or_scheduler_columns(tmp_path):
    setting = cpkv.Setting(cp=2, page_size=4, kinds=["kv_fp8"], layer_pattern="S", pool_pages=16)
    path = tmp_path / "t.jsonl"
    with cpkv.TraceWriter(str(path), setting) as writer:
        writer.add_batch(cpkv.Batch([cpkv.Request(8, 6, [5, 2])]))
        writer.add_batch([cpkv.Request(prefix_len=4, extend_len=1, prefix_pages=np.array([7], dtype=np.int64))])
        writer.add_batch(prefix_lens=[0, 4], extend_lens=[3, 2], prefix_pages=[[], [9]])
        assert writer.batches_written == 3
    lines = path.read_text().splitlines()
    assert json.loads(lines[1]) == {"batch": 0, "requests": [{"prefix_len": 8, "extend_len": 6, "prefix_pages": [5, 2]}]}
    assert json.loads(lines[2])["requests"][0]["prefix_pages"] == [7]
    assert json.loads(lines[3]) == {"batch": 2, "requests": [{"prefix_len": 0, "extend_len": 3, "prefix_pages": []},
                                                             {"prefix_len": 4, "extend_len": 2, "prefix_pages": [9]}]}
    batches = list(cpkv.read_trace(str(path)))
    assert [len(b) for b in batches] == [1, 1, 2]
    assert batches[0].requests[0] == cpkv.Request(8, 6, [5, 2])


def test_a_bad_batch_is_refused_before_a_byte_is_written_and_the_file_still_reads_back(tmp_path):
    setting = cpkv.Setting(cp=2, page_size=4, kinds=["kv_fp8"], layer_pattern="S", pool_pages=16)
    path = tmp_path / "t.jsonl"
    with cpkv.TraceWriter(str(path), setting) as writer:
        writer.add_batch([cpkv.Request(0, 3)])
        with pytest.raises(cpkv.InputError) as error:
            writer.add_batch([cpkv.Request(4, 3, [16])])  # page 16 is outside a pool of 16 pages
        assert error.value.where == "batch 1"
        assert error.value.field == "requests[0].prefix_pages[0]"
        assert str(error.value) == "batch 1: requests[0].prefix_pages[0]: page id 16 is outside the pool [0, 16)"
        writer.add_batch([cpkv.Request(0, 5)])
    assert [len(b) for b in cpkv.read_trace(str(path))] == [1, 1]


def test_an_invalid_setting_is_refused_with_the_models_field_and_reason():
    # A Setting cannot exist invalid, so no writer (and no file) can be made from one.
    with pytest.raises(cpkv.InputError) as error:
        cpkv.Setting(cp=9, page_size=4, kinds=["kv_fp8"], layer_pattern="S", pool_pages=16)
    assert str(error.value) == "cp: 9 exceeds the 8 ranks of one node"
    with pytest.raises(cpkv.InputError) as error:
        cpkv.Setting(cp=2, page_size=4, kinds=["kv_fp4"], layer_pattern="S", pool_pages=16)
    assert error.value.field == "buffer_kinds[0]"
    assert error.value.reason == 'unknown buffer kind "kv_fp4" (known: kv_fp8, kv_bf16, indexer_k)'


def test_an_unwritable_path_is_an_input_error_naming_the_path(tmp_path):
    """Issue 34, item 21: a missing folder, /proc, a folder removed before close() are one InputError
    line naming the path (they were bare FileNotFoundError / PermissionError)."""
    setting = cpkv.Setting(cp=1, page_size=1, kinds=["kv_fp8"], layer_pattern="S", pool_pages=1)
    with pytest.raises(cpkv.InputError) as error:
        cpkv.TraceWriter(str(tmp_path / "no" / "such" / "dir.jsonl"), setting)
    assert error.value.field == "path" and "dir.jsonl" in str(error.value) and "No such file or directory" in str(error.value)
    with pytest.raises(cpkv.InputError, match="cannot write /proc/t.jsonl: cannot create a file in /proc"):
        cpkv.TraceWriter("/proc/t.jsonl", setting)
    folder = tmp_path / "gone"
    folder.mkdir()
    writer = cpkv.TraceWriter(str(folder / "t.jsonl"), setting)
    for name in os.listdir(folder):
        os.unlink(folder / name)
    folder.rmdir()
    with pytest.raises(cpkv.InputError, match="t.jsonl: rename: No such file or directory; the file was left as it was"):
        writer.close()


BAD_LINE = '{"batch":1,"requests":[{"prefix_len":4,"extend_len":1,"prefix_pages":[99]}]}\n'


@pytest.mark.parametrize("command", [["plan"], ["replay", "--variant", "staging_direct"]])
def test_a_bad_trace_raises_trace_error_with_the_line_the_cli_prints(cli, tiny, tmp_path, command):
    lines = pathlib.Path(tiny).read_text().splitlines(keepends=True)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(lines[0] + lines[1] + BAD_LINE)
    with pytest.raises(cpkv.TraceError) as error:
        list(cpkv.read_trace(str(bad)))
    e = error.value
    assert isinstance(e, ValueError)
    assert (e.file, e.line, e.field) == (str(bad), 3, "requests[0].prefix_pages[0]")
    assert e.reason == "page id 99 is outside the pool [0, 16)"
    run = subprocess.run([cli, *command, str(bad)], capture_output=True, text=True)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr == f"cpkv: error: {e}\n"


def test_plan_and_replay_raise_the_same_trace_error_as_the_reader(tmp_path, tiny):
    lines = pathlib.Path(tiny).read_text().splitlines(keepends=True)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(lines[0] + lines[1] + BAD_LINE)
    with pytest.raises(cpkv.TraceError, match=r":3: requests\[0\]\.prefix_pages\[0\]: "):
        cpkv.plan(str(bad))
    with pytest.raises(cpkv.TraceError, match=r":3: requests\[0\]\.prefix_pages\[0\]: "):
        cpkv.replay(str(bad), variant="staging_direct")


def test_a_missing_file_is_a_trace_error_on_line_zero(cli, tmp_path):
    missing = str(tmp_path / "missing.jsonl")
    with pytest.raises(cpkv.TraceError) as error:
        cpkv.read_trace(missing)
    assert (error.value.line, error.value.field) == (0, "file")
    run = subprocess.run([cli, "plan", missing], capture_output=True, text=True)
    assert run.stderr == f"cpkv: error: {error.value}\n"


def test_the_reader_streams_and_reports_where_it_is(tiny):
    reader = cpkv.read_trace(tiny)
    assert reader.header.setting == reader.setting
    assert reader.header.source["kind"] == "hand-written"
    assert (reader.line, reader.batch_index) == (1, -1)
    first = next(reader)
    assert (reader.line, reader.batch_index) == (2, 0)
    assert [r.prefix_pages for r in first.requests] == [[5, 2], []]
    assert len(list(reader)) == 2


def test_import_records_a_token_split_and_the_model_replays_it(cli, tmp_path):
    # `--split zigzag_tokens` (section 12) beside the page policies: the trace records it, and the
    # page-writer variants get each page from its first token's owner while the all-gather variants
    # split tokens themselves, so the model replay of every variant runs on it.
    imported = tmp_path / "tokens.jsonl"
    subprocess.run([cli, "import", "mooncake", str(SOURCE_DIR / "traces/data/mooncake/synthetic_trace.jsonl"), "-o", str(imported),
                    "--max-requests", "24", "--max-batches", "4", "--split", "zigzag_tokens"], check=True, capture_output=True)
    reader = cpkv.read_trace(str(imported))
    assert reader.setting.split == "zigzag_tokens"
    for batch in reader:
        layout = cpkv.layout_batch(reader.setting, batch)
        for page in layout.current:
            extend = batch.requests[page.request].extend_len
            first = page.page_in_request * reader.setting.page_size
            assert page.writer == cpkv._cpkv.token_owner("zigzag", first, extend, reader.setting.cp)
    replay = subprocess.run([cli, "replay", str(imported), "--backend", "model", "--variant", "all"], capture_output=True, text=True)
    assert replay.returncode == 0, replay.stderr
    assert "allgather_zigzag" in replay.stdout and "staging_direct" in replay.stdout
    bad = subprocess.run([cli, "import", "mooncake", str(SOURCE_DIR / "traces/data/mooncake/synthetic_trace.jsonl"), "-o",
                          str(tmp_path / "x.jsonl"), "--split", "tokens"], capture_output=True, text=True)
    assert bad.returncode == 2 and "zigzag_tokens, continuous_tokens" in bad.stderr

"""`gpufix.record.reader`: one object over a run record - what a record is, its JSON files, its
output streams, telemetry with the job's GPUs filtered once, probe, stack dumps, confirm results."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpufix.errors import GpufixError
from gpufix.record.reader import NotARecordError, Record, is_record, line_kind
from gpufix.telemetry.series import telemetry_evidence
from tests.conftest import FIXTURES


def make_record(folder: Path, telemetry: list[dict] | None = None, **files: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps({"format": 1, "status": "finished", "name": "train"}))
    out = b"hello\nboom\n"
    (folder / "output.log").write_bytes(out)
    (folder / "output.idx").write_text(json.dumps({"t": 0.1, "stream": "stdout", "offset": 0, "length": 6}) + "\n"
                                       + json.dumps({"t": 0.2, "stream": "stderr", "offset": 6, "length": 5}) + "\n")
    if telemetry is not None:
        (folder / "telemetry.jsonl").write_text("".join(json.dumps(line) + "\n" for line in telemetry) + '{"t": 1')
    for name, text in files.items():
        path = folder / name.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return folder


def test_is_record_needs_meta_and_output(tmp_path: Path) -> None:
    record = make_record(tmp_path / "r")
    assert is_record(record) and is_record(str(record))
    assert not is_record(tmp_path)
    (record / "output.log").unlink()
    assert not is_record(record)


def test_open_refuses_a_folder_that_is_not_a_record(tmp_path: Path) -> None:
    with pytest.raises(NotARecordError) as caught:
        Record.open(tmp_path)
    assert isinstance(caught.value, GpufixError)
    assert caught.value.message == f"{tmp_path} is not a run record (no meta.json)"
    assert "gpufix run" in (caught.value.hint or "")
    (tmp_path / "meta.json").write_text("{}")
    with pytest.raises(NotARecordError, match=r"\(no output\.log\)"):
        Record.open(tmp_path)


def test_meta_and_result_are_dicts_even_when_missing_or_broken(tmp_path: Path) -> None:
    record = Record.open(make_record(tmp_path / "r", **{"result.json": "[1, 2]"}))
    assert record.meta["name"] == "train"
    assert record.result == {}
    (Path(record.path) / "meta.json").write_text("{not json")
    assert Record(record.path).meta == {}
    (Path(record.path) / "result.json").unlink()
    os.mkfifo(Path(record.path) / "result.json")  # never opened: a FIFO would block the read
    assert Record(record.path).result == {}


def test_streams_and_chunks_come_from_the_layout_readers(tmp_path: Path) -> None:
    record = Record.open(make_record(tmp_path / "r"))
    assert record.stream("stdout") == b"hello\n" and record.stream("stderr") == b"boom\n"
    assert [(c.stream, c.length) for c in record.chunks()] == [("stdout", 6), ("stderr", 5)]
    assert record.output_log == os.path.join(record.path, "output.log")


TELEMETRY = [
    {"t": 10.0, "gpus": [{"gpu": 0, "name": "A", "pci_bus_id": "00000000:18:00.0"},
                         {"gpu": 1, "name": "B", "pci_bus_id": "00000000:2A:00.0"}]},
    {"t": 11.0, "processes": [{"gpu": 1, "pid": 7, "used_mib": 10}], "other_processes": 1},
    {"t": 11.0, "gpu": 0, "util_gpu_pct": 0},
    {"t": 11.0, "gpu": 1, "util_gpu_pct": 90},
    {"t": 11.5, "event": "xid", "gpu": 0, "xid": 79},
    {"t": 11.6, "event": "xid", "gpu": 1, "xid": 48},
    {"t": 11.7, "event": "xid", "xid": 13},
    {"t": 12.0, "host": {"cpu_pct": 100.0, "rss_mib": 1.0}},
    {"t": 12.0, "note": "GPU 0 lost"},
    {"t": 13.0, "end": True},
]


def test_telemetry_is_read_once_with_the_jobs_gpus_filtered(tmp_path: Path) -> None:
    record = Record.open(make_record(tmp_path / "r", TELEMETRY))
    telemetry = record.telemetry
    assert telemetry is record.telemetry  # read once
    assert telemetry.job_gpus == frozenset({1})
    assert len(telemetry.lines) == len(TELEMETRY)  # the torn last line is skipped; the others kept
    kinds = [kind for _n, _t, _obj, kind in telemetry.job_lines]
    assert kinds == ["gpus", "processes", "sample", "xid", "xid", "host", "note", "end"]
    assert [o.get("gpu") for o in telemetry.gpu_lines()] == [1, 1]  # GPU 0's sample and Xid left out
    evidence = telemetry_evidence(telemetry)
    assert {s.group for s in evidence.series["gpu.util_gpu_pct"]} == {"1"}
    assert [line for line, _text in evidence.xid_lines] == [6]  # 48 on GPU 1; 13 names no PCI address


def test_without_process_lines_every_gpu_is_the_jobs(tmp_path: Path) -> None:
    lines = [line for line in TELEMETRY if "processes" not in line]
    telemetry = Record.open(make_record(tmp_path / "r", lines)).telemetry
    assert telemetry.job_gpus is None
    assert [o["gpu"] for o in telemetry.gpu_lines()] == [0, 1, 0, 1]


def test_a_record_without_telemetry_has_none(tmp_path: Path) -> None:
    telemetry = Record.open(make_record(tmp_path / "r")).telemetry
    assert telemetry.lines == [] and telemetry.job_gpus is None and telemetry.gpu_lines() == []


def test_recorded_fixture_telemetry_names_the_job_gpus(tmp_path: Path) -> None:
    record = make_record(tmp_path / "r")
    (record / "telemetry.jsonl").write_bytes((FIXTURES / "telemetry" / "h100x2-xid79.jsonl").read_bytes())
    telemetry = Record.open(record).telemetry
    assert telemetry.job_gpus == frozenset({0, 1})
    assert {o["gpu"] for o in telemetry.gpu_lines()} == {0, 1}


@pytest.mark.parametrize(("obj", "kind"), [
    ({"t": 1, "processes": [], "gpu": 0}, "processes"),
    ({"t": 1, "event": "xid", "gpu": 0, "xid": "79"}, "other"),
    ({"t": 1, "event": "other", "gpu": 0}, "other"),
    ({"t": 1, "gpu": 0}, "sample"),
])
def test_line_kind_edge_cases(obj: dict, kind: str) -> None:
    assert line_kind(obj) == kind


def test_stack_dumps_probe_and_experiment_results(tmp_path: Path) -> None:
    record = make_record(tmp_path / "r", **{"stacks__b.txt": "# dump\n", "stacks__a.txt": "# dump\n",
                                            "stacks__x-hang.json": "{}",
                                            "experiments__results.json": json.dumps({"experiments": []})})
    os.mkfifo(record / "stacks" / "c.txt")
    opened = Record.open(record)
    assert [os.path.basename(p) for p in opened.stack_dumps] == ["a.txt", "b.txt"]  # regular .txt files only
    assert opened.experiment_results == {"experiments": []}
    assert not opened.has_probe and opened.probe_facts.get("found") is False
    assert Record.open(make_record(tmp_path / "s")).experiment_results is None

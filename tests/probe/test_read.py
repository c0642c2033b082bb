"""The readers on hand-written probe files: no torch needed."""

from __future__ import annotations

import json
from pathlib import Path

from gpufix.probe.read import read_probe_exceptions, read_probe_facts, read_probe_series
from gpufix.series import SERIES, SeriesCondition, evaluate


def _write(path: Path, records: list[dict], torn: bool = False) -> None:
    text = "".join(json.dumps(r) + "\n" for r in records)
    path.write_text(text + ('{"kind":"step","t":9' if torn else ""))


def _probe_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "probe"
    folder.mkdir()
    _write(folder / "probe-100.jsonl", [
        {"kind": "start", "t": 1.0, "pid": 100, "role": "main", "torch": "2.5.1", "cuda_build": "12.4",
         "rank": None, "env": {"CUDA_VISIBLE_DEVICES": "0,1"}},
        {"kind": "loader", "t": 1.1, "id": 0, "num_workers": 2, "batch_size": 32, "pin_memory": False},
        {"kind": "batch", "t": 1.2, "loader": 0, "index": 0, "devices": {"cpu": 2}, "tensors": 2},
        {"kind": "optimizer", "t": 1.3, "index": 0, "param_device": "cpu", "param_devices": {"cpu": 4}},
        {"kind": "distributed", "t": 1.3, "rank": 1, "world_size": 2, "backend": "gloo"},
        {"kind": "cuda", "t": 1.3, "initialized": False, "available": True, "device_count": 2, "source": "nvml"},
        {"kind": "step", "t": 2.0, "step": 1, "n": 1, "step_time_s": 0.5, "data_wait_s": 0.4, "loader": 0,
         "num_workers": 2, "batch_size": 32},
        {"kind": "step", "t": 3.0, "step": 11, "n": 10, "step_time_s": 0.1, "data_wait_s": 0.05, "loader": 0,
         "num_workers": 2, "batch_size": 32, "step_time_max_s": 0.3},
        {"kind": "exception", "t": 3.5, "where": "main", "exceptions": [
            {"type": "KeyError", "message": "Caught KeyError in DataLoader worker process 0.\nOriginal Traceback",
             "frames": []}]},
        {"kind": "end", "t": 4.0, "steps": 11, "cuda_initialized": False, "cuda_ever_allocated": False},
    ], torn=True)
    _write(folder / "worker-200.jsonl", [
        {"kind": "start", "t": 3.2, "pid": 200, "role": "dataloader_worker", "worker_id": 0},
        {"kind": "exception", "t": 3.3, "where": "dataloader_worker", "worker_id": 0, "exceptions": [
            {"type": "KeyError", "message": "'label'", "frames": [{"file": "ds.py", "line": 9, "function": "__getitem__"}]}]},
    ])
    _write(folder / "probe-300.jsonl", [  # a launcher that imported torch and trained nothing
        {"kind": "start", "t": 1.0, "pid": 300, "role": "main", "torch": "2.5.1", "cuda_build": "12.4", "rank": None},
        {"kind": "end", "t": 5.0, "steps": 0, "cuda_initialized": False, "cuda_ever_allocated": False},
    ])
    return folder


def test_series_are_grouped_by_rank_and_point_at_their_lines(tmp_path: Path) -> None:
    series = read_probe_series(_probe_dir(tmp_path))
    assert set(series) <= set(SERIES)
    steps = series["probe.step_time_s"]
    assert [(s.t, s.value, s.group, s.line) for s in steps] == [(2.0, 0.5, "1", 7), (3.0, 0.1, "1", 8)]
    assert steps[0].source.endswith("probe-100.jsonl")
    assert [s.value for s in series["probe.data_wait_frac"]] == [0.8, 0.5]
    assert [s.value for s in series["probe.num_workers"]] == [2.0, 2.0]
    assert "probe.cuda_allocated_mib" not in series


def test_series_feed_the_rule_conditions(tmp_path: Path) -> None:
    samples = read_probe_series(_probe_dir(tmp_path))["probe.data_wait_frac"]
    cond = SeriesCondition("probe.data_wait_frac", "mean", ">", 0.3, None, per="rank", min_samples=2)
    result = evaluate(cond, samples)
    assert result.status == "matched" and result.fields["rank"] == "1"


def test_exceptions_link_the_worker_original_to_the_main_process_error(tmp_path: Path) -> None:
    exceptions = read_probe_exceptions(_probe_dir(tmp_path))
    assert [(e.type, e.message.split("\n")[0], e.cause) for e in exceptions] == [
        ("KeyError", "'label'", None), ("KeyError", "Caught KeyError in DataLoader worker process 0.", 0)]
    assert exceptions[0].ref.source.endswith("worker-200.jsonl") and exceptions[0].ref.line == 2
    assert exceptions[1].ref.rank == 1 and exceptions[1].ref.text.startswith("KeyError: Caught KeyError")


def test_facts_sum_up_the_processes_that_trained(tmp_path: Path) -> None:
    facts = read_probe_facts(_probe_dir(tmp_path))
    assert facts["found"] and len(facts["processes"]) == 2
    assert facts["steps"] == 11 and facts["ranks"] == [1] and facts["world_size"] == 2
    assert facts["cuda_build"] == "12.4" and facts["cuda_available"] is True and facts["device_count"] == 2
    assert facts["cuda_visible_devices"] == "0,1"
    assert facts["param_devices"] == ["cpu"] and facts["batch_devices"] == ["cpu"]
    assert facts["cuda_ever_allocated"] is False
    assert facts["data_wait_frac"] == round((0.4 + 0.05 * 10) / (0.5 + 0.1 * 10), 4)
    assert facts["loaders"][0]["num_workers"] == 2
    assert facts["exceptions"] == 2


def test_a_missing_or_empty_folder_reads_as_nothing(tmp_path: Path) -> None:
    assert read_probe_series(tmp_path / "none") == {}
    assert read_probe_exceptions(tmp_path / "none") == []
    facts = read_probe_facts(tmp_path)
    assert facts["found"] is False and facts["steps"] == 0 and facts["cuda_ever_allocated"] is None

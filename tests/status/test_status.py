"""`gpufix status`: sparklines, a synthetic record (2 GPUs, a real probe file from the slow-loader
CPU script), the text and JSON output, and finding the record."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufix.status import BLOCKS, downsample, find_record, render_text, sparkline, status
from tests.conftest import FIXTURES, run_gpufix


# --- sparkline --------------------------------------------------------------------------------

def test_sparkline_empty_and_all_gaps() -> None:
    assert sparkline([]) == ""
    assert sparkline([None, None]) == "  "


def test_sparkline_rises_from_lowest_to_highest_block() -> None:
    line = sparkline([0, 1, 2, 3, 4, 5, 6, 7])
    assert line == BLOCKS
    assert sparkline([0, 100], lo=0, hi=100) == "▁█"
    assert sparkline([50], lo=0, hi=100) == "▅"


def test_sparkline_constant_values_are_one_flat_line() -> None:
    line = sparkline([7, 7, 7, 7])
    assert len(line) == 4 and len(set(line)) == 1 and line[0] in BLOCKS


def test_sparkline_gaps_are_spaces() -> None:
    line = sparkline([1, None, 3, None])
    assert line[1] == " " and line[3] == " " and line[0] == "▁" and line[2] == "█"


def test_sparkline_fits_width_and_clips_to_scale() -> None:
    line = sparkline(list(range(1000)), width=40)
    assert len(line) == 40 and line[0] == "▁" and line[-1] == "█"
    assert list(line) == sorted(line)
    assert sparkline([-5, 500], lo=0, hi=100) == "▁█"


def test_downsample_keeps_few_points_and_buckets_many() -> None:
    assert downsample([(0.0, 1.0), (1.0, 2.0)]) == [1.0, 2.0]
    points = [(float(t), float(t % 2)) for t in range(400)]
    values = downsample(points, 40)
    assert len(values) == 40 and all(v == 0.5 for v in values)
    gap = [(float(t), 1.0) for t in range(100) if not 40 <= t < 80]
    assert None in downsample(gap, 40)


# --- a synthetic record -----------------------------------------------------------------------

START = 1_736_847_000.0
GPU_SAMPLES = 60


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The probe folder of a real run of the slow-loader CPU script under `gpufix run`."""
    pytest.importorskip("torch")
    runs = tmp_path_factory.mktemp("runs")
    subprocess.run([sys.executable, "-m", "gpufix", "run", "--record-dir", str(runs),
                    str(FIXTURES / "training" / "slow_loader_cpu.py")], capture_output=True, timeout=120, check=False)
    (record,) = [p for p in runs.iterdir() if p.is_dir()]
    assert list((record / "probe").glob("probe-*.jsonl"))
    return record / "probe"


def write_record(folder: Path, probe: Path | None, *, state: str = "finished", name: str = "train",
                 start: float = START, output: bytes = b"epoch 1\n", first_lines: tuple[dict, ...] = ()) -> Path:
    folder.mkdir(parents=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(start))
    meta = {"format": 1, "status": state, "name": name, "command": ["python", "train.py", "--lr", "0.1"],
            "host": "synthetic-node", "gpufix_pid": 1, "start_utc": stamp,
            "end_utc": None if state == "running" else time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(start + 90))}
    (folder / "meta.json").write_text(json.dumps(meta))
    (folder / "output.log").write_bytes(output)
    (folder / "output.idx").write_text(
        json.dumps({"t": 0.5, "stream": "stdout", "offset": 0, "length": len(output)}) + "\n" if output else "")
    if state == "finished":
        (folder / "result.json").write_text(json.dumps({"exit_status": 0, "returncode": 0, "signal": None,
                                                        "duration_s": 90.0, "findings": []}))
    lines = list(first_lines)
    for i in range(GPU_SAMPLES):
        t = start + 1 + i
        lines.append({"t": t, "gpu": 0, "util_gpu_pct": 20 + i, "memory_used_mib": 10240 + 100 * i,
                      "memory_total_mib": 81559, "power_w": 100.0 + 5 * i, "power_limit_w": 700.0, "temperature_c": 40 + i // 3})
        lines.append({"t": t, "gpu": 1, "util_gpu_pct": 35, "memory_used_mib": 20480, "memory_total_mib": 81559,
                      "power_w": None, "power_limit_w": 700.0, "temperature_c": 55})
        lines.append({"t": t, "host": {"cpu_pct": 100.0, "rss_mib": 2048.0, "processes": 3}})
    with open(folder / "telemetry.jsonl", "w") as f:
        f.writelines(json.dumps(line) + "\n" for line in lines)
        f.write('{"t": 17368')  # a torn last line
    if probe is not None:
        shutil.copytree(probe, folder / "probe")
    return folder


@pytest.fixture(scope="module")
def record(probe_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_record(tmp_path_factory.mktemp("synthetic") / "20250114T093000Z-train-abc123", probe_dir)


def test_status_values(record: Path) -> None:
    doc = status(record)
    run = doc["run"]
    assert run["name"] == "train" and run["state"] == "finished" and run["exit_status"] == 0
    assert run["command"] == "python train.py --lr 0.1" and run["elapsed_s"] == 90.0

    assert [g["gpu"] for g in doc["gpus"]] == [0, 1]
    gpu0, gpu1 = doc["gpus"]
    assert gpu0["util_pct"]["last"] == 20 + GPU_SAMPLES - 1 and gpu0["util_pct"]["min"] == 20
    assert gpu0["util_pct"]["max"] == 79 and len(gpu0["util_pct"]["values"]) == 40
    assert gpu0["memory_mib"]["max"] == 10240 + 100 * 59 and gpu0["memory_total_mib"] == 81559
    assert gpu0["power_w"]["last"] == 395.0 and gpu0["power_limit_w"] == 700.0
    assert gpu1["temperature_c"] == {**gpu1["temperature_c"], "last": 55.0, "min": 55.0, "max": 55.0}
    assert gpu1["power_w"] is None  # the driver reported no power: no series, not zeros

    (rank,) = doc["training"]
    assert rank["rank"] == 0 and rank["steps"] == 48
    assert rank["steps_per_s"] and rank["steps_per_s"] > 1
    assert rank["data_wait_frac"] > 0.5 and rank["num_workers"] == 0
    assert rank["data_wait_values"] and rank["steps_per_s_values"]

    codes = [f["code"] for f in doc["findings"]]
    assert "DAT010" in codes
    assert all(f["title"] and f["message"] for f in doc["findings"])


def test_text_output_has_sparklines_numbers_and_the_finding(record: Path) -> None:
    result = run_gpufix("status", str(record))
    assert result.returncode == 0, result.stderr.decode()
    text = result.stdout.decode()
    assert text.startswith("train  (finished, exit 0, took 1m30s)")
    assert "GPU 0" in text and "GPU 1" in text
    assert "79%" in text and "15.8/80 GiB" in text and "395/700 W" in text and "55 °C" in text
    assert "steps/s" in text and "of steps" in text and "num_workers=0" in text
    assert sum(1 for line in text.splitlines() if any(b in line for b in BLOCKS[1:])) >= 8
    assert "DAT010  Training steps wait for the data loader (measured)" in text
    assert "waiting for the next batch" in text
    assert "\x1b[" not in text  # plain when not a terminal


def test_the_jobs_gpus_are_told_from_another_jobs(tmp_path: Path) -> None:
    gpus = {"t": START, "gpus": [{"gpu": g, "name": "NVIDIA H200", "pci_bus_id": f"00000000:{g + 1:02X}:00.0"} for g in (0, 1)]}
    seen = {"t": START + 2, "processes": [], "other_processes": 2, "device_files": [0]}  # found through /dev/nvidia0
    xid = {"t": START + 30, "event": "xid", "gpu": 0, "xid": 79}
    record = write_record(tmp_path / "20250114T093000Z-train-def456", None, first_lines=(gpus, seen, xid))
    doc = status(record)
    assert [(g["gpu"], g["name"], g["job"]) for g in doc["gpus"]] == [(0, "NVIDIA H200", True), (1, "NVIDIA H200", False)]
    text = run_gpufix("status", str(record)).stdout.decode()
    assert "  GPU 0  NVIDIA H200\n" in text and "  GPU 1  NVIDIA H200  (not this job's)\n" in text
    assert doc["gpus"][0]["xids"] == [{"t": START + 30, "xid": 79}] and doc["gpus"][1]["xids"] == []
    assert "    Xid     79 at 09:30:30Z\n" in text
    assert status(write_record(tmp_path / "plain", None))["gpus"][0]["job"] is None  # not known: not guessed


def test_json_output(record: Path) -> None:
    result = run_gpufix("status", str(record), "--format", "json")
    assert result.returncode == 0
    doc = json.loads(result.stdout)
    assert doc["run"]["state"] == "finished" and len(doc["gpus"]) == 2
    # (the synthetic record pairs GPU telemetry with a CPU-only probe, so ENV033 may come first)
    assert "DAT010" in [f["code"] for f in doc["findings"]]


def test_watch_stops_when_the_run_has_ended(record: Path) -> None:
    result = run_gpufix("status", str(record), "--watch", "--format", "json", timeout=30)
    assert result.returncode == 0
    assert len(result.stdout.decode().strip().splitlines()) == 1


def test_running_record_without_output_yet(tmp_path: Path) -> None:
    folder = write_record(tmp_path / "run", None, state="running", output=b"", start=time.time() - 30)
    (folder / "telemetry.jsonl").unlink()
    doc = status(folder)
    assert doc["run"]["state"] == "running" and 29 <= doc["run"]["elapsed_s"] < 120
    assert doc["findings"] == [] and doc["gpus"] == [] and doc["training"] == []
    text = render_text(doc)
    assert "(running for" in text and "no GPU telemetry" in text and "none so far" in text


def test_hand_written_probe_steps(tmp_path: Path) -> None:
    """Step records as docs/probe.md describes them: one per step, then one per second summarising n."""
    folder = write_record(tmp_path / "run", None)
    (folder / "probe").mkdir()
    records = [{"kind": "start", "format": 1, "pid": 7, "rank": 1, "t": START}]
    t = START + 5
    for step in range(1, 101):  # 10 steps/s, no DataLoader
        t += 0.1
        records.append({"kind": "step", "step": step, "n": 1, "step_time_s": 0.1, "data_wait_s": None, "t": t})
    for second in range(1, 11):  # then 20 steps/s, summarised each second
        records.append({"kind": "step", "step": 100 + 20 * second, "n": 20, "step_time_s": 0.05,
                        "data_wait_s": None, "t": t + second})
    (folder / "probe" / "probe-7.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + '{"kind":"st')
    (rank,) = status(folder)["training"]
    assert rank["rank"] == 1 and rank["steps"] == 300
    assert rank["data_wait_frac"] is None
    # The last 60 s hold all of it: (300 - 1) steps over 19.9 s.
    assert rank["steps_per_s"] == pytest.approx(299 / 19.9, rel=1e-3)
    assert "no DataLoader measured" in render_text(status(folder))


# --- finding the record -----------------------------------------------------------------------

def test_no_record_exits_2(tmp_path: Path) -> None:
    result = run_gpufix("status", "--record-dir", str(tmp_path / "none"))
    assert result.returncode == 2 and b"no run record under" in result.stderr
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("hi")
    result = run_gpufix("status", str(tmp_path / "plain"))
    assert result.returncode == 2 and b"is not a run record" in result.stderr
    result = run_gpufix("status", str(tmp_path / "missing"))
    assert result.returncode == 2 and b"no such record" in result.stderr


def test_default_record_is_the_newest(tmp_path: Path) -> None:
    parent = tmp_path / "runs"
    write_record(parent / "20250114T093000Z-old-aaaaaa", None, name="old", start=START)
    write_record(parent / "20250115T093000Z-new-bbbbbb", None, name="new", start=START + 86400)
    (parent / "not-a-record").mkdir()
    assert find_record(None, str(parent)).name == "20250115T093000Z-new-bbbbbb"
    assert find_record(str(parent), "elsewhere").name == "20250115T093000Z-new-bbbbbb"
    result = run_gpufix("status", "--record-dir", str(parent), "--format", "json")
    assert result.returncode == 0 and json.loads(result.stdout)["run"]["name"] == "new"
    result = run_gpufix("status", "--format", "json", env={"GPUFIX_RECORD_DIR": str(parent)}, cwd=tmp_path)
    assert result.returncode == 0 and json.loads(result.stdout)["run"]["name"] == "new"
    empty_cwd = tmp_path / "cwd"
    empty_cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "GPUFIX_RECORD_DIR"}
    result = subprocess.run([sys.executable, "-m", "gpufix", "status"], capture_output=True, cwd=empty_cwd, env=env,
                            timeout=60)
    assert result.returncode == 2 and b"no run record under gpufix-runs" in result.stderr


def _mark_running_here(folder: Path, pid: int) -> None:
    meta = json.loads((folder / "meta.json").read_text())
    meta.update(status="running", host=os.uname().nodename, gpufix_pid=pid, end_utc=None)
    (folder / "meta.json").write_text(json.dumps(meta))


def test_record_whose_gpufix_died_is_interrupted(tmp_path: Path) -> None:
    folder = write_record(tmp_path / "run", None, state="running")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _mark_running_here(folder, dead.pid)
    doc = status(folder)
    assert doc["run"]["state"] == "interrupted" and doc["run"]["exit_status"] is None
    assert "(interrupted: gpufix stopped recording" in render_text(doc)


def test_watch_refreshes_until_the_run_ends(tmp_path: Path) -> None:
    folder = write_record(tmp_path / "run", None, state="running")
    _mark_running_here(folder, os.getpid())  # "gpufix" is alive: this test
    watch = subprocess.Popen([sys.executable, "-m", "gpufix", "status", str(folder), "--watch", "--format", "json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert watch.stdout is not None
    first = json.loads(watch.stdout.readline())
    assert first["run"]["state"] == "running"
    (folder / "result.json").write_text(json.dumps({"exit_status": 1, "duration_s": 12.0}))
    out, err = watch.communicate(timeout=30)
    assert watch.returncode == 0, err
    last = json.loads(out.splitlines()[-1])
    assert last["run"]["state"] == "finished" and last["run"]["exit_status"] == 1


def test_a_reused_pid_does_not_keep_a_dead_run_running(tmp_path: Path) -> None:
    """Issue 14, item 6: the pid of a SIGKILLed gpufix may belong to another process by now; the
    start time recorded beside it tells them apart."""
    from gpufix.record.meta import process_start

    folder = write_record(tmp_path / "run", None, state="running")
    _mark_running_here(folder, os.getpid())  # alive, but not the process that wrote the record
    meta = json.loads((folder / "meta.json").read_text())
    meta["gpufix_started"] = (process_start(os.getpid()) or 0) + 1
    (folder / "meta.json").write_text(json.dumps(meta))
    assert status(folder)["run"]["state"] == "interrupted"
    meta["gpufix_started"] = process_start(os.getpid())
    (folder / "meta.json").write_text(json.dumps(meta))
    assert status(folder)["run"]["state"] == "running"

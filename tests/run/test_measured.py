"""Real CPU training scripts under `gpufix run`: the probe measures them and gpufix diagnoses
each from the numbers (no exception is raised by any of them)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, run_gpufix

pytest.importorskip("torch")

SCRIPTS = FIXTURES / "training"


def run_script(name: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess[bytes], dict]:
    result = subprocess.run([sys.executable, "-m", "gpufix", "run", "--record-dir", str(tmp_path), str(SCRIPTS / name)],
                            capture_output=True, timeout=180)
    (record,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    return result, json.loads((record / "result.json").read_text())


@pytest.mark.parametrize(
    ("script", "code", "words"),
    [
        ("slow_loader_cpu.py", "DAT010", b"of each training step waiting for the next batch (median); the loader had "
                                         b"num_workers=0, pin_memory=False, persistent_workers=False"),
        ("memory_creep_cpu.py", "MEM021", b"resident host memory grew by"),
        ("excessive_print_cpu.py", "PRF010", b"KiB of output per second"),
    ],
)
def test_measured_problem_is_diagnosed_with_its_numbers(tmp_path: Path, script: str, code: str, words: bytes) -> None:
    result, doc = run_script(script, tmp_path)
    assert result.returncode == 0  # the job itself succeeded; gpufix keeps its status
    assert b"gpufix: the job succeeded, but its output or measurements show a problem" in result.stderr
    assert code.encode() in result.stderr and words in result.stderr, result.stderr.decode()[-2000:]
    assert doc["findings"][0]["code"] == code


def test_healthy_script_gets_nothing(tmp_path: Path) -> None:
    result, doc = run_script("healthy_cpu.py", tmp_path)
    # gpufix adds no byte: stderr is the bare job's own (torch may warn, e.g. without numpy)
    bare = subprocess.run([sys.executable, str(SCRIPTS / "healthy_cpu.py")], capture_output=True, timeout=180)
    assert result.returncode == 0 and result.stderr == bare.stderr
    assert result.stdout == bare.stdout
    assert doc["findings"] == []


def _starved_record(tmp_path: Path) -> Path:
    """A hand-written probe file (docs/probe.md): the loader pins memory and has workers, yet starves."""
    record = tmp_path / "20261130T000000Z-train-abc123"
    (record / "probe").mkdir(parents=True)
    (record / "meta.json").write_text(json.dumps({"format": 1, "status": "finished"}))
    (record / "output.log").write_bytes(b"epoch 1\n")
    lines = [{"kind": "start", "format": 1, "pid": 7, "rank": 0, "t": 1000.0},
             {"kind": "loader", "id": 0, "num_workers": 2, "pin_memory": True, "persistent_workers": True,
              "prefetch_factor": 2, "batch_size": 64, "cpus_usable": 32, "t": 1000.5}]
    lines += [{"kind": "step", "step": i, "n": 1, "step_time_s": 0.5, "data_wait_s": 0.4, "loader": 0, "num_workers": 2,
               "t": 1001.0 + i / 2} for i in range(1, 41)]
    (record / "probe" / "probe-7.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return record


def test_a_loader_setting_already_in_place_is_not_advised_again(tmp_path: Path) -> None:
    record = _starved_record(tmp_path)
    doc = json.loads(run_gpufix("explain", "--format", "json", str(record)).stdout)
    finding = doc["findings"][0]
    assert finding["code"] == "DAT010"
    assert finding["message"] == ("Rank 0 spent 80% of each training step waiting for the next batch (median); the loader had "
                                  "num_workers=2, pin_memory=True, persistent_workers=True, prefetch_factor=2, batch_size=64")
    titles = [fix["title"] for fix in finding["fixes"]]
    assert not any("pinned memory" in title for title in titles), titles
    assert any("Raise num_workers (it is 2) towards 8 (32 CPUs are usable by this job)" in title
               for title in titles), titles


def test_a_starved_gpu_is_named_with_its_sawtooth(tmp_path: Path) -> None:
    record = _starved_record(tmp_path)
    lines = [{"t": 1001.0, "processes": [{"gpu": 1, "pid": 7, "used_mib": 9000}], "other_processes": 0}]
    for i in range(80):  # GPU 1 (the job's) computes one second in four; GPU 0 is someone else's, busy
        lines.append({"t": 1001.0 + i / 4, "gpu": 0, "util_gpu_pct": 99})
        lines.append({"t": 1001.0 + i / 4, "gpu": 1, "util_gpu_pct": 96 if i % 4 == 0 else 4})
    (record / "telemetry.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    doc = json.loads(run_gpufix("explain", "--format", "json", str(record)).stdout)
    finding = doc["findings"][0]
    assert finding["code"] == "DAT010"
    assert "waiting for the next batch (median), while GPU 1 averaged 27% utilisation (p90 96%); the loader had" \
        in finding["message"], finding["message"]


def _logged_timing_record(tmp_path: Path, num_workers: int, cpus: int) -> Path:
    """A record whose job printed torchvision-style MetricLogger lines (data waiting most of each iteration) and
    whose probe saw the loader's settings, but no per-step timing (an older probe, or the loop is not wrapped)."""
    record = tmp_path / f"20261203T000000Z-train-w{num_workers}"
    (record / "probe").mkdir(parents=True)
    (record / "meta.json").write_text(json.dumps({"format": 1, "status": "finished"}))
    (record / "output.log").write_bytes(
        b"Epoch: [0]  [   0/500]  eta: 0:12:10  lr: 0.1  loss: 6.9123 (6.9123)  time: 2.4012  data: 2.2110  max mem: 0\n"
        b"Epoch: [0]  [ 100/500]  eta: 0:09:10  lr: 0.1  loss: 6.8123 (6.8871)  time: 1.1245  data: 0.9812  max mem: 0\n")
    lines = [{"kind": "start", "format": 1, "pid": 7, "rank": 0, "t": 1000.0},
             {"kind": "loader", "id": 0, "num_workers": num_workers, "pin_memory": False, "persistent_workers": False,
              "prefetch_factor": None, "batch_size": 64, "cpus_usable": cpus, "t": 1000.5}]
    (record / "probe" / "probe-7.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return record


@pytest.mark.parametrize(("num_workers", "cpus", "advice"), [
    (0, 4, "Raise num_workers (it is 0) towards 3 (4 CPUs are usable by this job"),
    (3, 4, "More workers would not help: num_workers=3 already uses the 4 CPUs this job can use"),
])
def test_a_logged_data_time_is_advised_within_the_cpus_the_job_has(tmp_path: Path, num_workers: int, cpus: int,
                                                                     advice: str) -> None:
    """DAT014 reads the job's own timing columns; under `gpufix run` its worker advice is bounded by the CPUs the
    probe saw, and says so when the loader already uses them, instead of a fixed num_workers=8."""
    doc = json.loads(run_gpufix("explain", "--format", "json", str(_logged_timing_record(tmp_path, num_workers, cpus))).stdout)
    finding = doc["findings"][0]
    assert finding["code"] == "DAT014"
    assert "1.1245 s, of which 0.9812 s" in finding["message"]  # the line of batch 0 (worker start-up) is not read
    titles = [fix["title"] for fix in finding["fixes"]]
    assert any(advice in title for title in titles), titles
    assert not any("cores per GPU" in title for title in titles), titles


def test_a_pasted_data_time_log_gets_advice_without_run_facts() -> None:
    """A pasted log has no probe facts: the advice names the setting in the usual trainers, with no count it cannot know."""
    doc = json.loads(run_gpufix("explain", "--format", "json", "-", stdin=(
        b"[09/02 16:44:51 d2.utils.events]:  eta: 2 days, 3:02:44  iter: 3459  total_loss: 0.8811  time: 1.2211  "
        b"last_time: 1.4012  data_time: 1.0213  last_data_time: 0.9911   lr: 0.02  max_mem: 6012M\n")).stdout)
    finding = doc["findings"][0]
    assert finding["code"] == "DAT014"
    first = finding["fixes"][0]
    assert first["title"] == "Give the loader more worker processes (up to the CPU cores per GPU)"
    assert "DATALOADER.NUM_WORKERS" in first["detail"]
    assert not any(re.search(r"\{[a-z_]+\}", fix["title"] + (fix.get("snippet") or "")) for fix in finding["fixes"])


SPEW_AT_FAILURE = (
    "import sys, time\n"
    "for step in range(3):\n"
    "    print(f'step {step} loss 0.5', flush=True)\n"
    "    time.sleep(0.5)\n"
    "for rank in range(2000):  # every rank's long traceback at once, as a crashing job prints them\n"
    "    print(f'[rank{rank}]: Traceback (most recent call last):\\n' + '[rank{rank}]:   File \"train.py\", line 9\\n' * 12\n"
    "          + f'[rank{rank}]: ValueError: bad batch at index {rank}', file=sys.stderr)\n"
    "sys.exit(1)\n"
)


def test_the_burst_of_tracebacks_a_failure_prints_is_not_excessive_output(tmp_path: Path) -> None:
    """PRF010 wants a flood kept up for seconds; a crash's one burst (here 1.3 MB in well under a second) is the
    failure's report, and "log every N steps" would be wrong advice."""
    job = tmp_path / "spew.py"
    job.write_text(SPEW_AT_FAILURE)
    runs = tmp_path / "runs"
    runs.mkdir()
    result = subprocess.run([sys.executable, "-m", "gpufix", "run", "--record-dir", str(runs), str(job)],
                            capture_output=True, timeout=180)
    assert result.returncode == 1 and len(result.stderr) > 1 << 20
    (record,) = [p for p in runs.iterdir() if p.is_dir()]
    doc = json.loads((record / "result.json").read_text())
    assert doc["findings"] and "PRF010" not in [f["code"] for f in doc["findings"]]

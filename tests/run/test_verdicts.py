"""Verdicts of live runs agree with what gpufix measured: real CPU jobs under `gpufix run`.

A diverging job is caught by the probe at the step its loss stopped being finite; a healthy job
and a short job of sub-millisecond steps get nothing; Ctrl-C is an interruption, not an error;
advice fits the run (its precision, its CPUs, whether it used a GPU or a DataLoader at all).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, run_gpufix

pytest.importorskip("torch")

SCRIPTS = FIXTURES / "training"


def run_script(script: Path, tmp_path: Path) -> tuple[subprocess.CompletedProcess[bytes], dict]:
    records = tmp_path / "records"
    result = subprocess.run([sys.executable, "-m", "gpufix", "run", "--record-dir", str(records), str(script)],
                            capture_output=True, timeout=180)
    (record,) = [p for p in records.iterdir() if p.is_dir()]
    return result, json.loads((record / "result.json").read_text())


def training_job(tmp_path: Path, name: str, steps: int, before: str = "", each: str = "", after: str = "") -> Path:
    """A tiny in-memory training loop of `steps` optimizer steps, with lines before, in and after it."""
    job = tmp_path / name
    job.write_text(f"import time, torch\n{before}\nm = torch.nn.Linear(4, 1)\n"
                   "o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                   f"for _ in range({steps}):\n    l = m(torch.randn(8, 4)).pow(2).mean(); o.zero_grad(); l.backward(); o.step()\n"
                   f"    {each or 'pass'}\n{after}\n")
    return job


def codes(doc: dict) -> list[str]:
    return [f["code"] for f in doc["findings"]]


def test_a_diverging_job_gets_the_step_its_loss_stopped_being_finite(tmp_path: Path) -> None:
    result, doc = run_script(SCRIPTS / "diverging_cpu.py", tmp_path)
    assert result.returncode == 0
    assert b"step 20 loss tensor(inf, grad_fn=<MseLossBackward0>)" in result.stdout  # how the job prints it
    root = doc["findings"][0]
    assert root["code"] == "NUM010", codes(doc)
    # lr=4 on this regression: the loss overflows float32 at step 19 (printed as inf at step 20)
    assert root["message"].startswith("The loss became inf at optimizer step 19 on rank 0"), root["message"]
    assert b"NUM010" in result.stderr and b"optimizer step 19" in result.stderr
    (record,) = [p for p in (tmp_path / "records").iterdir() if p.is_dir()]
    (end,) = [json.loads(line) for probe in (record / "probe").glob("probe-*.jsonl")
              for line in probe.read_text().splitlines() if '"kind":"end"' in line.replace(" ", "")]
    assert end["finite_checks"] == 19  # one loss check per step until the first non-finite one
    printed = next(f for f in doc["findings"] if f["code"] == "NUM001")  # the printed tensor(inf, ...) too
    assert printed["consequence_of"] == "NUM010"
    # an fp32 run is not told to switch "from fp16 to bf16"
    assert not any("bf16" in fix["title"] for f in doc["findings"] for fix in f["fixes"]), doc["findings"]


def test_a_nan_gradient_is_named_by_its_parameter(tmp_path: Path) -> None:
    result, doc = run_script(SCRIPTS / "nan_gradient_cpu.py", tmp_path)
    assert result.returncode == 0
    root = doc["findings"][0]
    assert root["code"] == "NUM010"
    assert root["message"].startswith("The gradient of gate became nan by optimizer step 25 on rank 0"), root["message"]


def test_a_healthy_in_memory_job_gets_no_finding(tmp_path: Path) -> None:
    result, doc = run_script(SCRIPTS / "healthy_cpu.py", tmp_path)
    assert result.returncode == 0
    assert doc["findings"] == [] and result.stderr == b"", result.stderr.decode()[-2000:]


def test_sub_millisecond_waits_are_no_slow_loader(tmp_path: Path) -> None:
    """Most of each step waits for the loader, but 2000 steps of a fraction of a millisecond each:
    the measured floors (total wait, wait per step) keep DAT010 quiet."""
    result, doc = run_script(SCRIPTS / "quick_loader_cpu.py", tmp_path)
    assert result.returncode == 0
    assert "DAT010" not in codes(doc) and result.stderr == b"", result.stderr.decode()[-2000:]
    record = next(p for p in (tmp_path / "records").iterdir() if p.is_dir())
    probe = json.loads(run_gpufix("explain", "--format", "json", str(record)).stdout or b"{}")
    assert not probe.get("findings")


def test_slow_loader_advice_fits_the_machine_and_a_cpu_job(tmp_path: Path) -> None:
    result, doc = run_script(SCRIPTS / "slow_loader_cpu.py", tmp_path)
    root = doc["findings"][0]
    assert root["code"] == "DAT010"
    titles = [fix["title"] for fix in root["fixes"]]
    snippets = " ".join(fix.get("snippet") or "" for fix in root["fixes"])
    import os

    usable = len(os.sched_getaffinity(0))
    suggested = max(1, min(8, usable - 1))
    assert f"num_workers={suggested}," in snippets, snippets  # within the CPUs this job can use
    assert not any("pinned memory" in t for t in titles), titles  # it never used a GPU


def test_ctrl_c_is_an_interruption_not_an_error(tmp_path: Path) -> None:
    job = training_job(tmp_path, "loop.py", steps=3000, before="print('started', flush=True)", each="time.sleep(0.02)")
    records = tmp_path / "records"
    proc = subprocess.Popen([sys.executable, "-m", "gpufix", "run", "--record-dir", str(records), str(job)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.readline()  # the job is running (and has imported torch)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGINT  # gpufix dies of SIGINT as the job did: a shell shows 130
    assert b"KeyboardInterrupt" in err  # the job's own traceback, passed through
    assert b"gpufix: the job was interrupted by SIGINT, which gpufix passed on (exit status 130)." in err
    assert b"Not a GPU problem" not in err and b"GEN000" not in err
    (record,) = [p for p in records.iterdir() if p.is_dir()]
    doc = json.loads((record / "result.json").read_text())
    assert doc["exit_status"] == 130 and doc["interrupted_by"] == "SIGINT"
    assert doc["findings"] == []


def test_a_pasted_ctrl_c_traceback_is_an_interruption(tmp_path: Path) -> None:
    text = (b"Traceback (most recent call last):\n  File \"train.py\", line 40, in <module>\n    loss.backward()\n"
            b"KeyboardInterrupt\n")
    doc = json.loads(run_gpufix("explain", "--format", "json", stdin=text).stdout)
    assert codes(doc) == ["GEN020"]
    assert doc["findings"][0]["severity"] == "info"
    plain = run_gpufix("explain", stdin=text).stdout
    assert b"nothing failed on its own" in plain and b"ordinary program error" not in plain


def test_dataloader_advice_only_where_there_is_a_dataloader(tmp_path: Path) -> None:
    job = training_job(tmp_path, "config_job.py", steps=3, before="config = {'lr': 0.1}",
                       after="print(config['warmup_steps'])")
    result, doc = run_script(job, tmp_path)
    assert result.returncode == 1
    titles = [fix["title"] for f in doc["findings"] for fix in f["fixes"]]
    assert doc["findings"][0]["code"] == "GEN008", codes(doc)
    assert not any("num_workers" in t for t in titles), titles
    # the same KeyError raised in a dataset's __getitem__ (pasted, no measurements) keeps the advice
    pasted = (b"Traceback (most recent call last):\n  File \"train.py\", line 30, in <module>\n    for batch in loader:\n"
              b"  File \"/data/proj/data.py\", line 21, in __getitem__\n    label = record['label']\nKeyError: 'label'\n")
    doc = json.loads(run_gpufix("explain", "--format", "json", stdin=pasted).stdout)
    assert any("num_workers=0" in fix["title"] for fix in doc["findings"][0]["fixes"])


def test_binary_output_does_not_hide_the_diagnosis(tmp_path: Path) -> None:
    """A record's output is the job's text with whatever binary it printed: 70 KB of NULs first
    must not make gpufix call the record binary and drop the OOM printed after them."""
    records = tmp_path / "records"
    code = ("import os, sys; os.write(1, b'\\0' * 70000); "
            "sys.stderr.write('torch.OutOfMemoryError: CUDA out of memory.\\n'); sys.exit(1)")
    result = subprocess.run([sys.executable, "-m", "gpufix", "run", "--record-dir", str(records), "--",
                             sys.executable, "-c", code], capture_output=True, timeout=120)
    assert result.returncode == 1 and len(result.stdout) == 70000
    (record,) = [p for p in records.iterdir() if p.is_dir()]
    doc = json.loads((record / "result.json").read_text())
    assert doc["findings"] and doc["findings"][0]["category"] == "oom", doc
    again = json.loads(run_gpufix("explain", "--format", "json", str(record)).stdout)
    assert again["findings"][0]["category"] == "oom"
    # a file the user names directly is still sniffed: a binary file is refused with a hint
    blob = tmp_path / "model.bin"
    blob.write_bytes(bytes(range(256)) * 400)
    refused = run_gpufix("explain", str(blob))
    assert refused.returncode == 2 and b"looks like binary data" in refused.stderr

"""`gpufix attach` on real running processes that write a real log file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gpufix.attach import LogFollower, attach
from gpufix.telemetry.fake import FakeTelemetrySource
from tests.conftest import ROOT

JOB = r"""
import os, sys, time
log, go = sys.argv[1], sys.argv[2]
while not os.path.exists(go):
    time.sleep(0.02)
def w(f, s):
    f.write(s + "\n"); f.flush(); time.sleep(0.05)
f = open(log, "a")
for i in range(3):
    w(f, f"step {i} loss 2.3")
time.sleep(0.5)
f.close(); os.rename(log, log + ".1"); f = open(log, "a")          # rotation (logrotate create)
w(f, "step 3 after rotation")
time.sleep(0.5)
os.truncate(log, 0)                                                 # copytruncate
time.sleep(0.5)
w(f, "step 4 after truncation")
w(f, "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity; 75.10 GiB already allocated; 1.20 GiB free; 77.00 GiB reserved in total by PyTorch)")
if len(sys.argv) > 3:
    time.sleep(600)
sys.exit(1)
"""


def _job(tmp: Path, forever: bool = False) -> tuple[subprocess.Popen[bytes], Path, Path]:
    script, log, go = tmp / "train.py", tmp / "train.log", tmp / "go"
    script.write_text(JOB)
    log.write_text("old line from before attaching\n")
    args = [sys.executable, str(script), str(log), str(go)] + (["forever"] if forever else [])
    return subprocess.Popen(args, start_new_session=True), log, go


def test_follower_handles_rotation_and_truncation(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text("before\n")
    f = LogFollower(str(log))
    assert f.read() == b""
    with open(log, "a") as out:
        out.write("one\n")
    assert f.read() == b"one\n"
    os.rename(log, tmp_path / "a.log.1")
    with open(tmp_path / "a.log.1", "a") as old:
        old.write("late in old\n")
    log.write_text("new file\n")
    assert f.read() == b"late in old\nnew file\n"
    os.truncate(log, 0)
    assert f.read() == b""
    with open(log, "a") as out:
        out.write("x\n")
    assert f.read() == b"x\n"


def test_attach_follows_the_log_and_diagnoses_when_the_job_ends(tmp_path: Path) -> None:
    proc, log, go = _job(tmp_path)
    try:
        go.touch()
        result = attach(proc.pid, str(tmp_path / "runs"), log=str(log), interval_s=0.2, hang_timeout_s=0,
                        source_factory=lambda: FakeTelemetrySource())
    finally:
        proc.wait(timeout=10)
    record = Path(result["record_dir"])
    seen = (record / "output.log").read_text()
    assert "old line" not in seen  # followed from where it was, like tail -F
    for line in ("step 0", "step 2", "step 3 after rotation", "step 4 after truncation", "OutOfMemoryError"):
        assert line in seen
    assert result["process_ended"] and not result["detached"] and result["diagnosed"]
    assert result["findings"][0]["code"] == "MEM001"
    saved = json.loads((record / "result.json").read_text())
    assert saved["findings"][0]["code"] == "MEM001" and saved["exit_status"] is None
    meta = json.loads((record / "meta.json").read_text())
    assert meta["mode"] == "attach" and meta["job_pid"] == proc.pid and meta["status"] == "finished"
    assert (record / "telemetry.jsonl").is_file()


def test_ctrl_c_detaches_and_leaves_the_job_alone(tmp_path: Path) -> None:
    proc, log, go = _job(tmp_path, forever=True)
    runs = tmp_path / "runs"
    watcher = subprocess.Popen(
        [sys.executable, "-m", "gpufix", "attach", str(proc.pid), "--log", str(log), "--record-dir", str(runs),
         "--interval", "0.2", "--hang-timeout", "0"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        while not list(runs.glob("*/meta.json")) and time.monotonic() < deadline:
            time.sleep(0.05)
        go.touch()
        time.sleep(0.6)
        watcher.send_signal(signal.SIGINT)
        out, err = watcher.communicate(timeout=15)
        assert watcher.returncode == 0, err
        assert b"detached" in err
        time.sleep(0.2)
        assert proc.poll() is None  # never signalled
        record = next(runs.iterdir())
        result = json.loads((record / "result.json").read_text())
        assert result["detached"] and result["detach_signal"] == "SIGINT" and not result["process_ended"]
        assert "step 0" in (record / "output.log").read_text()
        assert json.loads((record / "meta.json").read_text())["status"] == "detached"
    finally:
        if watcher.poll() is None:
            watcher.kill()
        proc.kill()
        proc.wait()


def test_attach_to_a_missing_pid_is_a_usage_error(tmp_path: Path) -> None:
    from tests.conftest import run_gpufix

    done = run_gpufix("attach", "999999999", "--record-dir", str(tmp_path))
    assert done.returncode == 2 and b"no running process" in done.stderr


def test_without_log_the_file_the_jobs_stdout_goes_to_is_followed(tmp_path: Path) -> None:
    """Tried as a user: `nohup python train.py > train.log 2>&1 &`, then `gpufix attach PID` without --log saw no
    output at all and could diagnose nothing. The file the job's stdout is redirected to is now followed."""
    script, log, go = tmp_path / "train.py", tmp_path / "train.log", tmp_path / "go"
    script.write_text("import os, sys, time\nprint('step 0 loss 2.31', flush=True)\n"
                      f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.02)\n"
                      "print('step 1 loss nan', flush=True)\ntime.sleep(0.3)\n")
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, str(script)], stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    runs = tmp_path / "runs"
    watcher = subprocess.Popen([sys.executable, "-m", "gpufix", "attach", str(proc.pid), "--record-dir", str(runs),
                                "--interval", "0", "--hang-timeout", "0"],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while not list(runs.glob("*/meta.json")) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        go.touch()
        _out, err = watcher.communicate(timeout=30)
    finally:
        proc.wait(timeout=10)
        if watcher.poll() is None:
            watcher.kill()
    assert f"following the job's output file {log}" in err.decode(), err.decode()
    record = next(runs.iterdir())
    assert "step 1 loss nan" in (record / "output.log").read_text()
    assert json.loads((record / "result.json").read_text())["findings"][0]["code"] == "NUM001"
    assert watcher.returncode == 1  # findings


def test_output_file_is_none_for_a_pipe(tmp_path: Path) -> None:
    from gpufix.attach import output_file

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        assert output_file(proc.pid) is None
    finally:
        proc.kill()
        proc.wait()

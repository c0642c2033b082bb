"""The hang watchdog on real hanging processes: dumps, diagnosis, wait or kill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from gpufix.attach import AttachedJob
from gpufix.telemetry.fake import FakeTelemetrySource
from gpufix.report.run import render_hang
from gpufix.watchdog.monitor import JobMonitor, make_run_sampler
from gpufix.watchdog.stacks import pyspy_path
from tests.watchdog.helpers import DEADLOCK, SLEEPER, start, wait_for


def _monitor(record: Path, timeout: float, on_hang: str, util: int = 0, messages: list[str] | None = None) -> JobMonitor:
    """A monitor whose hang reports are rendered as `gpufix run` prints them, into `messages`."""
    sink = messages if messages is not None else []
    return JobMonitor(0.2, timeout, on_hang, str(record), report=lambda hang: sink.append(render_hang(hang)),
                      source_factory=lambda: FakeTelemetrySource([[{"gpu": 0, "util_gpu_pct": util}]]))


def test_deadlocked_job_gets_stacks_and_a_diagnosis_and_keeps_running(tmp_path: Path) -> None:
    record = tmp_path / "rec"
    record.mkdir()
    proc = start(DEADLOCK, record / "output.log", tmp_path)
    messages: list[str] = []
    monitor = _monitor(record, 1.0, "wait", messages=messages)
    try:
        monitor.start(AttachedJob(proc.pid, proc.pid, time.time(), str(record)))
        # the hang is recorded first, then reported: wait for both (a loaded machine is slow)
        assert wait_for(lambda: monitor.hangs and messages, 10)
        hang = monitor.hangs[0]
        dump = Path(hang.dumps[0])
        assert dump.parent == record / "stacks" and dump.name.endswith(f"-{proc.pid}.txt")
        text = dump.read_text()
        assert text.startswith("# gpufix stack dump") and "job.py" in text
        assert "the job looks hung" in messages[0]
        if pyspy_path():
            assert [f["code"] for f in hang.findings][:1] == ["HNG004"]
            assert "t1 (job.py:7)" in hang.findings[0]["message"] or "t2 (job.py:11)" in hang.findings[0]["message"]
        else:  # /proc only: thread states and wait channels, and an honest note
            assert "py-spy is not installed" in text and "Thread " in text
        saved = json.loads(next((record / "stacks").glob("*-hang.json")).read_text())
        assert saved["dumps"] == list(hang.dumps) and saved["killed"] is False
        time.sleep(0.5)
        assert proc.poll() is None and len(monitor.hangs) == 1  # wait: untouched, fired once
    finally:
        monitor.stop()
        proc.kill()
        proc.wait()


def test_on_hang_kill_ends_the_job(tmp_path: Path) -> None:
    record = tmp_path / "rec"
    record.mkdir()
    proc = start(SLEEPER, record / "output.log", tmp_path)
    monitor = _monitor(record, 0.8, "kill")
    try:
        monitor.start(AttachedJob(proc.pid, proc.pid, time.time(), str(record)))
        assert proc.wait(timeout=15) == -signal.SIGTERM
        assert monitor.hangs[0].killed
    finally:
        monitor.stop()
        if proc.poll() is None:
            proc.kill()


def test_output_or_busy_gpus_keep_the_watchdog_quiet(tmp_path: Path) -> None:
    record = tmp_path / "rec"
    record.mkdir()
    proc = start(SLEEPER, record / "output.log", tmp_path)
    busy = _monitor(record, 0.6, "kill", util=95)
    try:
        busy.start(AttachedJob(proc.pid, proc.pid, time.time(), str(record)))
        time.sleep(1.5)
        assert busy.hangs == [] and proc.poll() is None
    finally:
        busy.stop()
        proc.kill()
        proc.wait()


def test_without_a_record_the_watchdog_is_off_with_a_note() -> None:
    monitor = make_run_sampler(0, 5, "wait", None)
    monitor.start(AttachedJob(os.getpid(), os.getpid(), time.time(), None))
    monitor.stop()
    assert monitor.watchdog is None and "hang watchdog off" in monitor.notes[0]


def test_bad_on_hang_is_refused(tmp_path: Path) -> None:
    from gpufix.watchdog.watchdog import HangWatchdog

    with pytest.raises(ValueError):
        HangWatchdog(1, None, 1, str(tmp_path), None, on_hang="explode")


LAUNCHER_LIKE = '''import signal, time


class SignalException(Exception):
    """What torchrun's agent raises when it is sent a signal (torch.distributed.elastic)."""


def stop(signum, frame):
    raise SignalException(f"Process 4242 got signal: {signum}")


signal.signal(signal.SIGTERM, stop)
print("epoch 1 started", flush=True)
while True:
    time.sleep(0.05)  # stuck in a wait no rule knows
'''


def test_a_job_gpufix_ended_for_a_hang_keeps_the_hang_as_its_cause(tmp_path: Path) -> None:
    """Issue 10/13: whatever the job prints while dying from gpufix's --on-hang kill (here torchrun's
    SignalException, 'an interruption'), the stall is the root cause, even with no wait pattern gpufix
    knows in the stacks."""
    from tests.run.helpers import PY, env, records

    (tmp_path / "job.py").write_text(LAUNCHER_LIKE)
    done = subprocess.run([PY, "-m", "gpufix", "run", "--record-dir", "runs", "--hang-timeout", "2", "--on-hang", "kill",
                           "--", PY, "job.py"], cwd=tmp_path, capture_output=True, env=env(), timeout=120)
    err = done.stderr.decode()
    assert done.returncode == 1, err  # the job's own status: it raised
    (record,) = records(tmp_path / "runs")
    (line,) = [p.read_text() for p in (record / "stacks").glob("*-hang.txt")]
    assert line.startswith("# gpufix-hang: no progress for ") and "gpufix ended the job (--on-hang kill)" in line
    findings = json.loads((record / "result.json").read_text())["findings"]
    assert findings[0]["code"] == "HNG010", findings
    assert "gpufix ended it" in findings[0]["message"]
    interrupted = [f for f in findings if f["code"] == "GEN020"]
    assert interrupted and interrupted[0]["consequence_of"] == "HNG010", findings
    root = next(line for line in err.splitlines() if line.startswith("Root cause:"))
    assert "HNG010" in root, err[-2000:]


def test_a_stall_gpufix_left_running_is_a_warning_on_a_run_that_then_succeeds(tmp_path: Path) -> None:
    """--on-hang wait: the stall is reported (HNG011, a warning: the job moved on), the exit status is the job's."""
    from tests.run.helpers import PY, env, records

    (tmp_path / "job.py").write_text("import time\nprint('loading', flush=True)\ntime.sleep(4)\nprint('done', flush=True)\n")
    done = subprocess.run([PY, "-m", "gpufix", "run", "--record-dir", "runs", "--hang-timeout", "1.5", "--on-hang", "wait",
                           "--", PY, "job.py"], cwd=tmp_path, capture_output=True, env=env(), timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    (record,) = records(tmp_path / "runs")
    findings = json.loads((record / "result.json").read_text())["findings"]
    assert [f["code"] for f in findings] == ["HNG011"], findings
    assert findings[0]["severity"] == "warning" and "left it running" in findings[0]["message"]


STUCK_WORKER = '''
import threading, torch
from torch.utils.data import Dataset, DataLoader
lock = threading.Lock()
class Frames(Dataset):
    def __len__(self): return 1000
    def __getitem__(self, i):
        if i == 37:
            lock.acquire(); lock.acquire()  # a read that never returns
        return torch.zeros(8), 0
for step, (x, y) in enumerate(DataLoader(Frames(), batch_size=4, num_workers=2)):
    if step % 5 == 0: print("step", step, flush=True)
'''


def test_ctrl_c_on_a_stalled_loader_names_the_stuck_worker_line(tmp_path: Path) -> None:
    """Tried as a user: a DataLoader worker stuck in __getitem__, --on-hang wait, then Ctrl-C. The worker's dump
    (HNG003: the dataset line) is the root cause; the main loop's Ctrl-C wait (HNG005) and the stall are its
    consequences, where HNG005 used to be the root with the worker's line listed under 'Also found'."""
    from tests.run.helpers import PY, env, records

    (tmp_path / "job.py").write_text(STUCK_WORKER)
    proc = subprocess.Popen([PY, "-m", "gpufix", "run", "--record-dir", "runs", "--hang-timeout", "3", "--on-hang", "wait",
                             "--", PY, "job.py"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env())
    try:
        assert wait_for(lambda: list(tmp_path.glob("runs/*/stacks/*-hang.json")), 90), "the watchdog never fired"
        proc.send_signal(signal.SIGINT)
        _out, err_bytes = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = err_bytes.decode()
    assert proc.returncode in (130, -signal.SIGINT), err[-2000:]  # the job's own end, as a shell would see it
    (record,) = records(tmp_path / "runs")
    findings = {f["code"]: f for f in json.loads((record / "result.json").read_text())["findings"]}
    if pyspy_path():  # the worker's own frames: the line that never returns
        root = next(f for f in findings.values() if f["consequence_of"] is None and f["category"] != "not_gpu")
        assert root["code"] == "HNG003" and "(job.py:9)" in root["message"], findings
        assert findings["HNG005"]["consequence_of"] == "HNG003", findings
    else:  # /proc only: the Ctrl-C traceback still shows the wait
        assert findings["HNG005"]["consequence_of"] is None, findings
    assert "HNG010" not in findings  # gpufix did not end it


def test_output_activity_counts_new_lines_not_the_same_lines_again(tmp_path: Path) -> None:
    from gpufix.watchdog.watchdog import OutputActivity

    log, probe = tmp_path / "output.log", tmp_path / "probe"
    probe.mkdir()
    log.write_bytes(b"")
    activity = OutputActivity(str(log), str(probe))
    first = activity()

    def printed(text: bytes) -> int:
        with open(log, "ab") as f:
            f.write(text)
        return activity()

    block = b"Traceback (most recent call last):\nOSError: [Errno 24] Too many open files\n"
    moved = printed(block)
    assert moved != first  # new lines
    assert printed(block * 50) == moved and activity.repeating  # the same lines again: no movement
    # the same lines again in chunks that split lines anywhere (as the relay writes them, each poll seeing a few
    # lines' worth): the pieces at the cuts are not judged, so still no movement
    text = block * 40
    for cut in range(0, len(text), 203):
        assert printed(text[cut:cut + 203]) == moved, (cut, text[cut:cut + 203])
    assert printed(b"step 1 loss 0.5\n") != moved and not activity.repeating  # a training line
    now = activity()
    assert printed(b"Epoch 3:  41%|####      | 12/29") != now  # a partial line (a progress bar) moves
    now = activity()
    assert activity() == now  # nothing new anywhere
    (probe / "probe-7.jsonl").write_text('{"kind":"step"}\n')
    assert activity() != now  # the probe's records grew: a step taken, whatever the output
    now = activity()
    assert printed(block * 3) == now  # and the old traceback again is still nothing


REPEATER = """
import time, traceback
print("starting", flush=True)
while True:  # the same traceback without end, as DataLoader workers' fd server prints it on EMFILE
    try:
        raise OSError(24, "Too many open files")
    except OSError:
        traceback.print_exc()
    time.sleep(0.002)
"""


def test_a_job_that_prints_the_same_traceback_without_end_is_a_hang(tmp_path: Path) -> None:
    """Tried as a user: a loop printing one traceback counted as progress, so --on-hang kill never fired and the
    record grew by gigabytes. The same lines again are no progress: the watchdog ends it and says why."""
    from tests.run.helpers import PY, env, records

    (tmp_path / "job.py").write_text(REPEATER)
    done = subprocess.run([PY, "-m", "gpufix", "run", "--record-dir", "runs", "--hang-timeout", "3", "--on-hang", "kill",
                           "--", PY, "job.py"], cwd=tmp_path, capture_output=True, env=env(), timeout=120)
    err = done.stderr.decode()
    assert "only the same output again" in err, err[-2000:]
    (record,) = records(tmp_path / "runs")
    findings = json.loads((record / "result.json").read_text())["findings"]
    assert any(f["code"] == "HNG010" for f in findings), [f["code"] for f in findings]

"""Promise 4: signals reach the job, its status comes back, nothing outlives gpufix."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.run.helpers import env, gpufix_run, process_gone, read_until, records, script, wait_for

CATCHER = """
import os, signal, sys, time
def handler(signum, frame):
    print("got", signal.Signals(signum).name, flush=True)
    sys.exit(40 + signum)
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(s, handler)
print("ready", flush=True)
time.sleep(30)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGQUIT])
def test_signal_reaches_the_job_once_and_its_own_status_comes_back(tmp_path: Path, signum: int) -> None:
    child = script(tmp_path, "catch.py", CATCHER)
    proc = subprocess.Popen([*gpufix_run(tmp_path / "r"), str(child)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env())
    assert b"ready" in read_until(proc, b"ready\n")
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 40 + signum
    assert out == f"got {signal.Signals(signum).name}\n".encode()
    result = json.loads((records(tmp_path / "r")[0] / "result.json").read_text())
    assert result["forwarded_signals"] == [signal.Signals(signum).name]


def test_job_that_does_not_catch_term_dies_of_it(tmp_path: Path) -> None:
    proc = subprocess.Popen([*gpufix_run(tmp_path / "r"), "--", "sh", "-c", "echo ready; sleep 30"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env())
    read_until(proc, b"ready\n")
    proc.terminate()
    proc.communicate(timeout=20)
    assert proc.returncode == 128 + signal.SIGTERM


def _sig_lines(text: bytes) -> dict[str, str]:
    return {line.split(":")[0]: line.split()[1] for line in text.decode().splitlines() if line.startswith("Sig")}


@pytest.mark.parametrize("caller_ignores_int", [False, True])
def test_job_gets_the_bare_signal_dispositions_and_mask(tmp_path: Path, caller_ignores_int: bool) -> None:
    def preexec() -> None:
        if caller_ignores_int:  # as `cmd &` in a script or nohup-like callers do
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    cmd = ["grep", "^Sig", "/proc/self/status"]
    bare = subprocess.run(cmd, capture_output=True, preexec_fn=preexec)
    wrapped = subprocess.run([*gpufix_run(tmp_path / "r"), "--", *cmd], capture_output=True, env=env(), preexec_fn=preexec)
    b, w = _sig_lines(bare.stdout), _sig_lines(wrapped.stdout)
    assert (w["SigIgn"], w["SigBlk"]) == (b["SigIgn"], b["SigBlk"])
    assert (int(w["SigIgn"], 16) >> (signal.SIGINT - 1) & 1) == caller_ignores_int


def test_grandchildren_left_behind_are_killed_at_the_end(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    result = subprocess.run([*gpufix_run(tmp_path / "r"), "--", "sh", "-c", f"sleep 60 & echo $! > {pidfile}; exit 0"],
                            capture_output=True, env=env(), timeout=30)
    assert result.returncode == 0
    assert wait_for(lambda: process_gone(int(pidfile.read_text())), timeout_s=5)


def test_term_to_gpufix_stops_workers_too(tmp_path: Path) -> None:
    child = script(tmp_path, "workers.py", (
        "import subprocess, sys, time\n"
        "w = subprocess.Popen(['sleep', '60'])\n"
        "print(w.pid, flush=True)\n"
        "time.sleep(60)\n"
    ))
    proc = subprocess.Popen([*gpufix_run(tmp_path / "r"), str(child)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env())
    worker = int(read_until(proc, b"\n").split()[0])
    proc.terminate()
    proc.communicate(timeout=20)
    assert proc.returncode == 143
    assert wait_for(lambda: process_gone(worker), timeout_s=5)


def test_sigkill_of_gpufix_kills_the_job_and_the_record_keeps_its_output(tmp_path: Path) -> None:
    child = script(tmp_path, "long.py", (
        "import os, time\n"
        "for i in range(2000):\n    print('line', i)\n"
        "print('pid', os.getpid(), 'ready', flush=True)\n"
        "time.sleep(60)\n"
    ))
    proc = subprocess.Popen([*gpufix_run(tmp_path / "r"), str(child)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env())
    got = read_until(proc, b" ready\n")
    job_pid = int(got.split(b"pid ")[1].split()[0])
    time.sleep(1.0)  # the record's promise: complete up to the last ~second (a writer thread appends it)
    proc.kill()
    proc.communicate(timeout=10)
    assert wait_for(lambda: process_gone(job_pid), timeout_s=5)
    (record,) = records(tmp_path / "r")
    log = (record / "output.log").read_bytes()
    assert log.startswith(b"line 0\nline 1\n")
    assert b"line 1999\npid " in log
    meta = json.loads((record / "meta.json").read_text())
    assert meta["status"] == "running" and meta["job_pid"] == job_pid
    assert not (record / "result.json").exists()


def test_signal_while_the_job_runs_is_not_lost_before_start(tmp_path: Path) -> None:
    # Smoke test of the early path: a TERM sent as soon as gpufix exists still ends the run.
    proc = subprocess.Popen([*gpufix_run(tmp_path / "r"), "--", "sleep", "30"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env())
    assert wait_for(lambda: any(os.path.isdir(p) for p in (tmp_path / "r").glob("*")), timeout_s=10)
    proc.terminate()
    proc.communicate(timeout=20)
    assert proc.returncode in (143, -signal.SIGTERM)


def _processes_running(marker: str) -> list[int]:
    """PIDs of live (not zombie) processes whose command line starts with `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if cmdline.startswith(marker) and state not in (b"Z", b"X"):
            found.append(int(entry))
    return found


def test_sigkill_of_gpufix_leaves_no_grandchildren(tmp_path: Path) -> None:
    """Issue 14, item 2: only the job's direct child gets the death signal; its children (workers,
    ranks, `cmd &`) are killed by gpufix's guardian when gpufix dies, SIGKILL included."""
    marker = f"{os.getpid() % 1000}.{time.monotonic_ns() % 100000}"
    proc = subprocess.Popen([*gpufix_run(tmp_path), "--", "bash", "-c", f"sleep 77{marker} & sleep 77{marker} & wait"],
                            env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: len(_processes_running(f"sleep 77{marker}")) == 2, timeout_s=20)
        proc.kill()
        proc.wait(timeout=10)
        assert wait_for(lambda: not _processes_running(f"sleep 77{marker}"), timeout_s=10), _processes_running(marker)
    finally:
        for pid in _processes_running(f"sleep 77{marker}"):
            os.kill(pid, signal.SIGKILL)

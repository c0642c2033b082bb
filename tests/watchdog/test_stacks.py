"""Stack dumps: reading them (fixtures), the /proc tree, and `gpufix stacks` on a live job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufix.watchdog.analyze import annotate, parse_pyspy
from gpufix.watchdog.proctree import TreeUsage, job_tree
from gpufix.watchdog.stacks import proc_dump, pyspy_path
from gpufix.watchdog.watchdog import diagnose_dumps
from tests.conftest import FIXTURES, run_gpufix
from tests.watchdog.helpers import SLEEPER, start

STACKS = FIXTURES / "stacks"


@pytest.mark.parametrize(("name", "root"), [
    ("ddp-rank1-in-allreduce.txt", "HNG001"),
    ("loader-worker-stuck.txt", "HNG003"),
    ("deadlock-two-threads.txt", "HNG004"),
])
def test_fixture_dumps_are_diagnosed(name: str, root: str) -> None:
    findings = diagnose_dumps([str(STACKS / name)])
    assert findings[0]["code"] == root


def test_collective_wait_is_read_from_frames() -> None:
    text = (STACKS / "ddp-rank1-in-allreduce.txt").read_text()
    threads = parse_pyspy(text)
    assert [t.name for t in threads] == ["MainThread", "pt_autograd_0"]
    assert annotate(text) == ['thread 4244 "MainThread": collective: waits in all_reduce '
                              '(torch/distributed/distributed_c10d.py:2195) called from train_step (train.py:88)']


def test_a_queue_wait_is_not_a_lock() -> None:
    lines = annotate((STACKS / "deadlock-two-threads.txt").read_text())
    assert [line.split(": ")[1] for line in lines] == ["queue-wait", "lock", "lock"]


def test_job_tree_and_usage_from_proc(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        tree = job_tree(os.getpid())
        assert tree[0].pid == os.getpid() and child.pid in [p.pid for p in tree]
        usage = TreeUsage()
        usage.measure(tree, time.monotonic())
        sum(range(2_000_000))
        second = usage.measure(job_tree(os.getpid()), time.monotonic())
        assert second["rss_mib"] > 1 and second["cpu_pct"] > 0
        assert "Thread" in proc_dump(child.pid)
    finally:
        child.kill()
        child.wait()
    assert job_tree(child.pid) == []


def test_gpufix_stacks_on_a_live_record(tmp_path: Path) -> None:
    record = tmp_path / "rec"
    record.mkdir()
    proc = start(SLEEPER, record / "output.log", tmp_path)
    try:
        (record / "meta.json").write_text(json.dumps({"job_pid": proc.pid}))
        done = run_gpufix("stacks", str(record), "--format", "json", timeout=60)
        assert done.returncode in (0, 1), done.stderr
        out = json.loads(done.stdout)
        assert out["pid"] == proc.pid and Path(out["dumps"][0]["path"]).is_file()
        if pyspy_path():
            assert "time.sleep" in Path(out["dumps"][0]["path"]).read_text() or "<module> (job.py:4)" in Path(out["dumps"][0]["path"]).read_text()
        assert proc.poll() is None  # dumping never disturbs the job
    finally:
        proc.kill()
        proc.wait()
    gone = run_gpufix("stacks", str(record))
    assert gone.returncode == 2 and b"not running" in gone.stderr

"""A hung multi-rank job: gpufix's probe dumps every rank's Python stacks (no py-spy needed) and the
watchdog names the rank that is not in the collective the others wait in, with its line (issue 13)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gpufix.watchdog.analyze import cross_rank, main_thread, parse_faulthandler
from gpufix.watchdog.stacks import pyspy_path
from tests.run.helpers import PY, env, records, torchrun_under_gpufix
from tests.run.test_launcher import free_port

IN_COLLECTIVE = '''# gpufix-probe stack dump 1 of pid 10 at 2026-12-01T20:02:20Z (request)
Thread 0x00007f2a1c5ff640 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f2a1e6b9740 (most recent call first):
  File "/env/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/env/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper
  File "/job/train.py", line 23 in main
  File "/job/train.py", line 28 in <module>
'''
ELSEWHERE = '''Thread 0x00007f2a1e6b9741 (most recent call first):
  File "/job/train.py", line 8 in wait_for_flag
  File "/job/train.py", line 21 in main
  File "/job/train.py", line 28 in <module>
'''

STUCK_JOB = '''import os, time
import torch
import torch.distributed as dist


def wait_for_flag(path):
    while not os.path.exists(path):
        time.sleep(0.1)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        loss = model(torch.randn(2, 4)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    if rank == 1:
        wait_for_flag("/nonexistent/flag")
    dist.all_reduce(torch.ones(1))


if __name__ == "__main__":
    main()
'''


def test_faulthandler_dumps_are_read_and_the_main_thread_found() -> None:
    threads = parse_faulthandler(IN_COLLECTIVE)
    assert len(threads) == 2 and threads[1].frames[0].func == "all_reduce"
    main = main_thread(threads)
    assert main is not None and main.frames[-1].func == "<module>"


def test_the_rank_outside_the_collective_is_named_with_its_line() -> None:
    assert cross_rank([(0, 10, IN_COLLECTIVE), (1, 11, ELSEWHERE)]) == [
        "rank 1 (pid 11) is not in a collective while rank 0 waits in all_reduce: it is at wait_for_flag (train.py:8)"]
    assert cross_rank([(0, 10, IN_COLLECTIVE), (1, 11, IN_COLLECTIVE)]) == []  # all wait: nobody to name
    assert cross_rank([(0, 10, ELSEWHERE), (1, 11, ELSEWHERE)]) == []  # nobody waits in a collective


@pytest.mark.parametrize("form", ["-- torchrun", "--nproc-per-node"])
def test_a_hung_torchrun_job_names_the_stuck_rank(tmp_path: Path, form: str) -> None:
    (tmp_path / "stuck.py").write_text(STUCK_JOB)
    if form == "-- torchrun":
        done, record = torchrun_under_gpufix(tmp_path, "stuck.py", "--hang-timeout", "6", "--on-hang", "kill")
    else:
        done = subprocess.run([PY, "-m", "gpufix", "run", "--record-dir", "runs", "--hang-timeout", "6", "--on-hang",
                               "kill", "--nproc-per-node", "2", "--master-port", free_port(), "stuck.py"],
                              cwd=tmp_path, capture_output=True, env=env(), timeout=180)
        (record,) = records(tmp_path / "runs")
    err = done.stderr.decode()
    assert done.returncode != 0
    assert "HNG007 Rank 1" in err and "wait_for_flag (stuck.py:8)" in err, err[-3000:]
    findings = json.loads((record / "result.json").read_text())["findings"]
    root = findings[0]
    assert root["code"] == "HNG007" and root["fields"]["stuck_rank"] == "1" and root["fields"]["waiting_ranks"] == "0"
    assert root["evidence"][0]["source"].endswith("-probe.txt")  # from the probe's own dumps, not py-spy's
    # gpufix's own kill made torchrun print a SignalException: that is how the run ended, not its cause
    assert all(f["consequence_of"] for f in findings[1:])
    # with the stacks, each rank's probe dumped its flight recorder (gloo writes one only when asked; NCCL's own
    # comes at its timeout): the sequence number of the collective rank 1 never reached
    assert sorted(p.name for p in (record / "flight").glob("rank_*")) == ["rank_0", "rank_1"]
    # py-spy's dumps name each process by the rank its launcher gave it, not by pid alone. (py-spy can fail to
    # attach on a loaded machine; the probe's dumps cover for it, and then there is no py-spy dump to check.)
    by_pyspy = [t for t in (p.read_text() for p in (record / "stacks").glob("*.txt") if not p.name.endswith("-probe.txt"))
                if "# tool: py-spy" in t and "all_reduce (" in t]
    if pyspy_path() and by_pyspy:
        waiting = next(f for f in findings if f["code"] == "HNG001")
        assert "(rank 0, local rank 0, node 0)" in waiting["message"], waiting["message"]
    flight = next(f for f in findings if f["code"] == "DST045")
    assert flight["consequence_of"] == "HNG007" and "rank(s) 1 never reached all_reduce #" in flight["message"]

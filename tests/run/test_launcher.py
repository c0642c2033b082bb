"""`gpufix run --nproc-per-node N [torchrun options] train.py`: PyTorch's own launcher, never one of gpufix's (issue 13)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpufix.runner import is_launcher_option, job_argv
from tests.run.helpers import PY, env, records

JOB = '''import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
print(f"rank {dist.get_rank()} of {dist.get_world_size()} sum {t.item():.0f}", flush=True)
dist.destroy_process_group()  # without it torch 2.13's gloo sometimes aborts at exit ("terminate called"), bare too
'''


@pytest.mark.parametrize("argv", [["--nproc-per-node", "2", "t.py"], ["--nproc_per_node=2", "t.py"],
                                  ["--nnodes", "1", "--nproc-per-node", "2", "t.py"], ["--standalone", "t.py"]])
def test_torchrun_options_first_run_the_launcher(argv: list[str]) -> None:
    assert is_launcher_option(argv[0])
    assert job_argv(argv, after_dashdash=False) == [sys.executable, "-m", "torch.distributed.run", *argv]


def test_only_torchruns_options_and_not_after_dashdash() -> None:
    assert job_argv(["--nproc-per-node", "2", "t.py"], after_dashdash=True) == ["--nproc-per-node", "2", "t.py"]
    assert not is_launcher_option("--lr") and not is_launcher_option("--nproc")


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


# (a port of its own: torchrun's default 29500 may be held by another job on a shared machine)
@pytest.mark.parametrize("options", [["--nproc-per-node", "2", "--master-port"], ["--nproc_per_node=2", "--standalone"]])
def test_gpufix_run_launches_ranks_through_torchrun(tmp_path: Path, options: list[str]) -> None:
    if options[-1] == "--master-port":
        options = [*options, free_port()]
    (tmp_path / "job.py").write_text(JOB)
    done = subprocess.run([PY, "-m", "gpufix", "run", "--record-dir", "runs", *options, "job.py"], cwd=tmp_path,
                          capture_output=True, env=env(), timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    out = done.stdout.decode()
    assert "rank 0 of 2 sum 2" in out and "rank 1 of 2 sum 2" in out
    (record,) = records(tmp_path / "runs")
    assert json.loads((record / "meta.json").read_text())["command"][1:4] == ["-m", "torch.distributed.run", options[0]]

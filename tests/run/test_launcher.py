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


def test_gpufix_options_among_torchruns_are_gpufixs() -> None:
    """Tried as a user: `gpufix run --nproc-per-node 2 --hang-timeout 10 --on-hang kill train.py` handed
    --hang-timeout to torchrun, which refused it (exit status 2). gpufix's options in the torchrun prefix are taken
    out for gpufix, on the fast path and click's; from the script on, and after `--`, everything is the job's."""
    from gpufix.cli.run import simple_args
    from gpufix.runner import hoist_own_options

    parsed = simple_args(["run", "--nproc-per-node", "2", "--hang-timeout", "10", "--on-hang=kill", "--standalone",
                          "train.py", "--hang-timeout", "3"])
    assert parsed is not None and parsed["hang_timeout"] == 10 and parsed["on_hang"] == "kill"
    assert parsed["command"] == ["--nproc-per-node", "2", "--standalone", "train.py", "--hang-timeout", "3"]
    kept = [["run", "--", "torchrun", "--nproc-per-node", "2", "--hang-timeout", "1", "t.py"],
            ["run", "t.py", "--nproc-per-node", "2", "--on-hang", "kill"], ["run", "--nproc-per-node", "2", "t.py"]]
    for argv in kept:
        assert hoist_own_options(argv) == argv
    assert hoist_own_options(["run", "-v", "--nproc-per-node=2", "--name", "x", "t.py"]) == [
        "run", "-v", "--name", "x", "--nproc-per-node=2", "t.py"]


def test_click_path_takes_gpufix_options_among_torchruns_too(tmp_path: Path) -> None:
    """The same through click: a bundled `-vv`, which the fast path leaves to click, sends the whole line there."""
    from gpufix.cli.run import simple_args

    argv = ["run", "--record-dir", "runs", "-vv", "--nproc-per-node", "2", "--master-port", free_port(),
            "--hang-timeout", "0", "--interval=0", "job.py"]
    assert simple_args(argv) is None  # click's
    (tmp_path / "job.py").write_text(JOB)
    done = subprocess.run([PY, "-m", "gpufix", *argv], cwd=tmp_path, capture_output=True, env=env(), timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert "rank 1 of 2 sum 2" in done.stdout.decode()
    (record,) = records(tmp_path / "runs")
    command = json.loads((record / "meta.json").read_text())["command"]
    assert "--hang-timeout" not in command and "--interval=0" not in command and "--nproc-per-node" in command

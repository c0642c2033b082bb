"""A straggler rank under gpufix: 2 gloo ranks training with DDP, one with a slower forward pass.

DDP's gradient all-reduce makes every rank's step as long as the slowest one's, so step times
cannot tell the straggler; the probe's forward time (no collective inside) does (issue 13).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from statistics import median

import pytest

from gpufix.probe.read import read_probe_series
from tests.run.helpers import PY, env, records
from tests.run.test_launcher import free_port

JOB = '''import os, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4))

    def forward(self, x):
        if rank == int(os.environ.get("SLOW_RANK", "-1")):
            time.sleep(0.02)  # this rank's device is slower (a throttled GPU, a busy host)
        return self.body(x)


model = DDP(Net())
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(TensorDataset(torch.randn(1024, 64), torch.randint(0, 4, (1024,))), batch_size=32)
for epoch in range(2):
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
if rank == 0:
    print("done", flush=True)
dist.destroy_process_group()
os._exit(0)  # torch 2.13's gloo sometimes aborts in interpreter shutdown ("terminate called ..."), bare too
'''


def run_job(tmp_path: Path, form: str, slow_rank: int | None) -> tuple[subprocess.CompletedProcess[bytes], Path]:
    (tmp_path / "job.py").write_text(JOB)
    launch = (["--nproc-per-node", "2", "--master-port", free_port()] if form == "--nproc-per-node" else
              ["--", PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"])
    job_env = {**env(), **({"SLOW_RANK": str(slow_rank)} if slow_rank is not None else {})}
    done = subprocess.run([PY, "-m", "gpufix", "run", "--record-dir", "runs", *launch, "job.py"], cwd=tmp_path,
                          capture_output=True, env=job_env, timeout=180)
    (record,) = records(tmp_path / "runs")
    return done, record


@pytest.mark.parametrize("form", ["--nproc-per-node", "-- torchrun"])
def test_the_slow_rank_is_named_although_every_step_time_is_the_same(tmp_path: Path, form: str) -> None:
    done, record = run_job(tmp_path, form, slow_rank=1)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert b"done" in done.stdout
    findings = json.loads((record / "result.json").read_text())["findings"]
    assert [f["code"] for f in findings] == ["PRF011"], findings
    assert findings[0]["fields"]["rank"] == "1" and float(findings[0]["fields"]["ratio"]) >= 3
    assert "Rank 1 takes" in done.stderr.decode()
    # what the rule stands on: the step times are alike, the forward times are not
    series = read_probe_series(record / "probe")
    step = {g: median([s.value for s in series["probe.step_time_s"] if s.group == g]) for g in ("0", "1")}
    compute = {g: median([s.value for s in series["probe.compute_s"] if s.group == g]) for g in ("0", "1")}
    assert 0.75 < step["0"] / step["1"] < 1.33, step
    assert compute["1"] > 3 * compute["0"], compute


def test_balanced_ranks_have_no_straggler(tmp_path: Path) -> None:
    done, record = run_job(tmp_path, "-- torchrun", slow_rank=None)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert json.loads((record / "result.json").read_text())["findings"] == []

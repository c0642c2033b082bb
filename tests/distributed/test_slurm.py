"""`srun gpufix run ...` simulated: two tasks of one Slurm step, each a `gpufix run` with srun's
environment, write their parts of one run record; explain, status and postmortem read the parts
as one run whose ranks are the tasks (issue 13)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.run.helpers import PY, env

TASK = '''import os, sys, time
rank = int(os.environ["SLURM_PROCID"])
print(f"task {rank} on {os.environ['SLURMD_NODENAME']} starts", flush=True)
time.sleep(0.5)
if rank == 1:
    raise ValueError("no shard for task 1")
print(f"task {rank} done", flush=True)
'''


def srun(tmp_path: Path, ntasks: int = 2) -> list[subprocess.CompletedProcess[bytes]]:
    """Start every task at once, as srun does, and wait for them all."""
    (tmp_path / "task.py").write_text(TASK)
    tasks = []
    for rank in range(ntasks):
        slurm = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_NTASKS": str(ntasks), "SLURM_PROCID": str(rank),
                 "SLURM_NODEID": str(rank), "SLURM_LOCALID": "0", "SLURMD_NODENAME": f"node-{rank}",
                 "SLURM_JOB_NAME": "pretrain"}
        tasks.append(subprocess.Popen([PY, "-m", "gpufix", "run", "--record-dir", "runs", PY, "task.py"], cwd=tmp_path,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(**slurm)))
    return [subprocess.CompletedProcess(t.args, t.wait(timeout=120), *t.communicate()) for t in tasks]


def gpufix_json(cwd: Path, *args: str) -> dict:  # type: ignore[type-arg]
    done = subprocess.run([PY, "-m", "gpufix", *args, "--format", "json"], cwd=cwd, capture_output=True, env=env(),
                          timeout=120)
    assert b"Traceback" not in done.stderr, done.stderr.decode()
    return json.loads(done.stdout)


def test_the_tasks_of_a_step_write_one_record_read_as_one_run(tmp_path: Path) -> None:
    done = srun(tmp_path)
    assert [d.returncode for d in done] == [0, 1]  # each task keeps its own exit status
    (group,) = (tmp_path / "runs").iterdir()
    assert group.name == "slurm-4242.0-task"
    assert json.loads((group / "group.json").read_text())["ntasks"] == 2
    assert sorted(p.name for p in group.iterdir()) == ["group.json", "task0", "task1"]
    for rank in (0, 1):
        meta = json.loads((group / f"task{rank}" / "meta.json").read_text())
        assert meta["slurm"]["procid"] == rank and meta["slurm"]["node"] == f"node-{rank}"
        assert f"task {rank} on node-{rank} starts" in (group / f"task{rank}" / "output.log").read_text()

    # explain: one diagnosis over both tasks, the failing task named as its rank
    doc = gpufix_json(tmp_path, "explain", str(group))
    root = doc["findings"][0]
    assert root["code"] == "GEN000" and root["ranks"] == [1], doc["findings"]
    assert root["evidence"][0]["source"].endswith("task1/output.log") and root["evidence"][0]["rank"] == 1

    # status: the step, and each task
    status = gpufix_json(tmp_path, "status", "--record-dir", "runs")
    assert status["run"]["state"] == "finished" and status["run"]["failed_tasks"] == [1], status["run"]
    assert [(t["rank"], t["run"]["exit_status"]) for t in status["tasks"]] == [(0, 0), (1, 1)]
    text = subprocess.run([PY, "-m", "gpufix", "status", str(group)], cwd=tmp_path, capture_output=True,
                          env=env()).stdout.decode()
    assert "slurm step 4242.0: 2 of 2 tasks, finished, failed: task 1" in text

    # postmortem: one run, failed, its first failing rank the task that raised
    report = gpufix_json(tmp_path, "postmortem", "--no-index", "runs")
    (run,) = report["runs"]
    assert run["id"] == "slurm-4242.0-task" and run["status"] == "failed", run
    assert run["root_cause"]["code"] == "GEN000" and run["first_failing"]["ranks"] == [1], run["first_failing"]


def test_a_step_of_one_task_is_an_ordinary_record(tmp_path: Path) -> None:
    (done,) = srun(tmp_path, ntasks=1)
    assert done.returncode == 0
    (record,) = (tmp_path / "runs").iterdir()
    assert (record / "meta.json").is_file() and not (record / "group.json").exists()


STRAGGLING_TASK = '''import os, time
import torch
from torch.utils.data import DataLoader, TensorDataset

slow = os.environ["SLURM_PROCID"] == "1"  # this task's node is slower
torch.manual_seed(0)
model = torch.nn.Linear(32, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for x, y in DataLoader(TensorDataset(torch.randn(640, 32), torch.randint(0, 4, (640,))), batch_size=32):
    if slow:
        time.sleep(0.02)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
'''


def test_each_tasks_measurements_stay_its_own(tmp_path: Path) -> None:
    # no RANK, no process group: each task's probe takes SLURM_PROCID as its rank, so the step's one diagnosis
    # compares the tasks' measurements and tells the slower task apart
    (tmp_path / "task.py").write_text(STRAGGLING_TASK)
    tasks = []
    for rank in range(2):
        slurm = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "3", "SLURM_NTASKS": "2", "SLURM_PROCID": str(rank),
                 "SLURMD_NODENAME": f"node-{rank}"}
        tasks.append(subprocess.Popen([PY, "-m", "gpufix", "run", "--record-dir", "runs", "task.py"], cwd=tmp_path,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(**slurm)))
    assert [t.wait(timeout=120) for t in tasks] == [0, 0]
    (group,) = (tmp_path / "runs").iterdir()
    doc = gpufix_json(tmp_path, "explain", str(group))
    assert [f["code"] for f in doc["findings"]] == ["PRF011"], doc["findings"]
    assert doc["findings"][0]["fields"]["rank"] == "1"


def test_every_nodes_gpu_0_stays_apart() -> None:
    from gpufix.diagnosis import _place_series
    from gpufix.evidence import Evidence
    from gpufix.series import Sample

    merged = Evidence()
    for rank, node in ((0, "node-0"), (1, "node-1")):
        part = Evidence()
        part.series["gpu.util_gpu_pct"] = [Sample(1.0, 90.0 if rank == 0 else 5.0, "0", "telemetry.jsonl", 1)]
        part.series["probe.step_time_s"] = [Sample(1.0, 0.1, str(rank), "probe-1.jsonl", 1)]
        _place_series(part, rank, node)
        merged.merge(part)
    assert sorted(s.group for s in merged.series["gpu.util_gpu_pct"]) == ["node-0:0", "node-1:0"]
    assert sorted(s.group for s in merged.series["probe.step_time_s"]) == ["0", "1"]  # ranks stay as the probe read them

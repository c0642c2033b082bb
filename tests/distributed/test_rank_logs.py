"""Each rank's output kept apart in the record (`ranks/rank<R>.log`), while the job's own output
stays what it is bare (issue 13): Python prints and tracebacks, C-level writes and a forked
child's lines all land in their rank's file; a rank's traceback still comes before torchrun's
report of its failure."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.run.helpers import PY, env, records
from tests.run.test_launcher import free_port

JOB = '''import os, sys, time
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"stdout of rank {rank}", flush=True)
sys.stderr.write(f"stderr of rank {rank}\\n")
os.write(2, f"C-level write of rank {rank}\\n".encode())  # as NCCL or c10 write, under Python
child = os.fork()
if child == 0:
    print(f"forked child of rank {rank}", flush=True)
    os._exit(0)
os.waitpid(child, 0)
dist.barrier()
if rank == 1:
    raise ValueError("rank 1 gives up")
time.sleep(5)
'''


def run(tmp_path: Path, *gpufix: str) -> tuple[subprocess.CompletedProcess[bytes], Path | None]:
    (tmp_path / "job.py").write_text(JOB)
    done = subprocess.run([PY, "-m", "gpufix", "run", *gpufix, "--nproc-per-node", "2", "--master-port", free_port(),
                           "job.py"], cwd=tmp_path, capture_output=True, env=env(), timeout=180)
    found = records(tmp_path / "runs") if (tmp_path / "runs").exists() else []
    return done, (found[0] if found else None)


def test_each_rank_has_its_own_log_and_the_output_is_as_bare(tmp_path: Path) -> None:
    done, record = run(tmp_path, "--record-dir", "runs")
    assert done.returncode == 1, done.stderr.decode()[-3000:]
    assert record is not None
    logs = {p.name: p.read_text() for p in (record / "ranks").glob("rank*.log")}
    assert sorted(logs) == ["rank0.log", "rank1.log"]
    for rank in (0, 1):
        own = logs[f"rank{rank}.log"]
        for line in (f"stdout of rank {rank}", f"stderr of rank {rank}", f"C-level write of rank {rank}",
                     f"forked child of rank {rank}"):
            assert own.count(line) == 1, (rank, line, own)
        assert f"of rank {1 - rank}" not in own
    assert "ValueError: rank 1 gives up" in logs["rank1.log"] and "Traceback" not in logs["rank0.log"]
    # the job's streams carry every line once, each on its own stream, as without gpufix
    out, err = done.stdout.decode(), done.stderr.decode()
    for rank in (0, 1):
        assert out.count(f"stdout of rank {rank}") == 1 and out.count(f"forked child of rank {rank}") == 1
        assert err.count(f"stderr of rank {rank}") == 1 and err.count(f"C-level write of rank {rank}") == 1
    # the rank's traceback reached the terminal before torchrun's report of the rank's failure
    assert err.index("ValueError: rank 1 gives up") < err.index("failed (exitcode: 1) local_rank: 1")

"""What gpufix's distributed defaults cost a healthy multi-process job, side by side in one run.

Two gloo ranks on the CPU, started by PyTorch's own launcher:

    bare     python -m torch.distributed.run --standalone --nproc-per-node 2 JOB
    gpufix   gpufix run --record-dir TMP --nproc-per-node 2 --standalone JOB
             (the probe in every rank with its forward-time events, PyTorch's flight recorder on,
             each rank's output through its relay into ranks/rank<R>.log, telemetry, the watchdog)

Jobs: `train` (DDP training steps, little output) and `print` (each rank prints many lines: the
relays' cost). Variants run interleaved, round by round (the machine is shared and noisy); the
report is each variant's median wall time and the ratio gpufix/bare with the spread of the
per-round ratios. Ratios carry over between machines, absolute times do not.

    python benchmarks/distributed_overhead.py [--rounds 5] [--steps 300] [--lines 100000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAIN = '''import os, sys
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(TensorDataset(torch.randn(STEPS * 32, 64), torch.randint(0, 8, (STEPS * 32,))), batch_size=32)
for x, y in loader:
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
dist.destroy_process_group()
os._exit(0)  # torch 2.13's gloo sometimes aborts in interpreter shutdown
'''
PRINT = '''import os, sys
rank = os.environ["RANK"]
out = sys.stdout
for i in range(LINES):
    out.write(f"rank {rank} line {i} " + "x" * 60 + "\\n")
out.flush()
'''

ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(argv: list[str], cwd: str) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed with exit status {done.returncode}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lines", type=int, default=100000)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="gpufix-dist-bench-")
    try:
        Path(work, "train.py").write_text(TRAIN.replace("STEPS", str(args.steps)))
        Path(work, "print.py").write_text(PRINT.replace("LINES", str(args.lines)))
        records = os.path.join(work, "runs")
        for job in ("train", "print"):
            bare = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", f"{job}.py"]
            under = [sys.executable, "-m", "gpufix", "run", "--record-dir", records, "--nproc-per-node", "2",
                     "--standalone", f"{job}.py"]
            timed(bare, work)  # warm the bytecode caches of both
            timed(under, work)
            times: dict[str, list[float]] = {"bare": [], "gpufix": []}
            for _ in range(args.rounds):
                times["bare"].append(timed(bare, work))
                times["gpufix"].append(timed(under, work))
                shutil.rmtree(records, ignore_errors=True)
            b, g = statistics.median(times["bare"]), statistics.median(times["gpufix"])
            ratios = sorted(t / s for s, t in zip(times["bare"], times["gpufix"]))
            what = f"{args.steps} DDP steps" if job == "train" else f"{args.lines} lines per rank"
            print(f"{job:6} ({what}): bare {b:6.2f} s  gpufix {g:6.2f} s  ratio {g / b:5.3f}"
                  f"  (per round {ratios[0]:.3f}-{ratios[-1]:.3f}, {args.rounds} rounds)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

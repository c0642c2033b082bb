"""What the in-process probe costs a training step, measured side by side with the bare job.

A real CPU training script (a small MLP fed by a DataLoader, fixed number of steps, one thread)
runs with the probe (PYTHONPATH=gpufix/probe/inject, GPUFIX_PROBE_DIR set: what `gpufix run`
does) and without it (what `--no-probe` does), in interleaved rounds; each run times its own
steps (after a short warm-up, so Python and torch start-up are not counted: the probe does
nothing during them but wait for `import torch`). Reported: the median per-step wall time and
CPU time of each side and their ratio, probe/bare (and the ratio of the best runs, less
sensitive to a busy machine). Target: <= 1.02. On a shared machine the side-by-side ratio
moves by a few percent from run to run, so the time spent inside the probe's own hooks is also
measured directly (the hooks timed from within the probed run).

Steps of ~2 ms are a harsh case: the probe's cost per step is fixed (a few microseconds per step,
plus one JSON line per step for the first 100 steps, then one per second), so longer steps (any
GPU model) pay proportionally less.

    python benchmarks/probe_overhead.py [--rounds 7] [--steps 800]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INJECT = ROOT / "gpufix" / "probe" / "inject"

TRAIN = r"""
import json, sys, time
import torch
from torch.utils.data import DataLoader, TensorDataset

steps, warmup = int(sys.argv[1]), 20
torch.manual_seed(0)
torch.set_num_threads(1)
x = torch.randn(steps * 64, 128)
y = torch.randint(0, 10, (steps * 64,))
loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)
model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                            torch.nn.ReLU(), torch.nn.Linear(256, 10))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
loss_fn = torch.nn.CrossEntropyLoss()
inside = [0.0]
probe = getattr(sys.modules.get("_gpufix_probe.probe"), "PROBE", None)
if probe is not None:  # time spent inside the probe's per-batch and per-step work
    def timed(function):
        def run(*args):
            start = time.perf_counter()
            try:
                return function(*args)
            finally:
                inside[0] += time.perf_counter() - start
        return run
    probe.steps.on_batch = timed(probe.steps.on_batch)
    probe.steps.on_optimizer_step = timed(probe.steps.on_optimizer_step)
for i, (xb, yb) in enumerate(loader):
    if i == warmup:
        wall, cpu = time.perf_counter(), time.process_time()
        inside[0] = 0.0
    loss = loss_fn(model(xb), yb)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
n = steps - warmup
print(json.dumps({"wall_s": (time.perf_counter() - wall) / n, "cpu_s": (time.process_time() - cpu) / n,
                  "inside_s": inside[0] / n, "loss": loss.item()}))
"""


def run(script: Path, steps: int, probe_dir: str | None) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("GPUFIX_PROBE_DIR", "PYTHONPATH")}
    env["PYTHONWARNINGS"] = "ignore"
    if probe_dir is not None:
        env["PYTHONPATH"] = str(INJECT)
        env["GPUFIX_PROBE_DIR"] = probe_dir
    out = subprocess.run([sys.executable, str(script), str(steps)], capture_output=True, text=True, env=env,
                         check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=800)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpufix-probe-bench-") as tmp:
        script = Path(tmp) / "train_mlp.py"
        script.write_text(TRAIN)
        bare: list[dict[str, float]] = []
        probed: list[dict[str, float]] = []
        for round_no in range(args.rounds):
            order = [False, True] if round_no % 2 == 0 else [True, False]
            for with_probe in order:
                probe_dir = os.path.join(tmp, f"probe-{round_no}") if with_probe else None
                result = run(script, args.steps, probe_dir)
                (probed if with_probe else bare).append(result)
            if probed[-1]["loss"] != bare[-1]["loss"]:
                print(f"results differ: {probed[-1]['loss']!r} with the probe, {bare[-1]['loss']!r} without")
                return 1
        records = sum(1 for _ in open(next(Path(tmp, "probe-0").glob("probe-*.jsonl"))))
    print(f"{args.rounds} interleaved rounds of {args.steps} steps (small MLP on the CPU, DataLoader, AdamW)")
    for key, label in (("wall_s", "wall"), ("cpu_s", "CPU")):
        b = statistics.median(r[key] for r in bare)
        p = statistics.median(r[key] for r in probed)
        b_min, p_min = min(r[key] for r in bare), min(r[key] for r in probed)
        print(f"  per-step {label:4} time: median bare {b * 1e3:.3f} ms, probe {p * 1e3:.3f} ms, ratio {p / b:.4f}"
              f"  (best of each: ratio {p_min / b_min:.4f})")
    inside = statistics.median(r["inside_s"] for r in probed)
    bare_wall = statistics.median(r["wall_s"] for r in bare)
    print(f"  time inside the probe's step and batch hooks: {inside * 1e6:.1f} us per step, "
          f"{inside / bare_wall:.2%} of a bare step (the part of the ratio that is the probe's own work)")
    print(f"  probe file: {records} records; final loss identical in every round")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The collective health check's worker, one process per GPU (or 2 CPU processes with gloo), under torchrun.

Run by gpufix's allreduce-check as `python -m torch.distributed.run --nproc-per-node N collective_job.py
TIMEOUT_S SIZES OUT`: every rank does all_reduce and all_gather of growing sizes, checks the results,
and rank 0 writes the timings as JSON to OUT (bus bandwidth as nccl-tests reports it). Standard
library and torch only: it runs in the job's Python, which need not have gpufix.
"""

import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

ITERATIONS = 5
WARMUP = 2


def main():
    timeout_s, sizes, out = float(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")], sys.argv[3]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    gpu = torch.cuda.is_available() and torch.cuda.device_count() > local
    backend = "nccl" if gpu else "gloo"
    device = torch.device("cuda", local) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    started = time.perf_counter()
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    init_s = time.perf_counter() - started
    rows = []
    for op in ("all_reduce", "all_gather"):
        for size in sizes:
            rows.append(measure(op, size, rank, world, device, gpu))
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"backend": backend, "world_size": world, "init_s": round(init_s, 3),
                       "device": str(device) if gpu else "cpu", "results": rows}, f)
    dist.barrier()
    dist.destroy_process_group()


def sync(gpu):
    if gpu:
        torch.cuda.synchronize()


def measure(op, size, rank, world, device, gpu):
    count = max(1, size // 4)
    if op == "all_reduce":
        tensor = torch.full((count,), float(rank + 1), device=device)
        expected = world * (world + 1) / 2.0

        def once():
            tensor.fill_(float(rank + 1))
            dist.all_reduce(tensor)
    else:
        count = max(1, count // world)
        tensor = torch.full((count,), float(rank), device=device)
        gathered = [torch.empty_like(tensor) for _ in range(world)]

        def once():
            dist.all_gather(gathered, tensor)
    for _ in range(WARMUP):
        once()
    sync(gpu)
    dist.barrier()
    started = time.perf_counter()
    for _ in range(ITERATIONS):
        once()
    sync(gpu)
    seconds = (time.perf_counter() - started) / ITERATIONS
    if op == "all_reduce":
        correct = bool(torch.allclose(tensor, torch.full_like(tensor, expected)))
        factor = 2.0 * (world - 1) / world
    else:
        correct = all(bool(torch.all(g == float(r))) for r, g in enumerate(gathered))
        factor = (world - 1) / float(world)
    total = count * 4 * (1 if op == "all_reduce" else world)
    algbw = total / seconds / 1e9
    return {"op": op, "bytes": total, "time_us": round(seconds * 1e6, 1), "algbw_gbps": round(algbw, 3),
            "busbw_gbps": round(algbw * factor, 3), "correct": correct}


if __name__ == "__main__":
    main()

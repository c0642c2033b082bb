"""Two gloo ranks that issue different collectives at the same step: rank 0 all_reduce, rank 1 broadcast.

MISMATCH (environment): "broadcast" (default) or "all_gather" (rank 1 all_gathers a tensor of another shape).
PG_TIMEOUT (environment): the process group's timeout in seconds (default: torch's, 30 minutes for gloo)."""
import datetime
import os

import torch
import torch.distributed as dist


def main():
    timeout = os.environ.get("PG_TIMEOUT")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(timeout)) if timeout else None)
    rank = dist.get_rank()
    t = torch.ones(4)
    for step in range(3):
        dist.all_reduce(t)
    print(f"rank {rank} warmed up", flush=True)
    if rank == 0:
        dist.all_reduce(torch.ones(1024))
    elif os.environ.get("MISMATCH", "broadcast") == "broadcast":
        dist.broadcast(torch.ones(1024), src=1)
    else:
        out = [torch.zeros(7) for _ in range(dist.get_world_size())]
        dist.all_gather(out, torch.ones(7))
    print(f"rank {rank} passed the mismatched step", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""A short, healthy DDP training loop on 2 gloo ranks (CPU).

FAIL_RANK / FAIL_STEP (environment): that rank raises ValueError at that step, before its forward pass, while
the others go on into the step's collectives (DDP's gradient all_reduce in backward) and wait for it there."""
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 30


def load_batch(rank, step):
    if rank == int(os.environ.get("FAIL_RANK", "-1")) and step == int(os.environ.get("FAIL_STEP", "-1")):
        raise ValueError(f"shard {rank} has no batch {step}: the label file is empty")
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(16, 8, generator=g)
    return x, x.sum(dim=1, keepdim=True)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(STEPS):
        x, y = load_batch(rank, step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        if step % 10 == 0 or step == STEPS - 1:
            print(f"rank {rank} step {step} loss {mean.item() / dist.get_world_size():.4f}", flush=True)
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()
    # torch 2.13's gloo aborts now and then in interpreter teardown, after destroy_process_group, bare too
    # ("terminate called without an active exception", exit -6, about one run in ten): leave without it
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

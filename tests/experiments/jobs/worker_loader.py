"""A DataLoader whose workers die, two ways:

--kill-item N   the dataset SIGKILLs the process that loads item N (as a buggy helper or a watchdog would): a worker
                killed with plenty of host memory left, not the out-of-memory killer's doing (2 workers)
--cache-mib M   the dataset keeps every item it loads (M MiB each, touched): each worker's cache grows until the host,
                or the cgroup the test runs it in, runs out of memory and the out-of-memory killer takes a worker
                (4 workers)
--sample-mib M  each item is a tensor of M MiB, handed to the training process through shared memory (/dev/shm):
                a small /dev/shm (a container's) runs out while the workers prefetch (2 workers, batches of 4)
"""
import argparse
import os
import signal
import time

import torch
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--kill-item", type=int, default=-1)
parser.add_argument("--cache-mib", type=int, default=0)
parser.add_argument("--sample-mib", type=int, default=0)
args = parser.parse_args()


class Items(Dataset):
    def __init__(self) -> None:
        self.cache: list[bytearray] = []

    def __len__(self) -> int:
        return 2000

    def __getitem__(self, i: int):
        if i == args.kill_item:
            os.kill(os.getpid(), signal.SIGKILL)
        if args.cache_mib:
            block = bytearray(args.cache_mib << 20)
            for offset in range(0, len(block), 4096):  # touched, so it is resident
                block[offset] = 1
            self.cache.append(block)
        time.sleep(0.005 if args.cache_mib else 0.002)
        if args.sample_mib:
            return torch.randn(args.sample_mib << 18), torch.tensor(i % 3)  # the model reads its first 16 values
        return torch.randn(16), torch.tensor(i % 3)


model = torch.nn.Linear(16, 3)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(Items(), batch_size=4 if args.cache_mib else 8, num_workers=4 if args.cache_mib else 2)
for step, (x, y) in enumerate(loader):
    loss = torch.nn.functional.cross_entropy(model(x[:, :16]), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 10 == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)
print("done")

"""A loader whose dataset caches every item it loads (16 MiB each, touched): each worker's cache grows until the
host, or the cgroup the test runs it in, runs out of memory and the out-of-memory killer takes a worker."""
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Cached(Dataset):
    def __init__(self) -> None:
        self.cache: list[bytearray] = []

    def __len__(self) -> int:
        return 2000

    def __getitem__(self, i: int):
        block = bytearray(16 << 20)
        for offset in range(0, len(block), 4096):  # touched, so it is resident
            block[offset] = 1
        self.cache.append(block)
        time.sleep(0.005)
        return torch.randn(16), torch.tensor(i % 3)


model = torch.nn.Linear(16, 3)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step, (x, y) in enumerate(DataLoader(Cached(), batch_size=4, num_workers=4)):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 10 == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)
print("done")

"""A loader whose dataset SIGKILLs the process that loads item 137 (as a buggy helper or a watchdog would):
a worker killed with plenty of host memory left, which is not the out-of-memory killer's doing."""
import os
import signal
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Items(Dataset):
    def __len__(self) -> int:
        return 400

    def __getitem__(self, i: int):
        if i == 137:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.002)
        return torch.randn(16), torch.tensor(i % 3)


model = torch.nn.Linear(16, 3)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step, (x, y) in enumerate(DataLoader(Items(), batch_size=8, num_workers=2)):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 10 == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)

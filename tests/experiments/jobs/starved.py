"""A job starved by its loader: each sample takes 3 ms to 'read' and num_workers=0 (in-memory, so CPU cost is nil)."""
import time

import torch
from torch.utils.data import DataLoader, Dataset


class SlowDataset(Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        time.sleep(0.003)
        return torch.randn(16), i % 4


if __name__ == "__main__":
    # one intra-op thread: a tiny step, and on a busy 2-core CI box spinning worker threads would slow the step
    # (and shrink the loader-bound ratio the test measures) for reasons that have nothing to do with the loader
    torch.set_num_threads(1)
    loader = DataLoader(SlowDataset(), batch_size=8, num_workers=0)
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, (x, y) in enumerate(loader):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == 200:
            break
    print("done")

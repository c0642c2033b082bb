"""CUDA in use, faked on a CPU-only torch, with timing events whose GPU time is known: each
forward pass takes 7 ms of "GPU time", and the events of a step complete only one step later
(a GPU that runs behind the host), so the probe must read them late and never wait."""

import torch
from torch.utils.data import DataLoader, TensorDataset

clock = {"step": 0}


class FakeEvent:
    def __init__(self, enable_timing=False):
        assert enable_timing
        self.step = None

    def record(self, stream=None):
        self.step = clock["step"]

    def query(self):
        return clock["step"] > self.step  # done once the host has moved on a step

    def elapsed_time(self, end):
        assert self.query() and end.query(), "read before completion: that would synchronise"
        return 7.0


cuda = torch.cuda
cuda.is_initialized = lambda: True
cuda.is_available = lambda: True
cuda.current_device = lambda: 0
cuda.memory_allocated = lambda device=None: 0
cuda.memory_reserved = lambda device=None: 0
cuda.max_memory_allocated = lambda device=None: 0
cuda.Event = FakeEvent

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(48, 4), torch.randn(48, 1)), batch_size=4)
for x, y in loader:
    loss = (model(x) - y).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    clock["step"] += 1
print("done")

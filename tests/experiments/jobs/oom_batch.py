"""A training job whose batches above LIMIT samples 'run out of GPU memory' (the allocator's own text).

It trains on the CPU; the memory limit is simulated so the batch-size search has an exact answer. Every two
steps it saves a checkpoint next to itself, which an experiment must never write.
"""
import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

LIMIT = int(os.environ.get("SIM_MEMORY_LIMIT_SAMPLES", "37"))
HANG_AFTER = int(os.environ.get("SIM_HANG_AFTER_STEPS", "0"))  # > 0: stops making progress there (a hang)
batch_size = int(sys.argv[1]) if len(sys.argv) > 1 else 64
data = TensorDataset(torch.randn(512, 16), torch.randint(0, 4, (512,)))
loader = DataLoader(data, batch_size=batch_size, shuffle=True)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step = 0
for epoch in range(3):
    for x, y in loader:
        if x.shape[0] > LIMIT:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {x.shape[0] * 64} MiB (GPU 0; 15.77 GiB total capacity; "
                "14.20 GiB already allocated; 201.19 MiB free; 14.50 GiB reserved in total by PyTorch)")
        if HANG_AFTER and step == HANG_AFTER:
            import time
            time.sleep(3600)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if step % 2 == 0:
            os.makedirs("ckpt", exist_ok=True)
            torch.save(model.state_dict(), os.path.join("ckpt", "model.pt"))
print("done")

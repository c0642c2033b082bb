"""Batches cut by hand from a tensor (no DataLoader), the batch size from --bs: the search changes the flag."""
import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--bs", type=int, default=64)
parser.add_argument("--steps", type=int, default=30)
args = parser.parse_args()
LIMIT = 37
data, labels = torch.randn(1024, 16), torch.randint(0, 4, (1024,))
model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(args.steps):
    x = data[step * args.bs % 512:][:args.bs]
    y = labels[step * args.bs % 512:][:args.bs]
    if x.shape[0] > LIMIT:
        raise RuntimeError(f"CUDA out of memory. Tried to allocate {x.shape[0]} MiB (GPU 0; 7.79 GiB total capacity)")
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()

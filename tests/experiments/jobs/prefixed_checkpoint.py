"""Loads a checkpoint saved from a DataParallel-wrapped model ('module.' keys) into the bare model."""
import os

import torch

model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
if not os.path.exists("dp_checkpoint.pt"):
    torch.save({f"module.{k}": v for k, v in model.state_dict().items()}, "dp_checkpoint.pt")
model.load_state_dict(torch.load("dp_checkpoint.pt"))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    loss = model(torch.randn(3, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("trained")

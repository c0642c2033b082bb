"""Three training steps, a background thread that dies, then a chained failure: KeyError ->
(while handling) ValueError -> (raised from) RuntimeError. Prints which sitecustomize Python
ended up with."""

import sys
import threading

import torch
from torch.utils.data import DataLoader, TensorDataset

print("sitecustomize:", getattr(sys.modules.get("sitecustomize"), "MARK", None))
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in DataLoader(TensorDataset(torch.randn(12, 4), torch.randn(12, 1)), batch_size=4):
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"final loss {loss.item()!r}")


def prefetch_shard():
    raise OSError("shard 3 unreadable")


worker = threading.Thread(target=prefetch_shard, name="prefetch")
worker.start()
worker.join()


def read_config(config):
    try:
        return config["lr"]
    except KeyError:
        raise ValueError("config has no learning rate")


def load_checkpoint(path):
    try:
        read_config({})
    except ValueError as exc:
        raise RuntimeError(f"cannot resume from {path}") from exc


load_checkpoint("ckpt.pt")

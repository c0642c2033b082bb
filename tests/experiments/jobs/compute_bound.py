"""A job whose step dominates (a large matmul) behind an in-memory loader, printing Lightning's generic
'does not have many workers' warning: the loader advice is wrong for it and the benchmark must say so."""
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

sys.stderr.write("UserWarning: The dataloader, train_dataloader, does not have many workers which may be a bottleneck. "
                 "Consider increasing the value of the `num_workers` argument` (try 2 which is the number of cpus on "
                 "this machine) in the `DataLoader` init to improve performance.\n")
torch.set_num_threads(1)
loader = DataLoader(TensorDataset(torch.randn(4096, 512), torch.randint(0, 4, (4096,))), batch_size=64)
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048),
                            torch.nn.ReLU(), torch.nn.Linear(2048, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step, (x, y) in enumerate(loader):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step == 40:
        break
sys.exit(1)  # the nightly wrapper fails the run on a warning it greps for

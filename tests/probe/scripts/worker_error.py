"""A Dataset whose __getitem__ raises KeyError for one item, read by two DataLoader workers: the
main process re-raises it as "Caught KeyError in DataLoader worker process 1"."""

import torch
from torch.utils.data import DataLoader, Dataset


class Records(Dataset):
    def __init__(self):
        self.rows = {i: torch.full((4,), float(i)) for i in range(16) if i != 5}

    def __len__(self):
        return 16

    def __getitem__(self, index):
        return self.rows[index]  # KeyError for index 5


torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for batch in DataLoader(Records(), batch_size=4, num_workers=2):
    loss = model(batch).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

"""Each sample is 64 small tensors, which DataLoader workers hand over as one open file descriptor each (the default
file_descriptor sharing): under a low open-file limit the training process runs out of descriptors."""
import torch
from torch.utils.data import DataLoader, Dataset


class Many(Dataset):
    def __len__(self) -> int:
        return 2000

    def __getitem__(self, i: int):
        return [torch.full((4,), float(i)) for _ in range(64)], torch.tensor(i % 2)


model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step, (parts, y) in enumerate(DataLoader(Many(), batch_size=None, num_workers=2)):
    x = torch.stack(parts).mean(0, keepdim=True)
    loss = torch.nn.functional.cross_entropy(model(x), y.view(1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 100 == 0:
        print("step", step, "loss", round(loss.item(), 4), flush=True)
print("done")

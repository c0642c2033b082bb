"""An ordinary error on a CPU-only run: a label out of range raised by the CPU loss itself."""
import torch

model = torch.nn.Linear(8, 10)
x, y = torch.randn(4, 8), torch.tensor([1, 3, 10, 2])
loss = torch.nn.functional.cross_entropy(model(x), y)

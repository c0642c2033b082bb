"""The training loop of HF Accelerate / Trainer, reduced to what the probe sees:

- the optimizer is wrapped (like accelerate's AcceleratedOptimizer: an Optimizer subclass that
  does not run Optimizer.__init__ and whose step() calls the wrapped optimizer's step());
- the DataLoader is a subclass whose __iter__ fetches one batch ahead (like DataLoaderShard) and
  moves each batch "to the device";
- gradient accumulation over 2 batches: one optimizer step per 2 batches.

With GPUFIX_PROBE_DIR set it also asks for a stack dump the way gpufix would (the trigger file)
and waits inside `wait_for_stack_dump` until the dump is written.
"""

import os
import time

import torch
from torch.utils.data import DataLoader, TensorDataset


class WrappedOptimizer(torch.optim.Optimizer):
    def __init__(self, optimizer):
        self.optimizer = optimizer  # no Optimizer.__init__, as in accelerate

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        self.optimizer.step(closure)


class PrefetchingLoader(DataLoader):
    def __iter__(self):
        iterator = super().__iter__()
        try:
            current = next(iterator)
        except StopIteration:
            return
        for following in iterator:
            yield [t.to("cpu") for t in current]
            current = following
        yield [t.to("cpu") for t in current]


def wait_for_stack_dump(directory):
    with open(os.path.join(directory, "dump-stacks"), "w"):
        pass
    deadline = time.time() + 10
    while time.time() < deadline and not any(n.startswith("stacks-") for n in os.listdir(directory)):
        time.sleep(0.05)
    time.sleep(0.2)


torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
optimizer = WrappedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-2))
loader = PrefetchingLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=4)
ACCUMULATE = 2
for index, (x, y) in enumerate(loader):
    loss = torch.nn.functional.mse_loss(model(x), y) / ACCUMULATE
    loss.backward()
    if (index + 1) % ACCUMULATE == 0:
        optimizer.step()
        optimizer.zero_grad()
    if index == 3 and os.environ.get("GPUFIX_PROBE_DIR"):
        wait_for_stack_dump(os.environ["GPUFIX_PROBE_DIR"])
print(f"final loss {loss.item()!r}")

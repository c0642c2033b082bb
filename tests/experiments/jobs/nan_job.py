"""A loss that becomes NaN at step 4: the square root of a value that turns negative (whatever the
initial weights: the job's NaN must come back in every re-run)."""
import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(12):
    x = torch.ones(8, 4)
    sign = 1.0 if step < 4 else -1.0
    loss = torch.sqrt(sign * (model(x).mean().abs() + 2.0))
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}", flush=True)

"""GradScaler's less common paths, for the probe's skip detection and loss-scale following.

The deprecated `torch.cpu.amp.GradScaler` alias (a subclass of torch.amp's), a growth every 3 clean
updates, skips forced with an inf gradient, unscale_() before step(), a second optimizer that
overflows alone (the main one steps; the scale still halves), update(new_scale), load_state_dict,
unscale_() with no step() at all (the main optimizer is not stepped that iteration), and a misuse
torch rejects (step() twice). Prints, as JSON, what the script itself sees at each iteration: the
loss scale the step ran at, whether the main optimizer stepped (its weights moved), and at the end the
final scale, and whether the deprecated aliases (torch.cuda.amp's, torch.cpu.amp's) inherit
GradScaler's methods (so wrapping torch.amp's wraps theirs).
"""

import json
import warnings

import torch
import torch.cpu.amp
import torch.cuda.amp

warnings.simplefilter("ignore", FutureWarning)  # torch.cpu.amp.GradScaler is deprecated
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Linear(8, 1)
head = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
head_optimizer = torch.optim.SGD(head.parameters(), lr=0.01)
scaler = torch.cpu.amp.GradScaler(init_scale=1024.0, growth_interval=3)
OVERFLOW = {2, 3, 9, 17, 25}  # the main optimizer's gradients get an inf
HEAD_OVERFLOW = {12}  # only the second optimizer's: the main one steps, the scale halves
seen = []
saved = None
for iteration in range(1, 31):
    x = torch.randn(4, 8)
    loss = model(x).pow(2).mean() + head(x).pow(2).mean()
    optimizer.zero_grad()
    head_optimizer.zero_grad()
    scaler.scale(loss).backward()
    if iteration in OVERFLOW:
        model.weight.grad[0, 0] = float("inf")
    if iteration in HEAD_OVERFLOW:
        head.weight.grad[0, 0] = float("nan")
    scale = scaler.get_scale()
    weights = model.weight.detach().clone()
    if iteration == 6:
        scaler.unscale_(optimizer)  # e.g. to clip gradients, then step
    if iteration == 27:
        scaler.unscale_(optimizer)  # checked, then not stepped at all this iteration
    else:
        scaler.step(optimizer)
    if iteration == 20:
        try:
            scaler.step(optimizer)
        except RuntimeError:
            pass
    scaler.step(head_optimizer)
    if iteration == 15:
        scaler.update(new_scale=256.0)
    else:
        scaler.update()
    if iteration == 10:
        saved = scaler.state_dict()
    if iteration == 24:
        scaler.load_state_dict(saved)
    seen.append({"iteration": iteration, "scale": scale, "stepped_main": iteration != 27,
                 "skipped": iteration != 27 and torch.equal(weights, model.weight)})
print(json.dumps(seen))
aliases = (torch.cuda.amp.GradScaler, torch.cpu.amp.GradScaler)
print(json.dumps({"final_scale": scaler.get_scale(), "aliases_inherit": all(
    getattr(alias, name) is getattr(torch.amp.GradScaler, name) for alias in aliases
    for name in ("step", "update", "load_state_dict"))}))

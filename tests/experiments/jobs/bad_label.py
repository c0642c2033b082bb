"""A label out of range. With a GPU the kernel's assert fires asynchronously (simulated here with its text when
CUDA is 'visible', i.e. CUDA_VISIBLE_DEVICES unset); with CUDA hidden it runs on the CPU, where the same label
raises a readable error at the line."""
import os
import sys

import torch

gpu = "CUDA_VISIBLE_DEVICES" not in os.environ
model = torch.nn.Linear(8, 5)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    x = torch.randn(4, 8)
    y = torch.tensor([1, 2, 3, 7 if step == 2 else 4])  # label 7 for 5 classes
    if gpu and step == 2:
        sys.stderr.write("../aten/src/ATen/native/cuda/Loss.cu:240: nll_loss_forward_reduce_cuda_kernel_2d: block: [0,0,0], "
                         "thread: [3,0,0] Assertion `t >= 0 && t < n_classes` failed.\n")
        raise RuntimeError("CUDA error: device-side assert triggered\nCUDA kernel errors might be asynchronously reported "
                           "at some other API call, so the stacktrace below might be incorrect.\nFor debugging consider "
                           "passing CUDA_LAUNCH_BLOCKING=1")
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()

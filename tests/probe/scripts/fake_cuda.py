"""CUDA in use, faked on a CPU-only torch: the probe's CUDA readings come from these stand-ins.
Five steps with growing "allocated" memory, then a CUDA out-of-memory error, printed by an
excepthook the job installed after the probe (as rich.traceback.install() would): the probe
records the exception at exit instead."""

import sys

import torch

state = {"allocated": 0}
MIB = 1024 * 1024


def dump_snapshot(path):
    with open(path, "wb") as handle:
        handle.write(b"fake snapshot")


torch.version.cuda = "12.4"  # a CUDA build, as far as the probe can tell
cuda = torch.cuda
cuda.is_initialized = lambda: True
cuda.is_available = lambda: True
cuda.device_count = lambda: 1
cuda.current_device = lambda: 0
cuda.get_device_name = lambda device=None: "Fake GPU"
cuda.memory_allocated = lambda device=None: state["allocated"]
cuda.memory_reserved = lambda device=None: state["allocated"] + 512 * MIB
cuda.max_memory_allocated = lambda device=None: state["allocated"]
cuda.memory._dump_snapshot = dump_snapshot

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    state["allocated"] += 100 * MIB
    loss = model(torch.randn(8, 4)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
sys.excepthook = lambda *exc_info: sys.__excepthook__(*exc_info)
raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 8.00 GiB")

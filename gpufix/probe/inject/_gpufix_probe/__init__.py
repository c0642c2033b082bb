"""gpufix's in-process probe: runs inside the training job's interpreter.

Standard library and torch only (the job's interpreter may not have gpufix's dependencies),
Python 3.8+ syntax. Nothing happens unless GPUFIX_PROBE_DIR is set, and nothing but an import
watcher until the job itself imports torch. Every hook is wrapped: a failure is recorded once
in the probe file and the probe turns itself off; the job never sees it.

    watch.py     notices `import torch` (a sys.meta_path finder; torch is never imported here)
    output.py    the probe file: one JSON object per line, one write() each, bounded in size
    probe.py     the Probe: installs the hooks, facts at start and end
    steps.py     optimizer steps and DataLoader batches: step time, data wait, placement
    amp.py       AMP's GradScaler: steps it skipped (inf/NaN gradients), the loss scale
    finite.py    the first non-finite loss or gradient, checked without a GPU synchronisation
    errors.py    uncaught exceptions (main, threads, DataLoader workers) as structured data
    cudamem.py   CUDA memory per step, OOM snapshots, memory history
    faults.py    faulthandler into the probe folder, stack dumps on request (a trigger file)
    knobs.py     an experiment's settings (GPUFIX_EXPERIMENT): stop after N steps, DataLoader
                 overrides, cached batches, autocast, anomaly detection, redirected writes
    writes.py    the redirected writes: torch.save and the libraries' checkpoint writers
    ranklog.py   a launcher's rank: its stdout and stderr also kept in <record>/ranks/rank<R>.log
"""

import os
import sys

ENV_DIR = "GPUFIX_PROBE_DIR"
ENV_MEMORY_HISTORY = "GPUFIX_MEMORY_HISTORY"

_activated = False


def activate():
    """Arm the probe: wait for torch to be imported (idempotent; a no-op without GPUFIX_PROBE_DIR)."""
    global _activated
    directory = os.environ.get(ENV_DIR)
    if _activated or not directory:
        return
    _activated = True
    try:  # a launcher's rank: its own output apart, from the first byte (before the job's code)
        from _gpufix_probe import ranklog

        ranklog.start(directory)
    except Exception:
        pass
    from _gpufix_probe import watch

    watch.when_imported("torch", _torch_imported)


def _torch_imported(torch, import_s):
    try:
        from _gpufix_probe import probe

        probe.install(torch, os.environ.get(ENV_DIR, ""), import_s)
    except Exception:
        pass


def stand_in(wrapper, real):
    """Make `wrapper` pass for the method it replaces (name, docstring, `__wrapped__`): help(),
    tracebacks and introspection of the job see the real one's identity."""
    wrapper.__qualname__ = getattr(real, "__qualname__", wrapper.__qualname__)
    wrapper.__doc__ = getattr(real, "__doc__", None)
    wrapper.__wrapped__ = real
    return wrapper


def own_file(filename):
    """True for a file of this package: its frames are removed from tracebacks the job prints."""
    return filename.startswith(_HERE)


_HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep
del sys

"""Confirming experiments: built-in, named, bounded in time. Rules refer to them by name only.

Each experiment is an object in one of the modules below (a subclass of base.Experiment): a name,
a description, a time budget, parameters, `plan` and `run` (base.py says what they promise).
The registry is built from those modules, so a new experiment is one class added to a module's
`EXPERIMENTS` list; `gpufix rules check` accepts exactly these names, `gpufix confirm` runs them.

    base.py        verdicts, Plan/Skip/Result, the Context an experiment runs in
    trial.py       one re-run of the user's command through `gpufix run`, with probe knobs
    memory.py      batch-size-search, mixed-precision-rerun, memory-snapshot
    loader.py      loader-benchmark, loader-sweep, loader-memory, loader-sharing, loader-shm
    kernel.py      cpu-rerun, cuda-launch-blocking-rerun, anomaly-detection-rerun
    stack.py       cuda-smoke-test, placement-check, gpu-health-check, driver-check
    collective.py  allreduce-check, nccl-debug-rerun, single-gpu-rerun
    checkpoint.py  state-dict-key-diff
    profile.py     profile-steps, deterministic-rerun
    confirm.py     plan the experiments a record's findings call for, run them, write the results
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpufix.experiments.base import Experiment

_MODULES = ("memory", "loader", "kernel", "stack", "collective", "checkpoint", "profile")
_registry: dict[str, Experiment] = {}


def registry() -> dict[str, Experiment]:
    """Every built-in experiment by name, in module order."""
    if not _registry:
        for module in _MODULES:
            for experiment in importlib.import_module(f"gpufix.experiments.{module}").EXPERIMENTS:
                _registry[experiment.name] = experiment
    return _registry


def __getattr__(name: str) -> dict[str, str]:
    # EXPERIMENTS (name -> description), for rule validation and `gpufix rules show`, built on first use
    if name == "EXPERIMENTS":
        return {key: experiment.description for key, experiment in registry().items()}
    raise AttributeError(name)

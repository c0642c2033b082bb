"""Supervising a job transparently: spawn, pty, relay, signal forwarding, reaping, clean-up.

    supervise.supervisor   Supervisor(argv, sink, on_started).run() -> JobResult
    supervise.spawn        the child side: environment, fds, process group, death signal, 127/126
    supervise.relay        byte-exact pass-through of stdout/stderr
    supervise.signals      forwarding and the signal self-pipe
    supervise.terminal     pty, window size, terminal foreground
    supervise.hooks        Sampler protocol for telemetry/watchdogs that run beside the job

The names below are loaded on first use: `gpufix run` imports `supervise.supervisor` before the
job starts and must not pay for `hooks` (dataclasses, typing) unless a sampler is plugged in.
"""

from __future__ import annotations

import sys

__all__ = ["JobResult", "NullSampler", "RunningJob", "Sampler", "Supervisor", "original_environ"]

_WHERE = {
    "JobResult": "supervisor", "Supervisor": "supervisor",
    "NullSampler": "hooks", "RunningJob": "hooks", "Sampler": "hooks",
    "original_environ": "spawn",
}


def __getattr__(name: str) -> object:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    qualified = f"{__name__}.{module}"
    __import__(qualified)
    value = getattr(sys.modules[qualified], name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

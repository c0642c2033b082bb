"""Supervising a job transparently: spawn, pty, relay, signal forwarding, reaping, clean-up.

    supervise.supervisor   Supervisor(argv, sink, on_started).run() -> JobResult
    supervise.spawn        the child side: environment, fds, process group, death signal, 127/126
    supervise.relay        byte-exact pass-through of stdout/stderr
    supervise.signals      forwarding and the signal self-pipe
    supervise.terminal     pty, window size, terminal foreground
    supervise.hooks        Sampler protocol for telemetry/watchdogs that run beside the job
"""

from __future__ import annotations

from gpufix.supervise.hooks import NullSampler, RunningJob, Sampler
from gpufix.supervise.spawn import original_environ
from gpufix.supervise.supervisor import JobResult, Supervisor

__all__ = ["JobResult", "NullSampler", "RunningJob", "Sampler", "Supervisor", "original_environ"]

"""Hang detection: the job's process tree from /proc, stack dumps (py-spy, else /proc), gpufix's
reading of them, the watchdog that fires on silence, and `JobMonitor`, which runs telemetry and
the watchdog for `gpufix run` (`make_run_sampler`) and `gpufix attach`.

    watchdog.proctree   processes of the job, their state, CPU and memory
    watchdog.stacks     dump_tree(): one file per process under stacks/
    watchdog.analyze    what each thread waits for (lock, collective, loader) -> `# gpufix-hang:` lines
    watchdog.watchdog   HangWatchdog, HangReport (handed to a callback), diagnose_dumps()
    watchdog.monitor    JobMonitor, make_run_sampler()
"""

from __future__ import annotations

from typing import Any

__all__ = ["JobMonitor", "make_run_sampler"]


def __getattr__(name: str) -> Any:
    # Lazy: telemetry.sampler imports watchdog.proctree, and monitor imports telemetry.sampler.
    if name in __all__:
        from gpufix.watchdog import monitor

        return getattr(monitor, name)
    raise AttributeError(name)

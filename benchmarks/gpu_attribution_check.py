"""On a GPU machine: does gpufix find a CUDA job's GPU both ways - by PID in NVML's process list and
by the /dev/nvidiaN files the job holds open (the container fallback) - and is NVML's Xid event
set available? Prints one line per fact and exits 1 if a check fails.

    python benchmarks/gpu_attribution_check.py
"""

from __future__ import annotations

import subprocess
import sys
import time

JOB = """
import time, torch
x = torch.ones(256, 1024, 1024, device="cuda")  # 1 GiB: visible in NVML's process list
print("ready", flush=True)
time.sleep(20)
"""


def main() -> int:
    from gpufix.telemetry.nvml import NvmlTelemetrySource
    from gpufix.watchdog.proctree import gpu_device_minors

    source = NvmlTelemetrySource()
    note = source.open()
    if note:
        print(f"SKIP {note}")
        return 0
    identities = source.identities()
    print("gpus:", [g.to_dict() for g in identities])
    print("xid event set:", "registered" if source._events is not None else "not available", source.problems())
    job = subprocess.Popen([sys.executable, "-c", JOB], stdout=subprocess.PIPE, text=True)
    failed = 0
    try:
        assert job.stdout is not None
        if job.stdout.readline().strip() != "ready":
            print("FAIL the CUDA job did not start")
            return 1
        time.sleep(1.0)
        users = [u for u in source.processes() if u.pid == job.pid]
        by_pid = sorted({u.gpu for u in users})
        minors = {g.minor: g.gpu for g in identities if g.minor is not None}
        opened = sorted(minors[m] for m in gpu_device_minors([job.pid]) if m in minors)
        print(f"{'OK  ' if by_pid else 'FAIL'} by pid: GPUs {by_pid} ({users})")
        print(f"{'OK  ' if opened and set(by_pid) <= set(opened) else 'FAIL'} by device files: GPUs {opened} "
              f"(minors {sorted(gpu_device_minors([job.pid]))})")
        failed = not by_pid or not opened or not set(by_pid) <= set(opened)
    finally:
        job.kill()
        job.wait()
        source.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

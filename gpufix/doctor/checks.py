"""The doctor checklist: every check, in report order, as one pure function of the collected facts.

The checks themselves live by subject in `checks_gpu`, `checks_env` and `checks_python`; each is a
pure function from facts (a `GpuInventory`, `HostFacts`, `InterpreterReport`s) to a `CheckResult`.
"""

from __future__ import annotations

from gpufix.doctor import checks_env, checks_gpu, checks_python
from gpufix.doctor.facts import HostFacts
from gpufix.doctor.model import CheckResult
from gpufix.doctor.interpreter import InterpreterReport
from gpufix.telemetry import GpuInventory

CHECK_IDS = (
    "driver", "gpus", "cuda-visible-devices", "container", "processes", "persistence", "ecc", "memory-health",
    "throttle", "temperature", "pcie", "xid", "python", "torch", "cuda-compat", "arch", "cudnn", "nccl",
    "tensorflow", "jax", "shm", "cpu", "disk", "smoke",
)


def run_checks(inv: GpuInventory, host: HostFacts, probe: InterpreterReport, smoke: InterpreterReport | None,
               smoke_skipped: str | None = None) -> tuple[CheckResult, ...]:
    """All checks, in `CHECK_IDS` order."""
    results = [
        checks_gpu.check_driver(inv, host),
        checks_gpu.check_gpus(inv),
        checks_env.check_cuda_visible_devices(host, inv),
        checks_env.check_container(host, inv),
        checks_gpu.check_processes(inv),
        checks_gpu.check_persistence(inv),
        checks_gpu.check_ecc(inv),
        checks_gpu.check_memory_health(inv),
        checks_gpu.check_throttle(inv),
        checks_gpu.check_temperature(inv),
        checks_gpu.check_pcie(inv),
        checks_gpu.check_xid(host.kernel_log),
        checks_python.check_python(probe),
        checks_python.check_torch(probe, inv),
        checks_python.check_cuda_compat(probe, inv),
        checks_python.check_arch(probe, inv),
        *checks_python.check_cudnn_nccl(probe, inv),
        checks_python.check_tensorflow(probe, inv),
        checks_python.check_jax(probe, inv),
        checks_env.check_shm(host),
        checks_env.check_cpu(host),
        checks_env.check_disk(host),
        checks_python.check_smoke(smoke, smoke_skipped),
    ]
    assert tuple(r.id for r in results) == CHECK_IDS
    return tuple(results)


def smoke_skip_reason(quick: bool, probe: InterpreterReport) -> str | None:
    """Why the smoke test will not run, or None when it should."""
    if quick:
        return "skipped (--quick)"
    torch = probe.section("torch") or {}
    if not torch.get("installed") or torch.get("import_error"):
        return "no importable torch in the target interpreter"
    if not torch.get("cuda_available"):
        return "no CUDA: torch.cuda.is_available() is False"
    return None

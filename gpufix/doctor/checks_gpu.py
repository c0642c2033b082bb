"""Checks on the driver and each GPU: pure functions from a `GpuInventory` (and kernel log) to results."""

from __future__ import annotations

from gpufix.doctor.facts import HostFacts, KernelLog
from gpufix.doctor.model import FAIL, PASS, WARN, CheckResult, check, skipped
from gpufix.telemetry import GpuInfo, GpuInventory

NO_NVML = "no NVML (see the driver check)"

# Xids that mean the GPU or its memory is unhealthy (not an application bug): fail.
CRITICAL_XIDS = {
    48: "double-bit ECC error", 62: "internal micro-controller halt", 64: "ECC page retirement / row remap failure",
    74: "NVLink error", 79: "GPU has fallen off the bus", 92: "high single-bit ECC error rate",
    94: "contained ECC error", 95: "uncontained ECC error", 119: "GSP RPC timeout", 120: "GSP error",
    140: "unrecovered ECC error",
}
BAD_THROTTLE = ("hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown")
PROCESS_FAIL_FRACTION = 0.5


def _driver_fix(kind: str | None, container: str | None) -> str:
    if kind == "driver_not_loaded":
        return ("Load the kernel module: `sudo modprobe nvidia` (or reboot). If that fails, `sudo dmesg | grep -i nvidia`"
                " shows why (Secure Boot blocking an unsigned module is common).")
    if kind == "driver_library_mismatch":
        return "The driver was upgraded but the old kernel module is still loaded: reboot (or unload and reload `nvidia`)."
    if kind == "no_permission":
        return "Your user cannot open /dev/nvidia*: check `ls -l /dev/nvidia*` and add yourself to the owning group."
    if kind == "pynvml_missing":
        return "`pip install nvidia-ml-py` into gpufix's environment."
    if container:
        return ("Start the container with the GPUs and driver mounted: `docker run --gpus all ...` (needs the NVIDIA "
                "Container Toolkit on the host); on Kubernetes request `nvidia.com/gpu` in the pod's resources.")
    return ("Install the NVIDIA driver (Ubuntu: `sudo ubuntu-drivers install`; others: https://www.nvidia.com/Download/index.aspx),"
            " reboot, and check with `nvidia-smi`. On a machine without an NVIDIA GPU, run on a GPU node instead.")


def check_driver(inv: GpuInventory, host: HostFacts) -> CheckResult:
    title = "NVIDIA driver (NVML)"
    if not inv.available:
        return check("driver", title, FAIL, [f"NVML could not be loaded: {inv.error}"],
                     _driver_fix(inv.error_kind, host.container), error_kind=inv.error_kind)
    cuda = inv.cuda_driver_version_str or "unknown"
    evidence = [f"driver {inv.driver_version or 'unknown'}, supports CUDA up to {cuda}"]
    if not inv.gpus:
        return check("driver", title, FAIL, evidence + ["the driver answers but reports no GPU"],
                     "Check `nvidia-smi` and `lspci | grep -i nvidia`; the GPU may have fallen off the bus (see Xid).")
    return check("driver", title, PASS, evidence, driver_version=inv.driver_version, cuda_driver_version=cuda)


def _gpu_line(g: GpuInfo) -> str:
    mem = f"{g.memory_total_mib} MiB" if g.memory_total_mib is not None else "memory unknown"
    cc = f"compute capability {g.compute_capability[0]}.{g.compute_capability[1]} ({g.sm})" if g.compute_capability else "compute capability unknown"
    return f"{g.label}: {mem}, {cc}" + (f", {g.pci_bus_id}" if g.pci_bus_id else "")


def check_gpus(inv: GpuInventory) -> CheckResult:
    title = "GPUs"
    if not inv.available:
        return skipped("gpus", title, NO_NVML)
    if not inv.gpus:
        return check("gpus", title, FAIL, ["no GPU"], "Check `nvidia-smi`; see the Xid check.")
    return check("gpus", title, PASS, [_gpu_line(g) for g in inv.gpus], count=len(inv.gpus))


def check_persistence(inv: GpuInventory) -> CheckResult:
    title = "Persistence mode"
    known = [g for g in inv.gpus if g.persistence_mode is not None]
    if not inv.available or not known:
        return skipped("persistence", title, NO_NVML if not inv.available else "not reported by this driver")
    off = [g for g in known if not g.persistence_mode]
    evidence = [f"{g.label}: persistence {'on' if g.persistence_mode else 'off'}" for g in known]
    if off:
        ids = ",".join(str(g.index) for g in off)
        return check("persistence", title, WARN, evidence,
                     f"`sudo nvidia-smi -i {ids} -pm 1` (or enable the nvidia-persistenced service): without it every"
                     " run pays driver start-up and GPU state is lost between jobs.")
    return check("persistence", title, PASS, evidence)


def check_ecc(inv: GpuInventory) -> CheckResult:
    title = "ECC mode and uncorrectable errors"
    known = [g for g in inv.gpus if g.ecc_mode_current is not None]
    if not inv.available or not known:
        return skipped("ecc", title, NO_NVML if not inv.available else "ECC not supported on these GPUs")
    status, evidence, fix = PASS, [], None
    for g in known:
        line = f"{g.label}: ECC {'on' if g.ecc_mode_current else 'off'}"
        if g.ecc_uncorrected_volatile is not None:
            line += f", {g.ecc_uncorrected_volatile} uncorrectable error(s) since driver load"
        evidence.append(line)
        if g.ecc_uncorrected_volatile:
            status = FAIL
            fix = (f"Uncorrectable memory errors: drain this GPU, inspect `nvidia-smi -q -d ECC -i {g.index}`, reset it"
                   f" (`sudo nvidia-smi -r -i {g.index}`) or reboot; if errors return, the GPU needs service/RMA.")
        elif g.ecc_mode_pending is not None and g.ecc_mode_pending != g.ecc_mode_current:
            evidence.append(f"{g.label}: ECC change to {'on' if g.ecc_mode_pending else 'off'} pending")
            if status == PASS:
                status, fix = WARN, f"Reboot or reset the GPU (`sudo nvidia-smi -r -i {g.index}`) to apply the pending ECC mode."
    return check("ecc", title, status, evidence, fix)


def check_memory_health(inv: GpuInventory) -> CheckResult:
    """Row remapping (Ampere and later) or page retirement (older GPUs)."""
    title = "Retired pages / remapped rows"
    if not inv.available:
        return skipped("memory-health", title, NO_NVML)
    status, evidence, fix = PASS, [], None
    for g in inv.gpus:
        if g.remapped_rows_failure is not None:
            evidence.append(f"{g.label}: remapped rows {g.remapped_rows_correctable} correctable, "
                            f"{g.remapped_rows_uncorrectable} uncorrectable, pending={g.remapped_rows_pending}, "
                            f"failure={g.remapped_rows_failure}")
            if g.remapped_rows_failure:
                status = FAIL
                fix = f"Row remapping failed on GPU{g.index}: take it out of service and ask for an RMA (`nvidia-smi -q -d ROW_REMAPPER`)."
            elif g.remapped_rows_pending and status != FAIL:
                status, fix = WARN, f"A row remap is pending: reset the GPU (`sudo nvidia-smi -r -i {g.index}`) or reboot to apply it."
        elif g.retired_pages_sbe is not None or g.retired_pages_dbe is not None:
            total = (g.retired_pages_sbe or 0) + (g.retired_pages_dbe or 0)
            evidence.append(f"{g.label}: retired pages {g.retired_pages_sbe} single-bit, {g.retired_pages_dbe} double-bit,"
                            f" pending={g.retired_pages_pending}")
            if (g.retired_pages_pending or total >= 60) and status != FAIL:
                status = WARN
                fix = (f"Reboot or reset GPU{g.index} (`sudo nvidia-smi -r -i {g.index}`) to retire pending pages;"
                       " 60 or more retired pages is NVIDIA's RMA threshold.")
    if not evidence:
        return skipped("memory-health", title, "neither row remapping nor page retirement is reported by these GPUs")
    return check("memory-health", title, status, evidence, fix)


def check_throttle(inv: GpuInventory) -> CheckResult:
    title = "Clock throttle reasons"
    known = [g for g in inv.gpus if g.throttle_reasons is not None]
    if not inv.available or not known:
        return skipped("throttle", title, NO_NVML if not inv.available else "not reported by this driver")
    evidence, bad = [], []
    for g in known:
        evidence.append(f"{g.label}: {', '.join(g.throttle_reasons) or 'none'}")
        bad += [f"GPU{g.index} {r}" for r in g.throttle_reasons if r in BAD_THROTTLE]
    if bad:
        return check("throttle", title, WARN, evidence,
                     "The GPU is slowing itself down (heat or power): check airflow, fans and power cables;"
                     " `nvidia-smi -q -d PERFORMANCE` shows the reasons, `nvidia-smi -q -d TEMPERATURE,POWER` the limits.",
                     throttled=bad)
    return check("throttle", title, PASS, evidence)


def check_temperature(inv: GpuInventory) -> CheckResult:
    title = "Temperature"
    known = [g for g in inv.gpus if g.temperature_c is not None]
    if not inv.available or not known:
        return skipped("temperature", title, NO_NVML if not inv.available else "not reported by this driver")
    status, evidence = PASS, []
    for g in known:
        limit = g.temperature_slowdown_c
        evidence.append(f"{g.label}: {g.temperature_c} C" + (f" (slowdown at {limit} C)" if limit else ""))
        if g.temperature_c >= (limit or 95):
            status = FAIL
        elif g.temperature_c >= (limit - 10 if limit else 85) and status == PASS:
            status = WARN
    fix = None if status == PASS else (
        "The GPU is hot before training starts: check fans, airflow and the room; `nvidia-smi -q -d TEMPERATURE` shows the limits.")
    return check("temperature", title, status, evidence, fix)


def check_pcie(inv: GpuInventory) -> CheckResult:
    title = "PCIe link"
    known = [g for g in inv.gpus if g.pcie_width is not None or g.pcie_gen is not None]
    if not inv.available or not known:
        return skipped("pcie", title, NO_NVML if not inv.available else "not reported by this driver")
    status, evidence, degraded = PASS, [], []
    for g in known:
        line = f"{g.label}: Gen{g.pcie_gen} of Gen{g.pcie_gen_max}, x{g.pcie_width} of x{g.pcie_width_max}"
        idle = "gpu_idle" in (g.throttle_reasons or ())
        if g.pcie_width is not None and g.pcie_width_max and g.pcie_width < g.pcie_width_max:
            degraded.append(f"GPU{g.index} width x{g.pcie_width} < x{g.pcie_width_max}")
        if g.pcie_gen is not None and g.pcie_gen_max and g.pcie_gen < g.pcie_gen_max:
            if idle:
                line += " (idle: the link trains down to save power; normal)"
            else:
                degraded.append(f"GPU{g.index} Gen{g.pcie_gen} < Gen{g.pcie_gen_max}")
        evidence.append(line)
    if degraded:
        status = WARN
        evidence.append("degraded: " + "; ".join(degraded))
    fix = None if status == PASS else (
        "A degraded link slows host-device copies: reseat the card or riser, check the slot and BIOS PCIe settings;"
        " re-check under load with `nvidia-smi --query-gpu=index,pcie.link.gen.current,pcie.link.gen.max,"
        "pcie.link.width.current,pcie.link.width.max --format=csv`.")
    return check("pcie", title, status, evidence, fix, degraded=degraded)


def check_xid(log: KernelLog) -> CheckResult:
    title = "Xid errors in the kernel log"
    if not log.readable:
        return skipped("xid", title, f"kernel log not readable ({log.reason}); try `sudo dmesg | grep -i xid`")
    if not log.xids:
        return check("xid", title, PASS, [f"no Xid in {log.source}"])
    codes = sorted({x.code for x in log.xids})
    critical = [c for c in codes if c in CRITICAL_XIDS]
    evidence = [f"{len(log.xids)} Xid line(s) in {log.source}, codes {', '.join(map(str, codes))}"]
    evidence += [x.line for x in log.xids[-5:]]
    if critical:
        names = "; ".join(f"{c}: {CRITICAL_XIDS[c]}" for c in critical)
        return check("xid", title, FAIL, evidence,
                     f"Hardware-level Xid ({names}): drain the node, reset the GPU or reboot, and report it to the admins;"
                     " repeated Xid 79/48/94/95 usually means service/RMA.", codes=codes)
    return check("xid", title, WARN, evidence,
                 "These Xids are usually raised by a program (bad memory access, killed kernel): look up each code in"
                 " NVIDIA's Xid catalogue and match the pid to the job that ran then.", codes=codes)


def check_processes(inv: GpuInventory) -> CheckResult:
    title = "Processes already using GPU memory"
    if not inv.available:
        return skipped("processes", title, NO_NVML)
    if all(g.processes is None for g in inv.gpus):
        return skipped("processes", title, "process list not reported by this driver")
    status, evidence, holders = PASS, [], []
    for g in inv.gpus:
        procs = g.processes or ()
        held = sum(p.used_mib or 0 for p in procs)
        for p in procs:
            used = f"{p.used_mib} MiB" if p.used_mib is not None else "an unknown amount"
            evidence.append(f"{g.label}: pid {p.pid} ({p.name or 'unknown'}) holds {used}")
            holders.append({"gpu": g.index, "pid": p.pid, "name": p.name, "used_mib": p.used_mib})
        if procs:
            status = WARN if status == PASS else status
            if g.memory_total_mib and held >= PROCESS_FAIL_FRACTION * g.memory_total_mib:
                status = FAIL
        elif g.memory_used_mib is not None and g.memory_total_mib and g.memory_used_mib > max(1024, g.memory_total_mib // 20):
            evidence.append(f"{g.label}: {g.memory_used_mib} MiB in use but no process visible (another container or PID namespace?)")
            status = WARN if status == PASS else status
    if status == PASS:
        return check("processes", title, PASS, ["no process holds GPU memory"])
    pids = " ".join(str(h["pid"]) for h in holders) or "<pid>"
    fix = (f"See who they are: `nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv`"
           f" and `ps -o user,etime,cmd -p {pids.replace(' ', ',')}`. A stale job of yours: `kill {pids}`"
           " (then `kill -9`). Someone else's: pick a free GPU with `CUDA_VISIBLE_DEVICES=<index>`.")
    return check("processes", title, status, evidence, fix, holders=holders)

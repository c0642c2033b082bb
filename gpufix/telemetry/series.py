"""A recorded `telemetry.jsonl` as the measured series rules judge (gpufix/series.py).

Each GPU field becomes `gpu.<field>` grouped by GPU index, with derived series a rule needs:
`gpu.memory_used_frac` (used / total), `gpu.pcie_gen_frac` and `gpu.pcie_width_frac` (current /
maximum link) and 0/1 flags for throttling (`gpu.throttle_thermal`,
`gpu.throttle_power`, `gpu.throttle_hw_slowdown`). The job tree's `host` lines become
`host.cpu_pct` and `host.rss_mib`. Every sample points back at its line in the file, so a
finding can quote it. Xid events become kernel-style lines (`NVRM: Xid (PCI:...): 79, ...`) for
the hardware rules, which otherwise see Xids only where the kernel log is readable - seldom in a
container.
"""

from __future__ import annotations

from typing import NamedTuple

from gpufix.record.reader import RecordTelemetry
from gpufix.series import Sample

_GPU_FIELDS = ("util_gpu_pct", "util_mem_pct", "memory_used_mib", "memory_total_mib", "power_w", "power_limit_w",
               "temperature_c", "sm_clock_mhz", "pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max",
               "ecc_uncorrected")
# NVML clock-event reason names (gpufix.telemetry.inventory.throttle_names) by what they mean.
_THROTTLE_FLAGS = {
    "gpu.throttle_thermal": ("sw_thermal_slowdown", "hw_thermal_slowdown"),
    "gpu.throttle_power": ("sw_power_cap", "hw_power_brake_slowdown"),
    "gpu.throttle_hw_slowdown": ("hw_slowdown",),
}


class TelemetryEvidence(NamedTuple):
    """What a `telemetry.jsonl` offers the rules: series, the job's GPUs, and the Xid events as
    kernel-style lines (`(line in the file, text)`) for the rules that read the kernel log."""

    series: dict[str, list[Sample]]
    job_gpus: frozenset[int] | None  # None: the record does not say which GPUs were the job's
    xid_lines: list[tuple[int, str]]


def telemetry_series(path: str, source: str | None = None) -> dict[str, list[Sample]]:
    """Series by name from one telemetry.jsonl (missing values are skipped, not zeros)."""
    return telemetry_evidence(path, source).series


def telemetry_evidence(telemetry: str | RecordTelemetry, source: str | None = None) -> TelemetryEvidence:
    """One pass over a telemetry.jsonl (a path, or as a record's reader read it), of the job's
    GPUs only where its process lines show which they were (gpufix.record.reader.RecordTelemetry):
    another user's idling, throttling or Xids on a shared node are not this job's."""
    if isinstance(telemetry, str):
        telemetry = RecordTelemetry.read(telemetry)
    out: dict[str, list[Sample]] = {}
    label = source or telemetry.path
    pci: dict[int, tuple[str, str]] = {}  # GPU index -> (PCI bus id, name)
    xids: list[tuple[int, float, int | None, int]] = []

    def add(name: str, t: float, value: float, group: str | None, line: int) -> None:
        out.setdefault(name, []).append(Sample(t, float(value), group, label, line))

    for line, t, obj, kind in telemetry.job_lines:
        if kind == "xid":
            xids.append((line, t, obj.get("gpu") if isinstance(obj.get("gpu"), int) else None, obj["xid"]))
        elif kind == "gpus":
            for g in obj["gpus"]:
                if isinstance(g, dict) and isinstance(g.get("gpu"), int) and isinstance(g.get("pci_bus_id"), str):
                    pci[g["gpu"]] = (g["pci_bus_id"], str(g.get("name") or ""))
        elif kind == "sample":
            group = str(obj["gpu"])
            for field in _GPU_FIELDS:
                value = obj.get(field)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    add(f"gpu.{field}", t, value, group, line)
            for part, whole, name in (("memory_used_mib", "memory_total_mib", "gpu.memory_used_frac"),
                                      ("pcie_gen", "pcie_gen_max", "gpu.pcie_gen_frac"),
                                      ("pcie_width", "pcie_width_max", "gpu.pcie_width_frac")):
                value, limit = obj.get(part), obj.get(whole)
                if isinstance(value, (int, float)) and isinstance(limit, (int, float)) and limit > 0:
                    add(name, t, value / limit, group, line)
            reasons = obj.get("throttle_reasons")
            if isinstance(reasons, list):
                for name, flags in _THROTTLE_FLAGS.items():
                    add(name, t, 1.0 if any(r in flags for r in reasons) else 0.0, group, line)
        elif kind == "host":
            for field in ("cpu_pct", "rss_mib"):
                value = obj["host"].get(field)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    add(f"host.{field}", t, value, None, line)
    lines = [(line, _xid_line(gpu, xid, pci.get(gpu) if gpu is not None else None, t)) for line, t, gpu, xid in xids]
    return TelemetryEvidence(out, telemetry.job_gpus, [(n, text) for n, text in lines if text])


def _xid_line(gpu: int | None, xid: int, where: tuple[str, str] | None, t: float) -> str | None:
    """An NVML Xid event in the kernel log's words, so one set of rules reads both; None when
    the GPU's PCI address is unknown (the kernel names GPUs by it, and so do the rules)."""
    if where is None:
        return None
    import time

    moment = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
    name = f" {where[1]}" if where[1] else ""
    return f"NVRM: Xid (PCI:{where[0]}): {xid}, GPU {gpu}{name}: Xid event from NVML at {moment}, while the job ran"

"""A recorded `telemetry.jsonl` as the measured series rules judge (gpufix/series.py).

What each line gives comes from the catalogue (gpufix/signals.py): each GPU field the sampler
reads from NVML becomes its series (`power_w` -> `gpu.power_w`), grouped by GPU index, with
the derived series a rule needs: ratios of a field to its limit (`gpu.memory_used_frac`,
`gpu.pcie_gen_frac`, `gpu.pcie_width_frac`) and 0/1 flags for throttling (`gpu.throttle_thermal`,
`gpu.throttle_power`, `gpu.throttle_hw_slowdown`) from the clock-event reasons. The job tree's
`host` lines become `host.cpu_pct` and `host.rss_mib`. Every sample points back at its line in
the file, so a finding can quote it. Xid events become kernel-style lines (`NVRM: Xid
(PCI:...): 79, ...`) for the hardware rules, which otherwise see Xids only where the kernel log
is readable - seldom in a container.
"""

from __future__ import annotations

from typing import NamedTuple

from gpufix.record.reader import RecordTelemetry
from gpufix.series import Sample
from gpufix.signals import DERIVED, GPU, HOST, NVML, SIGNALS

# From the catalogue: (field, series) read from GPU sample lines; (field, limit field, series)
# derived as field / limit; (list field, entries, series) 0/1 flags; (field, series) of host lines.
_GPU_FIELDS = tuple((s.field, s.name) for s in SIGNALS if s.source == NVML)
_RATIOS = tuple((s.field, s.limit, s.name) for s in SIGNALS if s.source == DERIVED and s.per == GPU and s.limit)
_FLAGS = tuple((s.field, s.match, s.name) for s in SIGNALS if s.source == DERIVED and s.per == GPU and s.match)
_HOST_FIELDS = tuple((s.field, s.name) for s in SIGNALS if s.source == HOST)


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
            for field, name in _GPU_FIELDS:
                value = obj.get(field)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    add(name, t, value, group, line)
            for part, whole, name in _RATIOS:
                value, limit = obj.get(part), obj.get(whole)
                if isinstance(value, (int, float)) and isinstance(limit, (int, float)) and limit > 0:
                    add(name, t, value / limit, group, line)
            for field, flags, name in _FLAGS:
                reasons = obj.get(field)
                if isinstance(reasons, list):
                    add(name, t, 1.0 if any(r in flags for r in reasons) else 0.0, group, line)
        elif kind == "host":
            for field, name in _HOST_FIELDS:
                value = obj["host"].get(field)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    add(name, t, value, None, line)
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

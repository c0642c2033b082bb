"""The GPU inventory snapshot: frozen dataclasses with units in their names, and the source protocol.

Every field that a driver may not report is `None` ("unknown / unsupported"), never a guess.
`to_dict()` / `from_dict()` round-trip through JSON: the fake source and `gpufix doctor
--format json` both use that shape (documented in docs/doctor.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Protocol, runtime_checkable

# Clock event ("throttle") reason bits, as in nvml.h (nvmlClocksEventReason*). Kept here as plain
# data so that decoding a mask needs no NVML import.
THROTTLE_REASON_BITS: dict[int, str] = {
    0x001: "gpu_idle",
    0x002: "applications_clocks_setting",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal_slowdown",
    0x040: "hw_thermal_slowdown",
    0x080: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def throttle_names(mask: int | None) -> tuple[str, ...] | None:
    """Decode an NVML clock-event mask into reason names (unknown bits as hex)."""
    if mask is None:
        return None
    names = [name for bit, name in THROTTLE_REASON_BITS.items() if mask & bit]
    rest = mask & ~sum(THROTTLE_REASON_BITS)
    if rest:
        names.append(f"0x{rest:x}")
    return tuple(names)


def cuda_version_str(version: int | None) -> str | None:
    """12080 -> '12.8' (the encoding of cudaDriverGetVersion and nvmlSystemGetCudaDriverVersion)."""
    if version is None:
        return None
    return f"{version // 1000}.{(version % 1000) // 10}"


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on a GPU."""

    pid: int
    name: str | None = None
    used_mib: int | None = None
    kind: str = "compute"  # compute | graphics


@dataclass(frozen=True)
class GpuInfo:
    """One GPU, as NVML reports it. Counts are totals since driver load unless named otherwise."""

    index: int
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    compute_capability: tuple[int, int] | None = None
    persistence_mode: bool | None = None
    ecc_mode_current: bool | None = None
    ecc_mode_pending: bool | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    throttle_reasons: tuple[str, ...] | None = None
    temperature_c: int | None = None
    temperature_slowdown_c: int | None = None
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    processes: tuple[GpuProcess, ...] | None = None
    mig_mode: bool | None = None  # MIG on (the GPU is split into instances); None where the GPU has no MIG

    @property
    def sm(self) -> str | None:
        """'sm_90' for compute capability 9.0."""
        cc = self.compute_capability
        return f"sm_{cc[0]}{cc[1]}" if cc else None

    @property
    def label(self) -> str:
        return f"GPU{self.index} {self.name or '(unnamed)'}"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["compute_capability"] = list(self.compute_capability) if self.compute_capability else None
        data["throttle_reasons"] = list(self.throttle_reasons) if self.throttle_reasons is not None else None
        data["processes"] = [asdict(p) for p in self.processes] if self.processes is not None else None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuInfo:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown GPU fields: {', '.join(unknown)}")
        values = dict(data)
        cc = values.get("compute_capability")
        if isinstance(cc, str):  # "8.6"
            major, _, minor = cc.partition(".")
            cc = (int(major), int(minor or 0))
        values["compute_capability"] = tuple(cc) if cc is not None else None
        reasons = values.get("throttle_reasons")
        if isinstance(reasons, int):
            reasons = throttle_names(reasons)
        values["throttle_reasons"] = tuple(reasons) if reasons is not None else None
        procs = values.get("processes")
        values["processes"] = tuple(GpuProcess(**p) for p in procs) if procs is not None else None
        return cls(**values)


@dataclass(frozen=True)
class GpuInventory:
    """A one-shot snapshot of the driver and every GPU.

    `available` is False when NVML could not be loaded or initialised; `error` / `error_kind`
    then say why (`library_not_found`, `driver_not_loaded`, `no_permission`,
    `driver_library_mismatch`, `unknown`). `unsupported` names each query the driver refused
    (`GPU0 nvmlDeviceGetRemappedRows: Not Supported`).
    """

    available: bool
    error: str | None = None
    error_kind: str | None = None
    driver_version: str | None = None
    cuda_driver_version: int | None = None
    nvml_version: str | None = None
    gpus: tuple[GpuInfo, ...] = ()
    unsupported: tuple[str, ...] = field(default=())

    @property
    def cuda_driver_version_str(self) -> str | None:
        return cuda_version_str(self.cuda_driver_version)

    def to_dict(self) -> dict[str, Any]:
        return {
            "available": self.available,
            "error": self.error,
            "error_kind": self.error_kind,
            "driver_version": self.driver_version,
            "cuda_driver_version": self.cuda_driver_version,
            "cuda_driver_version_str": self.cuda_driver_version_str,
            "nvml_version": self.nvml_version,
            "gpus": [g.to_dict() for g in self.gpus],
            "unsupported": list(self.unsupported),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuInventory:
        values = {k: v for k, v in data.items() if k != "cuda_driver_version_str"}
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown inventory fields: {', '.join(unknown)}")
        values["gpus"] = tuple(GpuInfo.from_dict(g) for g in values.get("gpus", ()))
        values["unsupported"] = tuple(values.get("unsupported", ()))
        return cls(**values)


@runtime_checkable
class InventorySource(Protocol):
    """Anything that can produce a `GpuInventory` (real NVML, a fake, later a recording)."""

    def inventory(self) -> GpuInventory:
        """Return a snapshot; never raise for a missing driver or an unsupported query."""
        ...


# --- Sampling over time (the `telemetry.jsonl` of a run record; format in docs/run-record.md) ---


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one moment. Field names are the `telemetry.jsonl` keys (units in the names).

    Each field but `t` and `gpu` has its row in the catalogue (gpufix/signals.py: its series,
    unit, `nvidia-smi --query-gpu` equivalent, displays): a new field needs one there too, or
    it is recorded but no rule or display sees it.
    """

    t: float
    gpu: int
    util_gpu_pct: int | None = None
    util_mem_pct: int | None = None
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temperature_c: int | None = None
    sm_clock_mhz: int | None = None
    throttle_reasons: tuple[str, ...] | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    ecc_uncorrected: int | None = None
    pcie_gen_max: int | None = None  # what the link could do: a degraded link is below it under load
    pcie_width_max: int | None = None

    def to_dict(self) -> dict[str, Any]:
        # Not asdict(): it deep-copies every value, and this runs per GPU per second.
        data = {name: getattr(self, name) for name in _SAMPLE_FIELDS}
        data["t"] = round(self.t, 3)
        if self.throttle_reasons is not None:
            data["throttle_reasons"] = list(self.throttle_reasons)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuSample:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}  # newer files may carry more
        reasons = values.get("throttle_reasons")
        values["throttle_reasons"] = tuple(reasons) if reasons is not None else None
        return cls(**values)


_SAMPLE_FIELDS = tuple(f.name for f in fields(GpuSample))


@dataclass(frozen=True)
class XidEvent:
    """An Xid error the driver reported while sampling (NVML event `XidCriticalError`)."""

    t: float
    gpu: int | None
    xid: int

    def to_dict(self) -> dict[str, Any]:
        return {"t": round(self.t, 3), "event": "xid", "gpu": self.gpu, "xid": self.xid}


@dataclass(frozen=True)
class GpuProcessUse:
    """A process holding memory on one GPU (from the dear process-list call)."""

    gpu: int
    pid: int
    used_mib: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "pid": self.pid, "used_mib": self.used_mib}


@dataclass(frozen=True)
class GpuIdentity:
    """One GPU's names: NVML index, model, UUID, PCI bus id (as in kernel Xid lines), device minor."""

    gpu: int
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    minor: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuIdentity:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@runtime_checkable
class TelemetrySource(Protocol):
    """What the sampler reads from: real NVML, a recorded file played back, or a fake.

    Every method may be slow or hang (a real driver can); the sampler calls them from its own
    thread only. None of them raises for a missing metric: that value is `None`.
    """

    def open(self) -> str | None:
        """Initialise. None when ready; else a one-line note saying why there is no telemetry."""
        ...

    def sample(self, now: float) -> list[GpuSample]:
        """One sample of every GPU; an empty list once the GPUs are gone."""
        ...

    def wait_events(self, timeout_s: float) -> list[XidEvent]:
        """Xid events that arrive within `timeout_s` (sleeps that long when there are none)."""
        ...

    def processes(self) -> list[GpuProcessUse]:
        """Every process holding GPU memory, on every GPU (a dear call: every few seconds)."""
        ...

    def identities(self) -> list[GpuIdentity]:
        """Who each GPU is (after `open()`): the record's `gpus` line, the PCI address that Xid
        events are reported under, and the device minor that finds the job's GPUs from its open
        /dev/nvidiaN files where process IDs cannot (a container's PID namespace)."""
        ...

    def problems(self) -> list[str]:
        """Calls that failed or are unsupported so far ('GPU0 nvmlDeviceGetPowerUsage: Not Supported')."""
        ...

    def close(self) -> None:
        ...

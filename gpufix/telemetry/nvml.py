"""The one module that touches NVML (package `nvidia-ml-py`, module `pynvml`).

`pynvml` is imported inside functions only, so importing gpufix costs nothing on machines without
a GPU. Every NVML call goes through `NvmlQuery.call`, which turns a failed or unsupported call
into `None` and records it in `unsupported`; a missing driver is a normal answer
(`GpuInventory(available=False, ...)`), never an exception.

Two readers: `NvmlInventorySource` (a one-shot snapshot for `gpufix doctor`) and
`NvmlTelemetrySource` (the sampler's source: init and handles once, then cheap getters per
sample, Xid events through an NVML event set, the process list on demand).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable

from gpufix.telemetry.inventory import (
    GpuInfo,
    GpuIdentity,
    GpuInventory,
    GpuProcess,
    GpuProcessUse,
    GpuSample,
    XidEvent,
    throttle_names,
)

_MIB = 1024 * 1024

# NVML return codes (nvml.h) that decide how a failed nvmlInit is explained.
_INIT_ERROR_KINDS = {
    4: "no_permission",  # NVML_ERROR_NO_PERMISSION
    9: "driver_not_loaded",  # NVML_ERROR_DRIVER_NOT_LOADED
    12: "library_not_found",  # NVML_ERROR_LIBRARY_NOT_FOUND
    18: "driver_library_mismatch",  # NVML_ERROR_LIB_RM_VERSION_MISMATCH
}

# Constants from nvml.h, used as call arguments (kept literal so tests need no real pynvml).
_TEMPERATURE_GPU = 0
_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
_MEMORY_ERROR_UNCORRECTED = 1
_VOLATILE_ECC, _AGGREGATE_ECC = 0, 1
_RETIRE_CAUSE_SBE, _RETIRE_CAUSE_DBE = 0, 1
_CLOCK_SM = 1
_EVENT_XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError
_ERROR_NOT_SUPPORTED, _ERROR_TIMEOUT, _ERROR_FUNCTION_NOT_FOUND, _ERROR_GPU_IS_LOST = 3, 10, 13, 15


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


@dataclass
class NvmlQuery:
    """Calls pynvml functions by name; failures become `None` and are remembered."""

    module: ModuleType
    unsupported: list[str] = field(default_factory=list)
    # For repeated sampling: never call again what the driver said it does not support, and
    # list each problem once (a 1 Hz sampler would otherwise grow the list without end).
    remember: bool = False
    lost: set[str] = field(default_factory=set)  # `where`s whose GPU fell off (NVML_ERROR_GPU_IS_LOST)
    _skip: set[tuple[str, str]] = field(default_factory=set)

    def call(self, where: str, name: str, *args: Any) -> Any:
        """`module.name(*args)`, or None (recording `where name: reason`) if it fails."""
        if self._skip and (where, name) in self._skip:
            return None
        fn: Callable[..., Any] | None = getattr(self.module, name, None)
        if fn is None:
            self._note(where, name, "not in this nvidia-ml-py", permanent=True)
            return None
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - NVMLError_* and ctypes trouble alike
            code = getattr(exc, "value", None)
            if code == _ERROR_GPU_IS_LOST:
                self.lost.add(where)
            self._note(where, name, _describe(exc), permanent=code in (_ERROR_NOT_SUPPORTED, _ERROR_FUNCTION_NOT_FOUND))
            return None

    def _note(self, where: str, name: str, reason: str, permanent: bool) -> None:
        text = f"{where} {name}: {reason}".strip()
        if self.remember:
            if permanent:
                self._skip.add((where, name))
            if text in self.unsupported:
                return
        self.unsupported.append(text)

    def first(self, where: str, names: tuple[str, ...], *args: Any) -> Any:
        """The first of several equivalent calls (new name, then deprecated) that answers."""
        before = len(self.unsupported)
        for name in names:
            value = self.call(where, name, *args)
            if value is not None:
                del self.unsupported[before:]
                return value
        del self.unsupported[before + 1:]
        return None


def _describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - NVMLError.__str__ itself calls into NVML
        text = ""
    return text or type(exc).__name__


class NvmlInventorySource:
    """The real reader. `module` may be injected (a stand-in for `pynvml` in tests)."""

    def __init__(self, module: ModuleType | None = None) -> None:
        self._module = module

    def inventory(self) -> GpuInventory:
        module = self._module
        if module is None:
            try:
                import pynvml as module  # noqa: PLC0415 - lazy on purpose
            except ImportError as exc:
                return GpuInventory(available=False, error=f"nvidia-ml-py is not installed ({exc})", error_kind="pynvml_missing")
        try:
            module.nvmlInit()
        except Exception as exc:  # noqa: BLE001
            code = getattr(exc, "value", None)
            return GpuInventory(available=False, error=_describe(exc), error_kind=_INIT_ERROR_KINDS.get(code, "unknown"))
        try:
            return _snapshot(NvmlQuery(module))
        finally:
            try:
                module.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass


def _snapshot(q: NvmlQuery) -> GpuInventory:
    count = q.call("system", "nvmlDeviceGetCount") or 0
    gpus = []
    for index in range(count):
        handle = q.call(f"GPU{index}", "nvmlDeviceGetHandleByIndex", index)
        if handle is not None:
            gpus.append(_gpu(q, index, handle))
        else:
            gpus.append(GpuInfo(index=index))
    return GpuInventory(
        available=True,
        driver_version=_text(q.call("system", "nvmlSystemGetDriverVersion")),
        cuda_driver_version=q.call("system", "nvmlSystemGetCudaDriverVersion"),
        nvml_version=_text(q.call("system", "nvmlSystemGetNVMLVersion")),
        gpus=tuple(gpus),
        unsupported=tuple(q.unsupported),
    )


def _gpu(q: NvmlQuery, index: int, h: Any) -> GpuInfo:
    at = f"GPU{index}"
    mem = q.call(at, "nvmlDeviceGetMemoryInfo", h)
    pci = q.call(at, "nvmlDeviceGetPciInfo", h)
    cc = q.call(at, "nvmlDeviceGetCudaComputeCapability", h)
    persistence = q.call(at, "nvmlDeviceGetPersistenceMode", h)
    ecc = q.call(at, "nvmlDeviceGetEccMode", h)
    ecc_on = bool(ecc[0]) if ecc is not None else None
    unc_vol = unc_agg = None
    if ecc_on:
        unc_vol = q.call(at, "nvmlDeviceGetTotalEccErrors", h, _MEMORY_ERROR_UNCORRECTED, _VOLATILE_ECC)
        unc_agg = q.call(at, "nvmlDeviceGetTotalEccErrors", h, _MEMORY_ERROR_UNCORRECTED, _AGGREGATE_ECC)
    rows = q.call(at, "nvmlDeviceGetRemappedRows", h)
    sbe = dbe = pending_pages = None
    if rows is None:  # page retirement is the pre-Ampere mechanism; row remapping replaced it
        sbe = _count(q.call(at, "nvmlDeviceGetRetiredPages", h, _RETIRE_CAUSE_SBE))
        dbe = _count(q.call(at, "nvmlDeviceGetRetiredPages", h, _RETIRE_CAUSE_DBE))
        pending = q.call(at, "nvmlDeviceGetRetiredPagesPendingStatus", h)
        pending_pages = bool(pending) if pending is not None else None
    mask = q.first(at, ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"), h)
    mig = q.call(at, "nvmlDeviceGetMigMode", h)  # [current, pending]; not supported on GPUs without MIG
    return GpuInfo(
        index=index,
        name=_text(q.call(at, "nvmlDeviceGetName", h)),
        uuid=_text(q.call(at, "nvmlDeviceGetUUID", h)),
        pci_bus_id=_text(getattr(pci, "busId", None)) if pci is not None else None,
        memory_total_mib=int(mem.total) // _MIB if mem is not None else None,
        memory_used_mib=int(mem.used) // _MIB if mem is not None else None,
        compute_capability=(int(cc[0]), int(cc[1])) if cc is not None else None,
        persistence_mode=bool(persistence) if persistence is not None else None,
        ecc_mode_current=ecc_on,
        ecc_mode_pending=bool(ecc[1]) if ecc is not None else None,
        ecc_uncorrected_volatile=unc_vol,
        ecc_uncorrected_aggregate=unc_agg,
        retired_pages_sbe=sbe,
        retired_pages_dbe=dbe,
        retired_pages_pending=pending_pages,
        remapped_rows_correctable=int(rows[0]) if rows is not None else None,
        remapped_rows_uncorrectable=int(rows[1]) if rows is not None else None,
        remapped_rows_pending=bool(rows[2]) if rows is not None else None,
        remapped_rows_failure=bool(rows[3]) if rows is not None else None,
        throttle_reasons=throttle_names(mask),
        temperature_c=q.call(at, "nvmlDeviceGetTemperature", h, _TEMPERATURE_GPU),
        temperature_slowdown_c=q.call(at, "nvmlDeviceGetTemperatureThreshold", h, _TEMPERATURE_THRESHOLD_SLOWDOWN),
        pcie_gen=q.call(at, "nvmlDeviceGetCurrPcieLinkGeneration", h),
        pcie_gen_max=q.call(at, "nvmlDeviceGetMaxPcieLinkGeneration", h),
        pcie_width=q.call(at, "nvmlDeviceGetCurrPcieLinkWidth", h),
        pcie_width_max=q.call(at, "nvmlDeviceGetMaxPcieLinkWidth", h),
        processes=_processes(q, at, h),
        mig_mode=bool(mig[0]) if mig is not None else None,
    )


def _count(pages: list[Any] | None) -> int | None:
    return len(pages) if pages is not None else None


def _processes(q: NvmlQuery, at: str, h: Any) -> tuple[GpuProcess, ...] | None:
    compute = q.call(at, "nvmlDeviceGetComputeRunningProcesses", h)
    graphics = q.call(at, "nvmlDeviceGetGraphicsRunningProcesses", h)
    if compute is None and graphics is None:
        return None
    seen: dict[int, GpuProcess] = {}
    for kind, procs in (("compute", compute or []), ("graphics", graphics or [])):
        for proc in procs:
            pid = int(getattr(proc, "pid", 0))
            used = getattr(proc, "usedGpuMemory", None)
            used_mib = int(used) // _MIB if used is not None else None
            if pid in seen:
                continue
            seen[pid] = GpuProcess(pid=pid, name=_process_name(q, at, pid), used_mib=used_mib, kind=kind)
    return tuple(seen.values())


def _process_name(q: NvmlQuery, at: str, pid: int) -> str | None:
    before = len(q.unsupported)
    name = _text(q.call(at, "nvmlSystemGetProcessName", pid))
    del q.unsupported[before:]  # a pid from another PID namespace has no name here; not a driver gap
    if name:
        return name
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


class NvmlTelemetrySource:
    """The real `TelemetrySource`. `module` may be injected (a stand-in for `pynvml` in tests).

    `open()` may take seconds (nvmlInit without persistence mode) or hang: the sampler calls it
    from its own thread, after the job has started.
    """

    def __init__(self, module: ModuleType | None = None) -> None:
        self._module = module
        self._q: NvmlQuery | None = None
        self._handles: list[tuple[int, Any]] = []
        self._ecc_on: dict[int, bool] = {}
        self._events: Any = None

    def open(self) -> str | None:
        module = self._module
        if module is None:
            try:
                import pynvml as module  # noqa: PLC0415 - lazy on purpose
            except ImportError:
                return "no GPU telemetry: nvidia-ml-py (pynvml) is not installed"
        try:
            module.nvmlInit()
        except Exception as exc:  # noqa: BLE001
            return f"no GPU telemetry: NVML did not initialise ({_describe(exc)})"
        self._module = module
        q = self._q = NvmlQuery(module, remember=True)
        count = q.call("system", "nvmlDeviceGetCount") or 0
        for index in range(count):
            handle = q.call(f"GPU{index}", "nvmlDeviceGetHandleByIndex", index)
            if handle is not None:
                self._handles.append((index, handle))
                ecc = q.call(f"GPU{index}", "nvmlDeviceGetEccMode", handle)
                self._ecc_on[index] = bool(ecc and ecc[0])
        if not self._handles:
            return "no GPU telemetry: NVML sees no GPU"
        self._events = q.call("system", "nvmlEventSetCreate")
        if self._events is not None:
            registered = 0
            for index, handle in self._handles:
                before = len(q.unsupported)  # the call returns None on success too
                q.call(f"GPU{index}", "nvmlDeviceRegisterEvents", handle, _EVENT_XID_CRITICAL, self._events)
                registered += len(q.unsupported) == before
            if not registered:
                self._events = None
        return None

    def _live(self) -> Iterator[tuple[NvmlQuery, int, Any, str]]:
        """(query, index, handle, label) of each GPU not lost; none before open() or after close()."""
        q = self._q
        for index, h in self._handles if q is not None else ():
            at = f"GPU{index}"
            if q is not None and at not in q.lost:
                yield q, index, h, at

    def sample(self, now: float) -> list[GpuSample]:
        out = []
        for q, index, h, at in self._live():
            util = q.call(at, "nvmlDeviceGetUtilizationRates", h)
            mem = q.call(at, "nvmlDeviceGetMemoryInfo", h)
            power = q.call(at, "nvmlDeviceGetPowerUsage", h)
            limit = q.call(at, "nvmlDeviceGetEnforcedPowerLimit", h)
            mask = q.first(at, ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"), h)
            ecc = None
            if self._ecc_on.get(index):
                ecc = q.call(at, "nvmlDeviceGetTotalEccErrors", h, _MEMORY_ERROR_UNCORRECTED, _VOLATILE_ECC)
            out.append(GpuSample(
                t=now, gpu=index,
                util_gpu_pct=_int(getattr(util, "gpu", None)), util_mem_pct=_int(getattr(util, "memory", None)),
                memory_used_mib=int(mem.used) // _MIB if mem is not None else None,
                memory_total_mib=int(mem.total) // _MIB if mem is not None else None,
                power_w=round(power / 1000, 1) if power is not None else None,
                power_limit_w=round(limit / 1000, 1) if limit is not None else None,
                temperature_c=_int(q.call(at, "nvmlDeviceGetTemperature", h, _TEMPERATURE_GPU)),
                sm_clock_mhz=_int(q.call(at, "nvmlDeviceGetClockInfo", h, _CLOCK_SM)),
                throttle_reasons=throttle_names(mask),
                pcie_gen=_int(q.call(at, "nvmlDeviceGetCurrPcieLinkGeneration", h)),
                pcie_width=_int(q.call(at, "nvmlDeviceGetCurrPcieLinkWidth", h)),
                ecc_uncorrected=_int(ecc),
                pcie_gen_max=_int(q.call(at, "nvmlDeviceGetMaxPcieLinkGeneration", h)),
                pcie_width_max=_int(q.call(at, "nvmlDeviceGetMaxPcieLinkWidth", h)),
            ))
        return out

    def wait_events(self, timeout_s: float) -> list[XidEvent]:
        import time

        q = self._q
        if q is None or self._events is None:
            time.sleep(max(0.0, timeout_s))
            return []
        wait = getattr(self._module, "nvmlEventSetWait_v2", None) or getattr(self._module, "nvmlEventSetWait", None)
        if wait is None:
            self._events = None
            time.sleep(max(0.0, timeout_s))
            return []
        try:
            data = wait(self._events, max(1, int(timeout_s * 1000)))
        except Exception as exc:  # noqa: BLE001
            if getattr(exc, "value", None) != _ERROR_TIMEOUT:
                q._note("system", "nvmlEventSetWait", _describe(exc), permanent=True)
                self._events = None  # a broken event set would spin; sleep from now on
            return []
        if getattr(data, "eventType", None) != _EVENT_XID_CRITICAL:
            return []
        gpu = q.call("system", "nvmlDeviceGetIndex", data.device)
        return [XidEvent(t=time.time(), gpu=_int(gpu), xid=int(data.eventData))]

    def processes(self) -> list[GpuProcessUse]:
        out: list[GpuProcessUse] = []
        for q, index, h, at in self._live():
            seen: set[int] = set()
            for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                for proc in q.call(at, name, h) or []:
                    pid = int(getattr(proc, "pid", 0))
                    used = getattr(proc, "usedGpuMemory", None)
                    if pid not in seen:
                        seen.add(pid)
                        out.append(GpuProcessUse(index, pid, int(used) // _MIB if used is not None else None))
        return out

    def identities(self) -> list[GpuIdentity]:
        out = []
        for q, index, h, at in self._live():
            pci = q.call(at, "nvmlDeviceGetPciInfo", h)
            out.append(GpuIdentity(
                gpu=index, name=_text(q.call(at, "nvmlDeviceGetName", h)), uuid=_text(q.call(at, "nvmlDeviceGetUUID", h)),
                pci_bus_id=_text(getattr(pci, "busId", None)) if pci is not None else None,
                minor=_int(q.call(at, "nvmlDeviceGetMinorNumber", h))))
        return out

    def problems(self) -> list[str]:
        return list(self._q.unsupported) if self._q is not None else []

    def lost_gpus(self) -> list[int]:
        """GPUs that NVML reported lost (fallen off the bus) since `open()`."""
        q = self._q
        return sorted(index for index, _ in self._handles if q is not None and f"GPU{index}" in q.lost)

    def close(self) -> None:
        module, q = self._module, self._q
        self._q = None
        if module is None or q is None:
            return
        for fn, args in (("nvmlEventSetFree", (self._events,)), ("nvmlShutdown", ())):
            if fn == "nvmlEventSetFree" and self._events is None:
                continue
            try:
                getattr(module, fn)(*args)
            except Exception:  # noqa: BLE001
                pass


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None

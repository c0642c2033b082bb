"""A stand-in for the `pynvml` module: the functions the sampler calls, returning controlled
values, raising `NVMLError` like the real library (Not Supported, GPU lost), or hanging."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {3: "Not Supported", 9: "Driver Not Loaded", 10: "Timeout", 15: "GPU is lost"}.get(self.value, f"error {self.value}")


NOT_SUPPORTED, DRIVER_NOT_LOADED, TIMEOUT, GPU_IS_LOST = 3, 9, 10, 15
MIB = 1024 * 1024


class FakeNvml:
    """`gpus` GPUs; `unsupported` names functions that raise Not Supported; `hang` names one that
    blocks until `release` is set; `lose_gpu_after` = (index, calls) makes that GPU lost later."""

    def __init__(self, gpus: int = 2, unsupported: tuple[str, ...] = (), hang: str | None = None,
                 init_error: int | None = None, xids: list[tuple[int, int]] | None = None,
                 pids: tuple[int, ...] = (), lose_gpu_after: tuple[int, int] | None = None,
                 minors: dict[int, int] | None = None) -> None:
        self.gpus = gpus
        self.unsupported = set(unsupported)
        self.hang = hang
        self.release = threading.Event()
        self.init_error = init_error
        self.xids = list(xids or [])
        self.pids = pids
        self.lose = lose_gpu_after
        self.minors = minors or {}  # GPU index -> device minor; default: the same number
        self.calls: dict[str, int] = {}
        self.shutdown_called = False

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(name)  # a function this nvidia-ml-py "does not have"

    def _enter(self, name: str, handle: Any = None) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        if name == self.hang:
            self.release.wait()
        if name in self.unsupported:
            raise NVMLError(NOT_SUPPORTED)
        if self.lose and handle is not None and handle.index == self.lose[0] \
                and self.calls.get("nvmlDeviceGetUtilizationRates", 0) > self.lose[1]:
            raise NVMLError(GPU_IS_LOST)

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        if self.init_error is not None:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdown_called = True

    def nvmlDeviceGetCount(self) -> int:
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Any:
        return SimpleNamespace(index=i)

    def nvmlDeviceGetIndex(self, h: Any) -> int:
        return h.index

    def nvmlDeviceGetName(self, h: Any) -> str:
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, h: Any) -> bytes:
        return f"GPU-0000000{h.index}-fake".encode()  # older nvidia-ml-py returns bytes

    def nvmlDeviceGetPciInfo(self, h: Any) -> Any:
        return SimpleNamespace(busId=f"00000000:{0x18 + h.index:02X}:00.0")

    def nvmlDeviceGetMinorNumber(self, h: Any) -> int:
        self._enter("nvmlDeviceGetMinorNumber", h)
        return self.minors.get(h.index, h.index)

    def nvmlDeviceGetEccMode(self, h: Any) -> tuple[int, int]:
        self._enter("nvmlDeviceGetEccMode", h)
        return (1, 1)

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        self._enter("nvmlDeviceGetUtilizationRates", h)
        return SimpleNamespace(gpu=90 + h.index, memory=40)

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> Any:
        self._enter("nvmlDeviceGetMemoryInfo", h)
        return SimpleNamespace(used=30000 * MIB, total=81559 * MIB, free=51559 * MIB)

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        self._enter("nvmlDeviceGetPowerUsage", h)
        return 412345

    def nvmlDeviceGetEnforcedPowerLimit(self, h: Any) -> int:
        self._enter("nvmlDeviceGetEnforcedPowerLimit", h)
        return 700000

    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:
        self._enter("nvmlDeviceGetTemperature", h)
        return 71

    def nvmlDeviceGetClockInfo(self, h: Any, clock: int) -> int:
        self._enter("nvmlDeviceGetClockInfo", h)
        return 1980

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Any) -> int:
        self._enter("nvmlDeviceGetCurrentClocksEventReasons", h)
        return 0x004 | 0x040  # sw power cap + hw thermal slowdown

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: Any) -> int:
        self._enter("nvmlDeviceGetCurrPcieLinkGeneration", h)
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: Any) -> int:
        self._enter("nvmlDeviceGetCurrPcieLinkWidth", h)
        return 16

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: Any) -> int:
        self._enter("nvmlDeviceGetMaxPcieLinkGeneration", h)
        return 5

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: Any) -> int:
        self._enter("nvmlDeviceGetMaxPcieLinkWidth", h)
        return 16

    def nvmlDeviceGetTotalEccErrors(self, h: Any, kind: int, counter: int) -> int:
        self._enter("nvmlDeviceGetTotalEccErrors", h)
        return 0

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]:
        self._enter("nvmlDeviceGetComputeRunningProcesses", h)
        return [SimpleNamespace(pid=pid, usedGpuMemory=2048 * MIB) for pid in self.pids if h.index == 0] + \
            [SimpleNamespace(pid=1, usedGpuMemory=None)]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: Any) -> list[Any]:
        self._enter("nvmlDeviceGetGraphicsRunningProcesses", h)
        return []

    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlDeviceRegisterEvents(self, h: Any, types: int, event_set: object) -> None:
        self._enter("nvmlDeviceRegisterEvents", h)

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> Any:
        self._enter("nvmlEventSetWait_v2")
        if self.xids:
            gpu, xid = self.xids.pop(0)
            return SimpleNamespace(device=SimpleNamespace(index=gpu), eventType=0x8, eventData=xid)
        threading.Event().wait(min(timeout_ms, 50) / 1000)
        raise NVMLError(TIMEOUT)

    def nvmlEventSetFree(self, event_set: object) -> None:
        return None

"""A fake inventory source built from a dict or a JSON file, for tests and for replaying a
machine's `gpufix doctor --format json` output (its `driver` and `gpus` keys)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufix.telemetry.inventory import GpuInventory


@dataclass(frozen=True)
class FakeInventorySource:
    """Returns a fixed `GpuInventory`."""

    snapshot: GpuInventory

    def inventory(self) -> GpuInventory:
        return self.snapshot

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FakeInventorySource:
        """Build from the inventory dict shape; `available` defaults to True."""
        data = dict(data)
        data.setdefault("available", True)
        return cls(GpuInventory.from_dict(data))

    @classmethod
    def from_json(cls, path: str | Path) -> FakeInventorySource:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    @classmethod
    def absent(cls, error: str = "NVML Shared Library Not Found", kind: str = "library_not_found") -> FakeInventorySource:
        """NVML not loadable: the no-driver machine."""
        return cls(GpuInventory(available=False, error=error, error_kind=kind))


class FakeTelemetrySource:
    """A scripted `TelemetrySource` for tests: `ticks[i]` is the list of per-GPU field dicts of
    the i-th sample (the last repeats); `xids` maps a tick number to Xid codes on GPU 0; `minors`
    maps a device minor number to a GPU index (default: the same number)."""

    def __init__(self, ticks: list[list[dict[str, Any]]] | None = None, open_note: str | None = None,
                 processes: list[tuple[int, int, int | None]] | None = None,
                 xids: dict[int, list[int]] | None = None, minors: dict[int, int] | None = None) -> None:
        from gpufix.telemetry.inventory import GpuProcessUse

        self.ticks = ticks if ticks is not None else [[{"gpu": 0, "util_gpu_pct": 0}]]
        self.open_note = open_note
        self.users = [GpuProcessUse(g, p, m) for g, p, m in (processes or [])]
        self.xids = dict(xids or {})
        self.minors = dict(minors or {})
        self.calls = 0
        self.closed = False

    def open(self) -> str | None:
        return self.open_note

    def sample(self, now: float) -> list[Any]:
        from gpufix.telemetry.inventory import GpuSample

        tick = self.ticks[min(self.calls, len(self.ticks) - 1)]
        self.calls += 1
        return [GpuSample.from_dict({**fields, "t": now}) for fields in tick]

    def wait_events(self, timeout_s: float) -> list[Any]:
        import time

        from gpufix.telemetry.inventory import XidEvent

        time.sleep(max(0.0, timeout_s))
        return [XidEvent(time.time(), 0, code) for code in self.xids.pop(self.calls - 1, [])]

    def processes(self) -> list[Any]:
        return list(self.users)

    def identities(self) -> list[Any]:
        from gpufix.telemetry.inventory import GpuIdentity

        gpus = sorted({fields["gpu"] for tick in self.ticks for fields in tick})
        by_gpu = {gpu: minor for minor, gpu in self.minors.items()}
        return [GpuIdentity(gpu, "Fake GPU", f"GPU-fake-{gpu}", f"00000000:{0x10 + gpu:02X}:00.0", by_gpu.get(gpu, gpu))
                for gpu in gpus]

    def problems(self) -> list[str]:
        return []

    def close(self) -> None:
        self.closed = True

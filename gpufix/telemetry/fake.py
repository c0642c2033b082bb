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

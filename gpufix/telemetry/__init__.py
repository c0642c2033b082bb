"""Telemetry: what gpufix can read from the GPUs themselves.

Sources implement `InventorySource` (a one-shot snapshot: driver, GPUs, processes). The real
reader lives in `gpufix.telemetry.nvml` (the only module that touches NVML, imported lazily);
`gpufix.telemetry.fake` builds the same snapshot from a dict for tests. Over time, sources
implement `TelemetrySource` (NVML: `nvml.NvmlTelemetrySource`, a recording: `replay`, tests:
`fake.FakeTelemetrySource`) and `sampler.TelemetrySampler` writes `telemetry.jsonl`.
"""

from __future__ import annotations

from gpufix.telemetry.inventory import (
    GpuInfo,
    GpuInventory,
    GpuProcess,
    InventorySource,
    cuda_version_str,
)

__all__ = ["GpuInfo", "GpuInventory", "GpuProcess", "InventorySource", "cuda_version_str", "read_inventory"]


def read_inventory() -> GpuInventory:
    """Snapshot the real machine through NVML (never raises; NVML absent is a normal answer)."""
    from gpufix.telemetry.nvml import NvmlInventorySource

    return NvmlInventorySource().inventory()

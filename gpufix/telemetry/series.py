"""A recorded `telemetry.jsonl` as the measured series rules judge (gpufix/series.py).

Each GPU field becomes `gpu.<field>` grouped by GPU index, with derived series a rule needs:
`gpu.memory_used_frac` (used / total), `gpu.pcie_gen_frac` and `gpu.pcie_width_frac` (current /
maximum link) and 0/1 flags for throttling (`gpu.throttle_thermal`,
`gpu.throttle_power`, `gpu.throttle_hw_slowdown`). The job tree's `host` lines become
`host.cpu_pct` and `host.rss_mib`. Every sample points back at its line in the file, so a
finding can quote it.
"""

from __future__ import annotations

from gpufix.series import Sample
from gpufix.telemetry.replay import iter_lines

_GPU_FIELDS = ("util_gpu_pct", "util_mem_pct", "memory_used_mib", "memory_total_mib", "power_w", "power_limit_w",
               "temperature_c", "sm_clock_mhz", "pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max",
               "ecc_uncorrected")
# NVML clock-event reason names (gpufix.telemetry.inventory.throttle_names) by what they mean.
_THROTTLE_FLAGS = {
    "gpu.throttle_thermal": ("sw_thermal_slowdown", "hw_thermal_slowdown"),
    "gpu.throttle_power": ("sw_power_cap", "hw_power_brake_slowdown"),
    "gpu.throttle_hw_slowdown": ("hw_slowdown",),
}


def telemetry_series(path: str, source: str | None = None) -> dict[str, list[Sample]]:
    """Series by name from one telemetry.jsonl (missing values are skipped, not zeros)."""
    out: dict[str, list[Sample]] = {}
    label = source or path

    def add(name: str, t: float, value: float, group: str | None, line: int) -> None:
        out.setdefault(name, []).append(Sample(t, float(value), group, label, line))

    for line, t, obj in iter_lines(path):
        if "gpu" in obj and "event" not in obj and "processes" not in obj:
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
        elif isinstance(obj.get("host"), dict):
            for field in ("cpu_pct", "rss_mib"):
                value = obj["host"].get(field)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    add(f"host.{field}", t, value, None, line)
    return out

"""The NVML query layer (through a stand-in pynvml module), the inventory snapshot and the fake source."""

from __future__ import annotations

import subprocess
import sys
import types
from dataclasses import replace

from gpufix.telemetry import GpuInventory, InventorySource, cuda_version_str
from gpufix.telemetry.fake import FakeInventorySource
from gpufix.telemetry.inventory import throttle_names
from gpufix.telemetry.nvml import NvmlInventorySource, NvmlQuery

from .conftest import FIX, load_inventory

MIB = 1024 * 1024


class NVMLError(Exception):
    def __init__(self, value: int, text: str) -> None:
        super().__init__(text)
        self.value = value


def not_supported(*_a: object) -> None:
    raise NVMLError(3, "Not Supported")


def fake_pynvml(**override: object) -> types.ModuleType:
    """A pynvml look-alike for one A100 with a foreign process; `override` replaces functions."""
    m = types.ModuleType("pynvml")
    proc = types.SimpleNamespace(pid=4242, usedGpuMemory=30000 * MIB)
    funcs = dict(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}", nvmlSystemGetDriverVersion=lambda: "535.104.05",
        nvmlSystemGetCudaDriverVersion=lambda: 12020, nvmlSystemGetNVMLVersion=lambda: b"12.535.104.05",
        nvmlDeviceGetName=lambda h: b"NVIDIA A100-SXM4-40GB", nvmlDeviceGetUUID=lambda h: "GPU-aaaa",
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId=b"00000000:07:00.0"),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=40960 * MIB, used=30500 * MIB),
        nvmlDeviceGetCudaComputeCapability=lambda h: (8, 0), nvmlDeviceGetPersistenceMode=lambda h: 0,
        nvmlDeviceGetEccMode=lambda h: [1, 1], nvmlDeviceGetTotalEccErrors=lambda h, t, c: 2,
        nvmlDeviceGetRemappedRows=lambda h: (0, 1, 1, 0),
        nvmlDeviceGetCurrentClocksEventReasons=not_supported,
        nvmlDeviceGetCurrentClocksThrottleReasons=lambda h: 0x4 | 0x8,
        nvmlDeviceGetTemperature=lambda h, s: 88, nvmlDeviceGetTemperatureThreshold=lambda h, t: 92,
        nvmlDeviceGetCurrPcieLinkGeneration=lambda h: 4, nvmlDeviceGetMaxPcieLinkGeneration=lambda h: 4,
        nvmlDeviceGetCurrPcieLinkWidth=lambda h: 8, nvmlDeviceGetMaxPcieLinkWidth=lambda h: 16,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [proc], nvmlDeviceGetGraphicsRunningProcesses=lambda h: [proc],
        nvmlSystemGetProcessName=lambda pid: "python train.py", nvmlDeviceGetMigMode=lambda h: [1, 1],
    )
    funcs.update(override)
    for k, v in funcs.items():
        setattr(m, k, v)
    return m


def test_real_reader_maps_every_field() -> None:
    inv = NvmlInventorySource(fake_pynvml()).inventory()
    assert inv.available and inv.driver_version == "535.104.05" and inv.cuda_driver_version_str == "12.2"
    assert inv.nvml_version == "12.535.104.05"
    g = inv.gpus[0]
    assert g.name == "NVIDIA A100-SXM4-40GB" and g.pci_bus_id == "00000000:07:00.0"
    assert (g.memory_total_mib, g.memory_used_mib, g.compute_capability, g.sm) == (40960, 30500, (8, 0), "sm_80")
    assert g.persistence_mode is False and g.ecc_mode_current is True and g.ecc_uncorrected_volatile == 2
    assert (g.remapped_rows_uncorrectable, g.remapped_rows_pending, g.remapped_rows_failure) == (1, True, False)
    assert g.retired_pages_sbe is None  # row remapping answered, so page retirement is not asked
    assert g.throttle_reasons == ("sw_power_cap", "hw_slowdown")  # fell back to the deprecated name
    assert (g.pcie_gen, g.pcie_gen_max, g.pcie_width, g.pcie_width_max) == (4, 4, 8, 16)
    assert (g.temperature_c, g.temperature_slowdown_c) == (88, 92)
    assert g.mig_mode is True
    assert len(g.processes) == 1 and g.processes[0].used_mib == 30000 and g.processes[0].name == "python train.py"
    assert inv.unsupported == ()  # the fallback answered, so nothing is recorded


def test_unsupported_calls_become_none_and_are_remembered() -> None:
    inv = NvmlInventorySource(fake_pynvml(
        nvmlDeviceGetRemappedRows=not_supported, nvmlDeviceGetRetiredPages=lambda h, c: [1, 2] if c else [3],
        nvmlDeviceGetRetiredPagesPendingStatus=lambda h: 1, nvmlDeviceGetCurrentClocksThrottleReasons=not_supported,
        nvmlDeviceGetTemperatureThreshold=lambda h, t: (_ for _ in ()).throw(RuntimeError("ctypes trouble")),
        nvmlDeviceGetGraphicsRunningProcesses=not_supported, nvmlSystemGetProcessName=not_supported,
    )).inventory()
    g = inv.gpus[0]
    assert g.remapped_rows_pending is None and (g.retired_pages_sbe, g.retired_pages_dbe, g.retired_pages_pending) == (1, 2, True)
    assert g.throttle_reasons is None and g.temperature_slowdown_c is None
    assert "GPU0 nvmlDeviceGetRemappedRows: Not Supported" in inv.unsupported
    assert "GPU0 nvmlDeviceGetCurrentClocksEventReasons: Not Supported" in inv.unsupported
    assert "GPU0 nvmlDeviceGetTemperatureThreshold: ctypes trouble" in inv.unsupported
    assert not any("ProcessName" in u for u in inv.unsupported)
    assert g.processes[0].pid == 4242


def test_missing_function_in_old_bindings() -> None:
    m = fake_pynvml()
    del m.nvmlDeviceGetCurrentClocksEventReasons
    q = NvmlQuery(m)
    assert q.call("GPU0", "nvmlDeviceGetNoSuchThing", "h") is None
    assert q.unsupported == ["GPU0 nvmlDeviceGetNoSuchThing: not in this nvidia-ml-py"]
    assert NvmlInventorySource(m).inventory().gpus[0].throttle_reasons == ("sw_power_cap", "hw_slowdown")


def test_init_failures_are_answers_not_exceptions() -> None:
    for code, kind in ((12, "library_not_found"), (9, "driver_not_loaded"), (18, "driver_library_mismatch"),
                       (4, "no_permission"), (999, "unknown")):
        def boom(code: int = code) -> None:
            raise NVMLError(code, f"error {code}")
        inv = NvmlInventorySource(fake_pynvml(nvmlInit=boom)).inventory()
        assert (inv.available, inv.error_kind, inv.error, inv.gpus) == (False, kind, f"error {code}", ())


def test_handle_failure_keeps_an_empty_gpu() -> None:
    inv = NvmlInventorySource(fake_pynvml(nvmlDeviceGetHandleByIndex=lambda i: (_ for _ in ()).throw(NVMLError(15, "GPU is lost")))).inventory()
    assert inv.gpus[0].index == 0 and inv.gpus[0].name is None
    assert "GPU0 nvmlDeviceGetHandleByIndex: GPU is lost" in inv.unsupported


def test_real_nvml_on_this_machine_never_raises() -> None:
    inv = NvmlInventorySource().inventory()
    assert isinstance(inv, GpuInventory)
    assert inv.available or inv.error


def test_inventory_round_trip_and_fake_source() -> None:
    inv = load_inventory("sick_node")
    assert GpuInventory.from_dict(inv.to_dict()) == inv
    assert isinstance(FakeInventorySource(inv), InventorySource)
    assert isinstance(NvmlInventorySource(), InventorySource)
    g = FakeInventorySource.from_dict({"gpus": [{"index": 0, "compute_capability": "8.6", "throttle_reasons": 0x41}]}).inventory().gpus[0]
    assert g.compute_capability == (8, 6) and g.throttle_reasons == ("gpu_idle", "hw_thermal_slowdown")
    assert replace(g, index=3).label == "GPU3 (unnamed)"


def test_unknown_fixture_field_is_rejected() -> None:
    import pytest

    with pytest.raises(ValueError, match="unknown GPU fields: temprature_c"):
        FakeInventorySource.from_dict({"gpus": [{"index": 0, "temprature_c": 3}]})


def test_small_helpers() -> None:
    assert cuda_version_str(12080) == "12.8" and cuda_version_str(11040) == "11.4" and cuda_version_str(None) is None
    assert throttle_names(0) == () and throttle_names(None) is None and throttle_names(0x1000) == ("0x1000",)


def test_nvml_is_imported_lazily() -> None:
    code = ("import sys, gpufix.cli.app, gpufix.telemetry, gpufix.telemetry.nvml, gpufix.doctor.core, gpufix.cli.doctor;"
            "assert 'pynvml' not in sys.modules, 'pynvml imported at start-up';"
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=FIX)

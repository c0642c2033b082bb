"""gpufix's NVML code against the real nvidia-ml-py (a dependency, importable without a GPU): every
function it calls exists, every constant it keeps literal has NVML's value, every struct field it
reads is there. The fakes the other tests use cannot drift from the library unnoticed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpufix.telemetry import inventory, nvml

pynvml = pytest.importorskip("pynvml")

SOURCE = Path(nvml.__file__).read_text(encoding="utf-8")
# Called by name through NvmlQuery.call/first; alternatives (new name, then deprecated) both listed.
CALLED = sorted(set(re.findall(r'"(nvml[A-Z]\w+)"', SOURCE)))


def test_the_nvml_module_names_its_calls() -> None:
    assert len(CALLED) > 30 and "nvmlDeviceRegisterEvents" in CALLED and "nvmlDeviceGetMinorNumber" in CALLED


@pytest.mark.parametrize("name", CALLED)
def test_every_called_function_exists(name: str) -> None:
    assert callable(getattr(pynvml, name, None)), f"nvidia-ml-py has no {name}"


@pytest.mark.parametrize(("ours", "theirs"), [
    (nvml._EVENT_XID_CRITICAL, "nvmlEventTypeXidCriticalError"),
    (nvml._TEMPERATURE_GPU, "NVML_TEMPERATURE_GPU"),
    (nvml._TEMPERATURE_THRESHOLD_SLOWDOWN, "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN"),
    (nvml._MEMORY_ERROR_UNCORRECTED, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED"),
    (nvml._VOLATILE_ECC, "NVML_VOLATILE_ECC"),
    (nvml._AGGREGATE_ECC, "NVML_AGGREGATE_ECC"),
    (nvml._RETIRE_CAUSE_SBE, "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS"),
    (nvml._RETIRE_CAUSE_DBE, "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR"),
    (nvml._CLOCK_SM, "NVML_CLOCK_SM"),
    (nvml._ERROR_NOT_SUPPORTED, "NVML_ERROR_NOT_SUPPORTED"),
    (nvml._ERROR_TIMEOUT, "NVML_ERROR_TIMEOUT"),
    (nvml._ERROR_FUNCTION_NOT_FOUND, "NVML_ERROR_FUNCTION_NOT_FOUND"),
    (nvml._ERROR_GPU_IS_LOST, "NVML_ERROR_GPU_IS_LOST"),
])
def test_literal_constants_have_nvmls_values(ours: int, theirs: str) -> None:
    assert ours == getattr(pynvml, theirs)


def test_init_error_kinds_are_nvmls_codes() -> None:
    assert nvml._INIT_ERROR_KINDS == {
        pynvml.NVML_ERROR_NO_PERMISSION: "no_permission", pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "driver_not_loaded",
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: "library_not_found",
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: "driver_library_mismatch"}


def test_throttle_reason_bits_are_nvmls() -> None:
    names = {"gpu_idle": "GpuIdle", "applications_clocks_setting": "ApplicationsClocksSetting",
             "sw_power_cap": "SwPowerCap", "hw_slowdown": "HwSlowdown", "sync_boost": "SyncBoost",
             "sw_thermal_slowdown": "SwThermalSlowdown", "hw_thermal_slowdown": "HwThermalSlowdown",
             "hw_power_brake_slowdown": "HwPowerBrakeSlowdown", "display_clock_setting": "DisplayClockSetting"}
    for bit, name in inventory.THROTTLE_REASON_BITS.items():
        assert getattr(pynvml, "nvmlClocksThrottleReason" + names[name]) == bit, name


@pytest.mark.parametrize(("struct", "fields"), [
    ("c_nvmlEventData_t", {"device", "eventType", "eventData"}),  # wait_events
    ("c_nvmlProcessInfo_t", {"pid", "usedGpuMemory"}),  # processes
    ("nvmlPciInfo_t", {"busId"}),  # identities, the doctor's inventory
    ("c_nvmlUtilization_t", {"gpu", "memory"}),
    ("c_nvmlMemory_t", {"total", "used"}),
])
def test_struct_fields_read_exist(struct: str, fields: set[str]) -> None:
    assert fields <= {name for name, *_ in getattr(pynvml, struct)._fields_}


def test_this_machine_without_a_driver_gets_a_note_not_an_exception() -> None:
    source = nvml.NvmlTelemetrySource()
    note = source.open()
    if note is None:  # a real NVIDIA machine: the identities come back whole
        try:
            assert all(g.pci_bus_id and g.minor is not None for g in source.identities())
        finally:
            source.close()
    else:
        assert note.startswith("no GPU telemetry")
        assert source.identities() == [] and source.processes() == [] and source.sample(0.0) == []

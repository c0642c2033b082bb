"""The real sampler and the real NVML source, driven by a fake `pynvml` module."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from gpufix.telemetry import sampler as sampler_mod
from gpufix.telemetry.nvml import NvmlTelemetrySource
from gpufix.telemetry.replay import read_telemetry
from gpufix.telemetry.sampler import TelemetrySampler
from tests.telemetry.fake_nvml import DRIVER_NOT_LOADED, FakeNvml


def _run(fake: FakeNvml, path: Path, seconds: float = 0.6, interval: float = 0.1) -> TelemetrySampler:
    s = TelemetrySampler(lambda: NvmlTelemetrySource(fake), str(path), interval_s=interval, process_every_s=0.2)
    s.start(os.getpid())
    time.sleep(seconds)
    s.stop()
    return s


def _wait_for(cond, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


def test_source_reads_every_field_with_units() -> None:
    source = NvmlTelemetrySource(FakeNvml(gpus=2))
    assert source.open() is None
    first = source.sample(123.0)
    assert [s.gpu for s in first] == [0, 1]
    s0 = first[0].to_dict()
    assert s0 == {"t": 123.0, "gpu": 0, "util_gpu_pct": 90, "util_mem_pct": 40, "memory_used_mib": 30000,
                  "memory_total_mib": 81559, "power_w": 412.3, "power_limit_w": 700.0, "temperature_c": 71,
                  "sm_clock_mhz": 1980, "throttle_reasons": ["sw_power_cap", "hw_thermal_slowdown"],
                  "pcie_gen": 5, "pcie_width": 16, "ecc_uncorrected": 0, "pcie_gen_max": 5, "pcie_width_max": 16}


def test_unsupported_call_is_a_missing_value_asked_once_listed_once() -> None:
    fake = FakeNvml(gpus=1, unsupported=("nvmlDeviceGetPowerUsage",))
    source = NvmlTelemetrySource(fake)
    assert source.open() is None
    for _ in range(5):
        sample = source.sample(time.time())[0]
        assert sample.power_w is None and sample.util_gpu_pct == 90
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1  # remembered: never asked again
    assert source.problems() == ["GPU0 nvmlDeviceGetPowerUsage: Not Supported"]


def test_sampler_writes_gpus_xids_processes_and_host(tmp_path: Path) -> None:
    fake = FakeNvml(gpus=2, xids=[(1, 79)], pids=(os.getpid(),))
    path = tmp_path / "telemetry.jsonl"
    s = _run(fake, path)
    data = read_telemetry(str(path))
    assert data.gpus() == [0, 1] and len(data.samples) >= 6
    assert [(x.gpu, x.xid) for x in data.xids] == [(1, 79)]
    users = data.processes[0][1]
    assert [(u.gpu, u.pid, u.used_mib) for u in users] == [(0, os.getpid(), 2048)]  # pid 1 is not the job's
    assert s.job_gpus == frozenset({0})
    assert data.host and data.host[-1][1]["rss_mib"] > 0 and "cpu_pct" in data.host[-1][1]
    # the host's memory beside the tree's: what the out-of-memory killer acts on (DAT019, DAT020, GEN024)
    host = data.host[-1][1]
    assert 0 <= host["avail_mib"] <= host["total_mib"] and host["total_mib"] > 0
    assert json.loads(path.read_text().splitlines()[-1])["end"] is True
    assert s.notes == [] and fake.shutdown_called


def test_nvml_init_failure_is_one_note_and_host_sampling_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.jsonl"
    s = _run(FakeNvml(init_error=DRIVER_NOT_LOADED), path, seconds=0.35)
    assert s.notes == ["no GPU telemetry: NVML did not initialise (Driver Not Loaded)"]
    data = read_telemetry(str(path))
    assert data.notes == tuple(s.notes) and not data.samples and data.host


def test_a_hanging_nvml_call_is_abandoned_and_noted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampler_mod, "STALL_AFTER_S", 0.3)
    fake = FakeNvml(gpus=1, hang="nvmlDeviceGetUtilizationRates")
    path = tmp_path / "telemetry.jsonl"
    s = TelemetrySampler(lambda: NvmlTelemetrySource(fake), str(path), interval_s=0.1)
    s.start(os.getpid())
    try:
        assert _wait_for(s.stalled, 3.0)
        started = time.monotonic()
        s.stop()
        assert time.monotonic() - started < sampler_mod.STOP_JOIN_S + 0.5
        assert len(s.notes) == 1 and "has not returned" in s.notes[0]
        assert "has not returned" in path.read_text()
    finally:
        fake.release.set()


def test_gpu_lost_mid_run_is_noted_once_and_the_other_gpu_goes_on(tmp_path: Path) -> None:
    fake = FakeNvml(gpus=2, lose_gpu_after=(1, 4))
    path = tmp_path / "telemetry.jsonl"
    s = _run(fake, path, seconds=0.8)
    assert s.notes == ["GPU 1 stopped answering NVML mid-run (lost, or fallen off the bus); its telemetry ends here"]
    data = read_telemetry(str(path))
    assert data.samples[-1].gpu == 0 and max(x.t for x in data.samples if x.gpu == 1) < data.samples[-1].t


def test_interval_has_a_floor() -> None:
    assert TelemetrySampler(lambda: None, None, interval_s=0.001).interval_s == sampler_mod.MIN_INTERVAL_S  # type: ignore[arg-type, return-value]


def test_no_nvml_on_this_machine_degrades_without_a_crash(tmp_path: Path) -> None:
    """The real source, no fake: here there is no driver (or no pynvml); a note, host lines, no raise."""
    from gpufix.watchdog.monitor import JobMonitor

    printed: list[str] = []
    monitor = JobMonitor(0.1, 0, "wait", str(tmp_path), note=printed.append)
    started = time.monotonic()
    monitor.start(type("Job", (), {"pid": os.getpid(), "pgid": None})())
    assert time.monotonic() - started < 0.1  # start() never waits for NVML
    time.sleep(0.3)
    monitor.stop()
    notes = monitor.notes
    if notes:
        assert notes[0].startswith("no GPU telemetry") and len(notes) == 1
        assert printed == []  # a machine without an NVIDIA stack is not news on every run
    assert read_telemetry(str(tmp_path / "telemetry.jsonl")).host


def test_sampler_names_each_gpu_once_for_xids_and_device_files(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.jsonl"
    _run(FakeNvml(gpus=2, minors={0: 4, 1: 5}), path, seconds=0.3)
    data = read_telemetry(str(path))
    assert [g.to_dict() for g in data.identities] == [
        {"gpu": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-00000000-fake", "pci_bus_id": "00000000:18:00.0", "minor": 4},
        {"gpu": 1, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-00000001-fake", "pci_bus_id": "00000000:19:00.0", "minor": 5}]
    assert sum('"gpus"' in line for line in path.read_text().splitlines()) == 1


def test_device_files_find_the_jobs_gpu_when_the_driver_lists_other_pids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A container: NVML names host PIDs (here pid 1 on each GPU); the job holds /dev/nvidia5 open = GPU 1.
    asked: list[list[int]] = []

    def minors(pids: list[int]) -> set[int]:
        asked.append(list(pids))
        return {5, 77}  # 77: a device this NVML does not list (another container's view): ignored

    monkeypatch.setattr(sampler_mod, "gpu_device_minors", minors)
    path = tmp_path / "telemetry.jsonl"
    s = _run(FakeNvml(gpus=2, minors={0: 4, 1: 5}), path, seconds=0.5)
    assert s.job_gpus == frozenset({1})
    assert asked and asked[0][0] == os.getpid()
    lines = [json.loads(line) for line in path.read_text().splitlines() if '"processes"' in line]
    assert lines[0]["processes"] == [] and lines[0]["device_files"] == [1] and lines[0]["other_processes"] == 2


def test_matched_pids_need_no_device_file_scan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampler_mod, "gpu_device_minors", lambda pids: pytest.fail("scanned /proc fds needlessly"))
    s = _run(FakeNvml(gpus=2, pids=(os.getpid(),)), tmp_path / "telemetry.jsonl", seconds=0.3)
    assert s.job_gpus == frozenset({0})

"""Fakes for doctor tests: NVML inventories, host facts and fake target interpreters."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from gpufix.doctor.core import run_doctor
from gpufix.doctor.facts import DiskSpace, HostFacts, KernelLog, ShmInfo, parse_xids
from gpufix.doctor.model import CheckResult, DoctorReport
from gpufix.telemetry import GpuInventory
from gpufix.telemetry.fake import FakeInventorySource

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "doctor"
GIB = 1024**3


def load_inventory(name: str) -> GpuInventory:
    return FakeInventorySource.from_json(FIX / "inventories" / f"{name}.json").inventory()


NO_NVML = FakeInventorySource.absent().inventory()


def make_host(**overrides: Any) -> HostFacts:
    """A healthy bare-metal host unless told otherwise."""
    values: dict[str, Any] = dict(
        env={}, shm=ShmInfo("/dev/shm", 32 * GIB, 32 * GIB), cpu_count=32, cpu_usable=32,
        disk=DiskSpace("/work", 1000 * GIB, 500 * GIB), container=None,
        device_nodes=("/dev/nvidia0", "/dev/nvidiactl"), nvml_libraries=("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",),
        kernel_log=KernelLog(True, "dmesg", None, parse_xids((FIX / "kernel_logs" / "clean.log").read_text())),
    )
    values.update(overrides)
    return HostFacts(**values)


def write_exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def fake_python(tmp_path: Path) -> Callable[[str | dict[str, Any]], str]:
    """fake_python('cpu_only_torch') or fake_python({...answers...}) -> path of an executable stand-in."""
    counter = [0]

    def make(answers: str | dict[str, Any]) -> str:
        counter[0] += 1
        if isinstance(answers, dict):
            path = tmp_path / f"answers{counter[0]}.json"
            path.write_text(json.dumps(answers))
        else:
            path = FIX / "probes" / f"{answers}.json"
        exe = tmp_path / f"python{counter[0]}"
        return str(write_exe(exe, f'#!/bin/sh\nexec "{sys.executable}" "{FIX / "fake_python.py"}" "{path}" "$@"\n'))

    return make


@pytest.fixture
def fake_torch_python(tmp_path: Path) -> Callable[[dict[str, Any]], str]:
    """A real interpreter whose `torch` is fixtures/doctor/fake_site/torch, configured by a dict."""
    counter = [0]

    def make(config: dict[str, Any]) -> str:
        counter[0] += 1
        cfg = tmp_path / f"torch{counter[0]}.json"
        cfg.write_text(json.dumps(config))
        exe = tmp_path / f"torchpython{counter[0]}"
        return str(write_exe(exe, "#!/bin/sh\n"
                                  f'PYTHONPATH="{FIX / "fake_site"}" GPUFIX_FAKE_TORCH_CONFIG="{cfg}" '
                                  f'exec "{sys.executable}" -s "$@"\n'))

    return make


def doctor(inv: GpuInventory | str, python: str, host: HostFacts | None = None, quick: bool = False,
           probe_timeout_s: float = 30.0, smoke_timeout_s: float = 30.0) -> DoctorReport:
    if isinstance(inv, str):
        inv = load_inventory(inv)
    return run_doctor(python=python, quick=quick, source=FakeInventorySource(inv), host=host or make_host(),
                      probe_timeout_s=probe_timeout_s, smoke_timeout_s=smoke_timeout_s)


def by_id(report: DoctorReport) -> dict[str, CheckResult]:
    return {c.id: c for c in report.checks}


def text_of(c: CheckResult) -> str:
    return "\n".join(c.evidence) + "\n" + (c.fix or "")

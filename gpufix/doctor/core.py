"""`run_doctor`: collect the facts (NVML, host, target-interpreter probe), run the checks, build the report.

Every reader is injectable, so tests run the whole pipeline on fakes; nothing here raises for a
missing driver, a broken interpreter or an unreadable log. The NVML snapshot is taken before the
probe starts, so the probe's own CUDA context never shows up as a "foreign process".
"""

from __future__ import annotations

import os
import sys
from typing import Callable

from gpufix.doctor.checks import run_checks, smoke_skip_reason
from gpufix.doctor.facts import HostFacts, HostReaders, collect_host_facts
from gpufix.doctor.model import DoctorReport
from gpufix.doctor.interpreter import INSPECT_TIMEOUT_S, SMOKE_TIMEOUT_S, InterpreterReport, inspect_interpreter
from gpufix.errors import GpufixError
from gpufix.telemetry import InventorySource

ProbeRunner = Callable[[str, str, float], InterpreterReport]


def _default_runner(python: str, mode: str, timeout_s: float) -> InterpreterReport:
    return inspect_interpreter(python, mode, timeout_s)


def resolve_python(python: str | None) -> str:
    """The target interpreter: `--python PATH` (checked to exist and be executable) or this one."""
    if python is None:
        return sys.executable
    if os.sep not in python:
        import shutil

        found = shutil.which(python)
        if found:
            return found
    if not os.path.exists(python):
        raise GpufixError(f"--python {python}: no such file", hint="pass the path of the interpreter your training runs with")
    if os.path.isdir(python) or not os.access(python, os.X_OK):
        raise GpufixError(f"--python {python}: not an executable file", hint="e.g. --python .venv/bin/python")
    return python


def _run_info(result: InterpreterReport) -> dict[str, object]:
    return {"ok": result.ok, "error": result.error, "timed_out": result.timed_out, "stuck_in": result.stuck_in,
            "returncode": result.returncode, "duration_s": result.duration_s}


def python_summary(probe: InterpreterReport, smoke: InterpreterReport | None) -> dict[str, object]:
    """The `python` object of the JSON report: interpreter, probe run, torch/tensorflow/jax, smoke."""
    info: dict[str, object] = {"interpreter": probe.interpreter, **(probe.section("python") or {})}
    info["probe"] = _run_info(probe)
    for name in ("torch", "tensorflow", "jax"):
        info[name] = probe.section(name)
    info["smoke"] = None if smoke is None else {**_run_info(smoke), **(smoke.section("smoke") or {})}
    return info


def run_doctor(
    python: str | None = None,
    quick: bool = False,
    source: InventorySource | None = None,
    readers: HostReaders | None = None,
    host: HostFacts | None = None,
    runner: ProbeRunner | None = None,
    probe_timeout_s: float = INSPECT_TIMEOUT_S,
    smoke_timeout_s: float = SMOKE_TIMEOUT_S,
) -> DoctorReport:
    """Run every check and return the report (raises GpufixError only for a bad `--python`)."""
    interpreter = resolve_python(python)
    if source is None:
        from gpufix.telemetry.nvml import NvmlInventorySource

        source = NvmlInventorySource()
    inv = source.inventory()
    host = host or collect_host_facts(readers)
    runner = runner or _default_runner
    probe = runner(interpreter, "probe", probe_timeout_s)
    why = smoke_skip_reason(quick, probe)
    smoke = runner(interpreter, "smoke", smoke_timeout_s) if why is None else None
    checks = run_checks(inv, host, probe, smoke, why)
    python_info = python_summary(probe, smoke)
    driver = {k: v for k, v in inv.to_dict().items() if k != "gpus"}
    return DoctorReport(checks, tuple(g.to_dict() for g in inv.gpus), driver, python_info, host.to_dict())

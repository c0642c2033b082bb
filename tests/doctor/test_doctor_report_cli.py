"""Rendering (text, stable JSON, Markdown) and the real `gpufix doctor` command on this machine."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys

import pytest

from gpufix.doctor.checks import CHECK_IDS
from gpufix.report.doctor import render, render_json, render_text

from .conftest import doctor

STATUSES = {"pass", "warn", "fail", "skipped"}


def nvml_loadable() -> bool:
    from gpufix.telemetry import read_inventory

    return read_inventory().available


def test_json_schema_is_stable(fake_python) -> None:
    data = json.loads(render_json(doctor("sick_node", fake_python("torch_cu124"), quick=True)))
    assert list(data) == ["version", "summary", "checks", "gpus", "driver", "python", "host"]
    assert data["version"] == 1
    assert list(data["summary"]) == ["pass", "warn", "fail", "skipped", "exit_code"]
    assert sum(data["summary"][s] for s in STATUSES) == len(data["checks"]) == len(CHECK_IDS)
    assert [c["id"] for c in data["checks"]] == list(CHECK_IDS)
    for c in data["checks"]:
        assert list(c) == ["id", "title", "status", "evidence", "fix", "details"] and c["status"] in STATUSES
        assert isinstance(c["evidence"], list) and isinstance(c["details"], dict)
        assert (c["fix"] is not None) == (c["status"] in ("warn", "fail")), c["id"]
    assert data["summary"]["exit_code"] == 1
    gpu = data["gpus"][0]
    for key in ("index", "name", "uuid", "memory_total_mib", "compute_capability", "persistence_mode", "ecc_mode_current",
                "remapped_rows_pending", "retired_pages_dbe", "throttle_reasons", "temperature_c", "pcie_gen", "pcie_gen_max",
                "pcie_width", "pcie_width_max", "processes"):
        assert key in gpu
    assert gpu["processes"] == [{"pid": 4242, "name": "python train_yesterday.py", "used_mib": 30000, "kind": "compute"}]
    assert data["driver"]["cuda_driver_version_str"] == "12.2"
    assert data["python"]["torch"]["cuda"] == "12.4" and data["python"]["probe"]["ok"] is True
    assert data["python"]["smoke"] is None
    assert data["host"]["kernel_log"]["readable"] is True


def test_text_and_markdown(fake_python) -> None:
    report = doctor("sick_node", fake_python("torch_cu124"), quick=True)
    plain = render_text(report)
    assert "[" not in plain.split("\n")[2][:6]  # no rich markup in plain mode
    assert "FAIL  ECC mode and uncorrectable errors" in plain and "fix: " in plain
    assert plain.rstrip().endswith("something will fail")
    md = render(report, "markdown")
    assert md.startswith("## gpufix doctor: driver 535.104.05, 1 GPU(s)") and "| ❌ fail | ECC mode" in md
    assert "## What to fix" in md and "**Fix:**" in md


def test_colour_text_is_valid_rich_markup(fake_python) -> None:
    from rich.console import Console

    report = doctor("sick_node", fake_python("crash_in_torch"), quick=True)
    buf = io.StringIO()
    Console(file=buf, force_terminal=True, width=200).print(render_text(report, color=True))
    out = buf.getvalue()
    assert "\x1b[" in out and "FAIL" in out and "[/]" not in out


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpufix", "doctor", *args], capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1", "HOME": "/tmp"})


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has an NVIDIA driver")
def test_real_run_without_gpu_fails_the_driver_check() -> None:
    proc = run_cli("--quick")
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "FAIL  NVIDIA driver (NVML)" in proc.stdout and "NVML could not be loaded" in proc.stdout
    js = run_cli("--quick", "--format", "json")
    data = json.loads(js.stdout)
    assert js.returncode == 1 and by_id_json(data)["driver"]["status"] == "fail"
    assert by_id_json(data)["smoke"]["status"] == "skipped" and by_id_json(data)["gpus"]["status"] == "skipped"


def by_id_json(data: dict) -> dict:
    return {c["id"]: c for c in data["checks"]}


def test_real_run_never_tracebacks() -> None:
    proc = run_cli("--quick", "--format", "markdown")
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stdout + proc.stderr
    assert proc.returncode == (0 if nvml_loadable() and "❌" not in proc.stdout else 1)


def test_cli_with_a_fake_interpreter(fake_python) -> None:
    proc = run_cli("--quick", "--format", "json", "--python", fake_python("cpu_only_torch"))
    data = json.loads(proc.stdout)
    assert data["python"]["torch"]["version"] == "2.3.1+cpu" and data["summary"]["exit_code"] == proc.returncode


def test_cli_usage_errors_exit_2(tmp_path) -> None:
    proc = run_cli("--python", str(tmp_path / "missing"))
    assert proc.returncode == 2 and "gpufix: error: --python" in proc.stderr and "Traceback" not in proc.stderr
    assert run_cli("--format", "yaml").returncode == 2
    help_text = subprocess.run([sys.executable, "-m", "gpufix", "--help"], capture_output=True, text=True).stdout
    assert "doctor" in help_text and "Pre-flight check" in help_text


@pytest.mark.gpu
def test_real_smoke_test_on_a_gpu() -> None:
    """Full doctor with the smoke test, in an interpreter that has CUDA torch (GPUFIX_TORCH_PYTHON or this one)."""
    import os

    if shutil.which("nvidia-smi") is None:
        pytest.skip("no nvidia-smi")
    python = os.environ.get("GPUFIX_TORCH_PYTHON", sys.executable)
    has_torch = subprocess.run([python, "-c", "import torch; assert torch.cuda.is_available()"], capture_output=True)
    if has_torch.returncode != 0:
        pytest.skip(f"{python} has no CUDA torch")
    proc = subprocess.run([sys.executable, "-m", "gpufix", "doctor", "--format", "json", "--python", python],
                          capture_output=True, text=True, timeout=600)
    data = json.loads(proc.stdout)
    checks = by_id_json(data)
    assert checks["driver"]["status"] == "pass" and checks["torch"]["status"] == "pass"
    assert checks["smoke"]["status"] == "pass", checks["smoke"]
    assert data["python"]["smoke"]["devices"][0]["train_step_ms"] > 0


def test_saved_report_replays_as_a_fake_inventory(fake_python) -> None:
    from gpufix.telemetry.fake import FakeInventorySource

    from .conftest import load_inventory

    data = json.loads(render_json(doctor("sick_node", fake_python("no_framework"), quick=True)))
    replay = FakeInventorySource.from_dict({**data["driver"], "gpus": data["gpus"]}).inventory()
    assert replay == load_inventory("sick_node")

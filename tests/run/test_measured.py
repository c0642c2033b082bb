"""Real CPU training scripts under `gpufix run`: the probe measures them and gpufix diagnoses
each from the numbers (no exception is raised by any of them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FIXTURES

pytest.importorskip("torch")

SCRIPTS = FIXTURES / "training"


def run_script(name: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess[bytes], dict]:
    result = subprocess.run([sys.executable, "-m", "gpufix", "run", "--record-dir", str(tmp_path), str(SCRIPTS / name)],
                            capture_output=True, timeout=180)
    (record,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    return result, json.loads((record / "result.json").read_text())


@pytest.mark.parametrize(
    ("script", "code", "words"),
    [
        ("slow_loader_cpu.py", "DAT010", b"of each training step waiting for the next batch (median), with num_workers=0"),
        ("memory_creep_cpu.py", "MEM021", b"resident host memory grew by"),
        ("excessive_print_cpu.py", "PRF010", b"KiB of output per second"),
    ],
)
def test_measured_problem_is_diagnosed_with_its_numbers(tmp_path: Path, script: str, code: str, words: bytes) -> None:
    result, doc = run_script(script, tmp_path)
    assert result.returncode == 0  # the job itself succeeded; gpufix keeps its status
    assert b"gpufix: the job succeeded, but its measurements show a problem" in result.stderr
    assert code.encode() in result.stderr and words in result.stderr, result.stderr.decode()[-2000:]
    assert doc["findings"][0]["code"] == code


def test_healthy_script_gets_nothing(tmp_path: Path) -> None:
    result, doc = run_script("healthy_cpu.py", tmp_path)
    # gpufix adds no byte: stderr is the bare job's own (torch may warn, e.g. without numpy)
    bare = subprocess.run([sys.executable, str(SCRIPTS / "healthy_cpu.py")], capture_output=True, timeout=180)
    assert result.returncode == 0 and result.stderr == bare.stderr
    assert result.stdout == bare.stdout
    assert doc["findings"] == []

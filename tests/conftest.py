"""Shared test helpers. No test needs a GPU; `@pytest.mark.gpu` tests skip without one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
CORPUS = ROOT.parent / "shared" / "corpus"


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test session gets its own rule cache; user rule paths never leak in."""
    cache = tmp_path_factory.getbasetemp() / "gpufix-cache"
    monkeypatch.setenv("GPUFIX_CACHE_DIR", str(cache))
    monkeypatch.delenv("GPUFIX_RULES_PATH", raising=False)
    monkeypatch.delenv("NO_COLOR", raising=False)


def run_gpufix(*args: str, stdin: bytes | None = None, env: dict[str, str] | None = None,
               cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    """Run `python -m gpufix ARGS` as a user would, capturing bytes."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "gpufix", *args],
        input=stdin if stdin is not None else b"",
        capture_output=True, env=full_env, cwd=cwd or ROOT, timeout=timeout,
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if shutil.which("nvidia-smi") and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (nvidia-smi -L failed or is missing)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

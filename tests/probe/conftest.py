"""Helpers for the probe tests: run real scripts with and without the probe, in parallel.

Each job is a real child interpreter, as `gpufix run` would start it: the probe on means
PYTHONPATH=<gpufix/probe/inject> (plus whatever the test adds after it) and GPUFIX_PROBE_DIR.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import pytest

from gpufix.probe import INJECT_DIR, probe_environment
from tests.conftest import FIXTURES

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"
USER_SITE = HERE / "user_site"
TRAINING = FIXTURES / "training"


class Job(NamedTuple):
    returncode: int
    stdout: bytes
    stderr: bytes
    probe_dir: Path


def run_job(script: Path | str, tmp: Path, probe: bool = True, user_site: bool = False,
            extra_env: dict[str, str] | None = None, args: tuple[str, ...] = (), timeout: float = 120) -> Job:
    """Run `python SCRIPT` (or `python -c CODE` for a str starting with 'code:')."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "GPUFIX_PROBE_DIR", "GPUFIX_MEMORY_HISTORY", "PYTHONFAULTHANDLER")}
    if user_site:
        env["PYTHONPATH"] = str(USER_SITE)
    probe_dir = tmp / "probe"
    if probe:
        env = probe_environment(env, probe_dir)
    env.update(extra_env or {})
    if isinstance(script, str) and script.startswith("code:"):
        argv = [sys.executable, "-c", script[len("code:"):], *args]
    else:
        argv = [sys.executable, str(script), *args]
    tmp.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(argv, capture_output=True, env=env, cwd=tmp, timeout=timeout)
    return Job(done.returncode, done.stdout, done.stderr, probe_dir)


class Jobs:
    """Named jobs, started together on first use (2-3 at a time) and awaited one by one."""

    def __init__(self, base: Path, specs: dict[str, Callable[[Path], Job]]) -> None:
        self.base = base
        self.specs = specs
        self.pool: ThreadPoolExecutor | None = None
        self.futures: dict[str, Future[Job]] = {}

    def __getitem__(self, name: str) -> Job:
        if self.pool is None:
            self.pool = ThreadPoolExecutor(max_workers=3)
            self.futures = {n: self.pool.submit(spec, self.base / n) for n, spec in self.specs.items()}
        return self.futures[name].result()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)


def _spec(script: Path | str, **kwargs: object) -> Callable[[Path], Job]:
    return lambda tmp: run_job(script, tmp, **kwargs)  # type: ignore[arg-type]


JOB_SPECS: dict[str, Callable[[Path], Job]] = {
    "healthy": _spec(TRAINING / "healthy_cpu.py"),
    "healthy-bare": _spec(TRAINING / "healthy_cpu.py", probe=False),
    "slow-loader": _spec(TRAINING / "slow_loader_cpu.py"),
    "memory-creep": _spec(TRAINING / "memory_creep_cpu.py"),
    "excessive-print": _spec(TRAINING / "excessive_print_cpu.py"),
    "chain": _spec(SCRIPTS / "chain_error.py", user_site=True),
    "chain-bare": _spec(SCRIPTS / "chain_error.py", probe=False, user_site=True),
    "worker": _spec(SCRIPTS / "worker_error.py"),
    "worker-bare": _spec(SCRIPTS / "worker_error.py", probe=False),
    "fake-cuda": _spec(SCRIPTS / "fake_cuda.py"),
    "fake-cuda-events": _spec(SCRIPTS / "fake_cuda_events.py"),
    "framework": _spec(SCRIPTS / "framework_standin.py"),
    "broken-probe-dir": _spec(TRAINING / "healthy_cpu.py", extra_env={"GPUFIX_PROBE_DIR": "/dev/null/probe"}),
}
if importlib.util.find_spec("lightning") or importlib.util.find_spec("pytorch_lightning"):
    JOB_SPECS["lightning"] = _spec(SCRIPTS / "lightning_fit.py")


@pytest.fixture(scope="session")
def jobs(tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("torch")
    runner = Jobs(tmp_path_factory.mktemp("probe-jobs"), JOB_SPECS)
    yield runner
    runner.close()


__all__ = ["INJECT_DIR", "Job", "Jobs", "SCRIPTS", "TRAINING", "USER_SITE", "run_job"]

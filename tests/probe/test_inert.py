"""The probe's sitecustomize: inert without torch or without GPUFIX_PROBE_DIR, and always chained
to the user's own sitecustomize. These jobs never import torch, so they run in milliseconds."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.probe.conftest import INJECT_DIR, USER_SITE, run_job

REPORT = (
    "import sys, json; print(json.dumps({"
    "'sitecustomize': getattr(sys.modules.get('sitecustomize'), '__file__', None),"
    "'probe_loaded': '_gpufix_probe' in sys.modules,"
    "'watchers': [type(f).__name__ for f in sys.meta_path if type(f).__module__.startswith('_gpufix_probe')],"
    "'torch': 'torch' in sys.modules}))"
)


def _report(job) -> dict:
    import json

    assert job.returncode == 0, job.stderr.decode()
    return json.loads(job.stdout)


def test_a_job_that_never_imports_torch_leaves_no_probe_file(tmp_path: Path) -> None:
    job = run_job("code:" + REPORT, tmp_path)
    report = _report(job)
    assert report["probe_loaded"] is True and report["watchers"] == ["_Watcher"]  # armed, waiting
    assert report["torch"] is False
    assert not job.probe_dir.exists() or not any(job.probe_dir.iterdir())
    assert job.stderr == b""


def test_without_gpufix_probe_dir_nothing_is_loaded(tmp_path: Path) -> None:
    job = run_job("code:" + REPORT, tmp_path, probe=False,
                  extra_env={"PYTHONPATH": str(INJECT_DIR)})
    report = _report(job)
    assert report["probe_loaded"] is False and report["watchers"] == []


def test_the_users_sitecustomize_still_runs_and_stays_the_module(tmp_path: Path) -> None:
    probed = run_job("code:" + REPORT, tmp_path / "a", user_site=True)
    bare = run_job("code:" + REPORT, tmp_path / "b", probe=False, user_site=True)
    assert _report(probed)["sitecustomize"] == _report(bare)["sitecustomize"] == str(USER_SITE / "sitecustomize.py")
    assert probed.stderr == bare.stderr == b"user sitecustomize ran\n"


def test_a_failing_user_sitecustomize_is_reported_as_python_would(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("raise ValueError('broken site config')\n")
    env = {"PYTHONPATH": str(site)}
    bare = run_job("code:print('ran')", tmp_path / "b", probe=False, extra_env=env)
    probed = run_job("code:print('ran')", tmp_path / "a", extra_env={"PYTHONPATH": f"{INJECT_DIR}:{site}"})
    assert bare.stdout == probed.stdout == b"ran\n"
    assert probed.stderr == bare.stderr
    assert b"broken site config" in bare.stderr


def test_probe_environment_keeps_the_users_pythonpath() -> None:
    from gpufix.probe import probe_environment

    env = probe_environment({"PYTHONPATH": "/a::/b", "X": "1"}, "/rec/probe")
    assert env["PYTHONPATH"] == f"{INJECT_DIR}:/a::/b"
    assert env["GPUFIX_PROBE_DIR"] == "/rec/probe" and env["X"] == "1"
    assert "GPUFIX_MEMORY_HISTORY" not in env
    assert probe_environment({}, "/p", memory_history=True)["GPUFIX_MEMORY_HISTORY"] == "1"
    assert probe_environment({}, "/p")["PYTHONPATH"] == str(INJECT_DIR)


def test_importing_gpufix_probe_imports_neither_torch_nor_the_injected_code() -> None:
    import subprocess

    code = ("import sys, gpufix.probe, gpufix.probe.read; "
            "print('torch' in sys.modules, '_gpufix_probe' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]

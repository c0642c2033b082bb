"""A non-editable install (the wheel) carries the rule pack and works outside the checkout."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, ROOT


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, dict[str, str]]:
    """gpufix's wheel in a fresh venv: (python, bin folder, site-packages, environment). Its dependencies
    (and torch, for jobs) come from the test environment's site-packages; nothing else is installed:
    no py-spy on PATH or beside the interpreter."""
    tmp_path = tmp_path_factory.mktemp("fresh")
    wheel_dir = tmp_path / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheel_dir), str(ROOT)],
        capture_output=True, timeout=600,
    )
    assert build.returncode == 0, build.stderr.decode()[-2000:]
    wheel = next(wheel_dir.glob("gpufix-*.whl"))

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    bin_dir = env_dir / "bin"
    py = bin_dir / "python"
    target = Path(subprocess.check_output([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True).strip())
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)]
        if _pip_has_python_option() else
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        capture_output=True, timeout=300,
    )
    assert install.returncode == 0, install.stderr.decode()[-2000:]
    # Dependencies (click, re2, yaml...) come from the test environment's site-packages; gpufix
    # itself only from the wheel (the checkout's editable hook is a .pth, not processed this way).
    deps = [p for p in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()} if Path(p).is_dir()]
    (target / "zz_test_deps.pth").write_text("\n".join(deps) + "\n")

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GPUFIX_RULES_PATH")}
    env["GPUFIX_CACHE_DIR"] = str(tmp_path / "cache")
    env["PATH"] = os.pathsep.join([str(bin_dir), "/usr/bin", "/bin"])  # not the test environment's bin (py-spy)
    return py, bin_dir, target, env


@pytest.mark.slow
def test_wheel_in_a_fresh_venv_finds_the_rules(fresh: tuple[Path, Path, Path, dict[str, str]], tmp_path: Path) -> None:
    py, bin_dir, target, env = fresh
    where = subprocess.run(
        [py, "-c", "import gpufix, gpufix.rules.loader as l; print(gpufix.__file__); print(l.builtin_rules_dir())"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60,
    )
    assert where.returncode == 0, where.stderr
    module_file, rules_dir = where.stdout.split()
    assert module_file.startswith(str(target)) and rules_dir.startswith(str(target))
    assert Path(rules_dir, "memory").is_dir()

    explain = subprocess.run(
        [bin_dir / "gpufix", "explain", str(FIXTURES / "quickstart" / "oom-traceback.txt")],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60,
    )
    assert explain.returncode == 1, explain.stderr
    assert "MEM001" in explain.stdout
    listing = subprocess.run([py, "-m", "gpufix", "rules", "list"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
    assert listing.returncode == 0 and "MEM001" in listing.stdout


@pytest.mark.slow
def test_a_hung_job_gets_python_stacks_without_py_spy(fresh: tuple[Path, Path, Path, dict[str, str]],
                                                      tmp_path: Path) -> None:
    """Issue 13: with only gpufix installed, the probe's own dumps give every rank's Python frames and
    the stuck rank is named with its line."""
    pytest.importorskip("torch.distributed")
    from tests.watchdog.test_stuck_rank import STUCK_JOB

    py, bin_dir, _target, env = fresh
    check = subprocess.run([py, "-c", "from gpufix.watchdog.stacks import pyspy_path; print(pyspy_path())"],
                           capture_output=True, text=True, env=env, timeout=60)
    assert check.stdout.strip() == "None", check  # the point of the test: no py-spy to be found
    (tmp_path / "stuck.py").write_text(STUCK_JOB)
    done = subprocess.run([bin_dir / "gpufix", "run", "--record-dir", "runs", "--hang-timeout", "6", "--on-hang", "kill",
                           "--", py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "stuck.py"],
                          cwd=tmp_path, capture_output=True, env=env, timeout=240)
    err = done.stderr.decode()
    assert "HNG007 Rank 1" in err and "wait_for_flag (stuck.py:8)" in err, err[-3000:]
    (record,) = (tmp_path / "runs").iterdir()
    dumps = "".join(p.read_text() for p in (record / "stacks").glob("*-probe.txt"))
    assert 'File "' in dumps and "in wait_for_flag" in dumps and "in all_reduce" in dumps


def _pip_has_python_option() -> bool:
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--help"], capture_output=True, text=True).stdout
    return "--python" in out

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


@pytest.mark.slow
def test_wheel_in_a_fresh_venv_finds_the_rules(tmp_path: Path) -> None:
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


def _pip_has_python_option() -> bool:
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--help"], capture_output=True, text=True).stdout
    return "--python" in out

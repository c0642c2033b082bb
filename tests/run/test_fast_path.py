"""`gpufix run` without click: the hand parser in entry.py agrees with the click command, and the
job starts before anything heavy is imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpufix import runner
from gpufix.cli.run import simple_args as simple_run_args
from tests.run.helpers import PY, env, records

# Plain invocations: the fast path must take them, with exactly the arguments click would pass.
PLAIN = [
    ["run", "true"],
    ["run", "--", "true"],
    ["run", "train.py", "--lr", "3e-4"],
    ["run", "--record-dir", "d", "train.py", "--help", "-v"],
    ["run", "--record-dir=d", "--", "python", "-m", "pkg.mod"],
    ["run", "--name", "n", "--no-record", "-v", "--", "sh", "-c", "exit 3"],
    ["run", "--name=my run", "--verbose", "train.py"],
    ["run", "-v", "--record-dir", "a", "--record-dir", "b", "--", "x"],  # the last one wins
    ["run", "--no-record", "--", "--", "x"],
    ["run", "--", "-"],
    ["run", "-"],
    ["run", "cmd", "--", "x"],
    ["run", "--name", "n", "--", "--name", "m"],
]
# Anything else is click's: help, errors, unusual spellings.
FOR_CLICK = [
    ["run"],
    ["run", "--"],
    ["run", "--help"],
    ["run", "-h"],
    ["run", "--name"],
    ["run", "--name", "n"],
    ["run", "--record-dir="],
    ["run", "--name", "-odd", "--", "x"],
    ["run", "-vv", "x"],
    ["run", "--unknown", "x"],
    ["run", "--no-record=1", "x"],
    ["run", "--verb", "x"],
    ["explain", "x"],
    [],
]


def _click_parse(args: list[str], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What the click command passes to runner.run_command for `gpufix ARGS`."""
    from gpufix.cli.app import cli

    seen: dict[str, Any] = {}

    def fake_run_command(command: list[str], after_dashdash: bool, **options: Any) -> None:
        seen.update(command=list(command), after_dashdash=after_dashdash, **options)
        raise SystemExit(0)

    monkeypatch.setattr(runner, "run_command", fake_run_command)
    with pytest.raises(SystemExit):
        cli.main(args=args, prog_name="gpufix", standalone_mode=True)
    return seen


@pytest.mark.parametrize("args", PLAIN, ids=lambda a: " ".join(a))
def test_fast_path_and_click_agree(args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    fast = simple_run_args(args)
    assert fast is not None
    assert fast == _click_parse(args, monkeypatch)


@pytest.mark.parametrize("args", FOR_CLICK, ids=lambda a: " ".join(a) or "(nothing)")
def test_anything_unusual_is_left_to_click(args: list[str]) -> None:
    assert simple_run_args(args) is None


def test_the_job_starts_before_click_or_anything_heavy_is_imported(tmp_path: Path) -> None:
    probe = (
        "import sys\n"
        "import gpufix.supervise.spawn as spawn\n"
        "real = spawn.spawn\n"
        "def spy(*a, **k):\n"
        f"    open({str(tmp_path / 'modules.txt')!r}, 'w').write('\\n'.join(sorted(sys.modules)))\n"
        "    return real(*a, **k)\n"
        "spawn.spawn = spy\n"
        "from gpufix.cli.entry import main\n"
        "main(sys.argv[1:])\n"
    )
    result = subprocess.run([PY, "-c", probe, "run", "--record-dir", str(tmp_path / "r"), "--", "true"],
                            capture_output=True, env=env())
    assert result.returncode == 0, result.stderr
    loaded = set((tmp_path / "modules.txt").read_text().split())
    assert "gpufix.runner" in loaded
    heavy = {"click", "dataclasses", "inspect", "typing", "json", "shutil", "gpufix.record.meta", "gpufix.redact",
             "gpufix.supervise.hooks", "yaml", "rich", "gpufix.cli.app"}
    assert not heavy & loaded
    (record,) = records(tmp_path / "r")
    assert json.loads((record / "meta.json").read_text())["status"] == "finished"


def test_the_click_path_still_runs_jobs(tmp_path: Path) -> None:
    # `--name -odd` is unusual enough for click; the job runs all the same.
    result = subprocess.run([PY, "-m", "gpufix", "run", "--record-dir", str(tmp_path / "r"), "--name", "-odd", "--",
                             "sh", "-c", "echo out; exit 4"], capture_output=True, env=env())
    assert (result.returncode, result.stdout) == (4, b"out\n")
    (record,) = records(tmp_path / "r")
    assert "-odd-" in record.name


def test_usage_errors_still_come_from_click(tmp_path: Path) -> None:
    result = subprocess.run([PY, "-m", "gpufix", "run", "--record-dir", str(tmp_path)], capture_output=True, env=env())
    assert result.returncode == 2 and b"Usage:" in result.stderr
    helped = subprocess.run([PY, "-m", "gpufix", "run", "--help"], capture_output=True, env=env())
    assert helped.returncode == 0 and b"--record-dir DIR" in helped.stdout


def test_job_argv_runs_a_script_with_this_python_unless_after_dashdash() -> None:
    assert runner.job_argv(("train.py", "-x"), after_dashdash=False) == [sys.executable, "train.py", "-x"]
    assert runner.job_argv(("train.py", "-x"), after_dashdash=True) == ["train.py", "-x"]
    assert runner.job_argv(("true",), after_dashdash=False) == ["true"]


def test_monitor_options_reach_the_runner_on_both_paths() -> None:
    from gpufix.cli.run import simple_args as simple_run_args

    parsed = simple_run_args(["run", "--interval", "0.5", "--hang-timeout=30", "--on-hang", "kill", "train.py"])
    assert parsed is not None
    assert (parsed["interval"], parsed["hang_timeout"], parsed["on_hang"]) == (0.5, 30.0, "kill")
    # Invalid values are left to click, which explains them.
    assert simple_run_args(["run", "--interval", "soon", "train.py"]) is None
    assert simple_run_args(["run", "--on-hang", "panic", "train.py"]) is None

"""A real deadlocked job under `gpufix run`: the watchdog dumps its stacks, the final diagnosis
names the lock wait from the dump (rules/hangs), and `--on-hang kill` ends the job."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.watchdog.helpers import DEADLOCK

def test_deadlock_is_dumped_diagnosed_and_killed(tmp_path: Path) -> None:
    script = tmp_path / "deadlock.py"
    script.write_text(DEADLOCK)
    result = subprocess.run(
        [sys.executable, "-m", "gpufix", "run", "--record-dir", str(tmp_path / "runs"), "--interval", "0.2",
         "--hang-timeout", "1.5", "--on-hang", "kill", str(script)],
        capture_output=True, timeout=120,
    )
    assert result.returncode == 143  # SIGTERM from --on-hang kill, as a shell reports it
    assert result.stdout == b"step 1 loss 2.31\n"
    err = result.stderr.decode()
    assert "gpufix: the job looks hung" in err
    assert "Root cause: A thread is blocked acquiring a lock" in err and "HNG004" in err
    (record,) = (tmp_path / "runs").iterdir()
    doc = json.loads((record / "result.json").read_text())
    assert doc["findings"][0]["code"] == "HNG004"
    assert doc["hangs"]
    assert list((record / "stacks").glob("*.txt"))

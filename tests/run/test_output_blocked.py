"""How long the job's own output held it up: gpufix waiting to pass it on to a slow reader (a
terminal over ssh, a notebook), while the job's pipe was full. Measured by the relay, judged by PRF010."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.conftest import run_gpufix
from tests.run.helpers import PY, env, gpufix_run, records, script

FLOOD = "import sys\nfor i in range(40000):\n    sys.stdout.write(f'step {i:06d} ' + 'x' * 90 + '\\n')\n"
# Reads 16 KiB every 20 ms: about 0.8 MB/s, a fifth of what the job writes in no time at all.
SLOW_READER = "import sys, time\nwhile sys.stdin.buffer.read1(16384):\n    time.sleep(0.02)\n"


def test_a_slow_reader_of_gpufixs_output_is_measured_as_time_the_job_was_held_up(tmp_path: Path) -> None:
    job = script(tmp_path, "flood.py", FLOOD)
    runs = tmp_path / "runs"
    gpufix = subprocess.Popen([*gpufix_run(runs), "--no-probe", PY, str(job)], stdout=subprocess.PIPE, env=env())
    reader = subprocess.run([PY, "-c", SLOW_READER], stdin=gpufix.stdout, timeout=120)
    assert gpufix.wait(timeout=120) == 0 and reader.returncode == 0
    (record,) = records(runs)
    result = json.loads((record / "result.json").read_text())
    blocked = sum(result["output_blocked_s"].values())
    # The job itself needs a small fraction of the run to write 4 MB; the rest it waited.
    assert blocked > 0.5 * result["duration_s"], (blocked, result["duration_s"])
    assert result["output_bytes"] == 40000 * 103


def test_a_fast_reader_holds_nothing_up(tmp_path: Path) -> None:
    job = script(tmp_path, "flood.py", FLOOD)
    runs = tmp_path / "runs"
    done = subprocess.run([*gpufix_run(runs), "--no-probe", PY, str(job)], stdout=subprocess.DEVNULL, env=env(), timeout=120)
    assert done.returncode == 0
    result = json.loads((records(runs)[0] / "result.json").read_text())
    assert sum(result["output_blocked_s"].values()) < 0.1 * max(result["duration_s"], 1.0)


def test_output_that_held_the_job_up_is_diagnosed_with_its_share(tmp_path: Path) -> None:
    record = tmp_path / "20261130T000000Z-train-abc123"
    record.mkdir()
    (record / "meta.json").write_text(json.dumps({"format": 1, "status": "finished"}))
    line = b"epoch 1 step 12 loss 0.25 " + b"." * 74 + b"\n"
    (record / "output.log").write_bytes(line * 600 * 90)
    (record / "output.idx").write_text("".join(
        json.dumps({"t": t + 0.5, "stream": "stdout", "offset": t * 600 * len(line), "length": 600 * len(line)}) + "\n"
        for t in range(90)))
    (record / "result.json").write_text(json.dumps({"exit_status": 0, "duration_s": 90.0,
                                                    "output_blocked_s": {str(t): 0.45 for t in range(10, 90)}}))
    doc = json.loads(run_gpufix("explain", "--format", "json", str(record)).stdout)
    [finding] = [f for f in doc["findings"] if f["code"] == "PRF010"]
    assert finding["message"] == ("The job wrote up to 59.2 KiB of output per second (5.2 MiB in all) and its output held it "
                                  "up 40% of the run: whatever reads it (a terminal, a notebook, a pipe) cannot keep up")
    assert any("Send the output to a file" in fix["title"] for fix in finding["fixes"])

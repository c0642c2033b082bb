"""Promise 1: `gpufix run` exits with exactly the status the bare command would give."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.run.helpers import memory_cgroup, PY, env, gpufix_run, records


@pytest.mark.parametrize("code", [0, 1, 2, 42, 255])
def test_exit_status_passes_through(tmp_path: Path, code: int) -> None:
    result = subprocess.run([*gpufix_run(tmp_path), "--", "sh", "-c", f"exit {code}"], capture_output=True, env=env())
    assert result.returncode == code


def test_missing_command_is_127_and_not_executable_is_126(tmp_path: Path) -> None:
    missing = subprocess.run([*gpufix_run(tmp_path / "r"), "--", "no-such-command-gpufix"], capture_output=True, env=env())
    assert missing.returncode == 127
    assert b"no-such-command-gpufix: command not found" in missing.stderr
    plain = tmp_path / "plain.sh"
    plain.write_text("echo hi\n")
    plain.chmod(0o644)
    denied = subprocess.run([*gpufix_run(tmp_path / "r"), "--", str(plain)], capture_output=True, env=env())
    assert denied.returncode == 126
    assert denied.stdout == b""


def test_script_without_shebang_runs_with_sh_as_a_shell_would(tmp_path: Path) -> None:
    bare = tmp_path / "noshebang"
    bare.write_text("echo from-sh\nexit 5\n")
    bare.chmod(0o755)
    result = subprocess.run([*gpufix_run(tmp_path / "r"), "--", str(bare)], capture_output=True, env=env())
    assert (result.returncode, result.stdout) == (5, b"from-sh\n")


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGSEGV, signal.SIGTERM])
def test_child_killed_by_signal_gives_128_plus_n(tmp_path: Path, signum: int) -> None:
    code = f"import os; os.kill(os.getpid(), {int(signum)})"
    result = subprocess.run([*gpufix_run(tmp_path), "--", PY, "-c", code], capture_output=True, env=env())
    assert result.returncode == 128 + signum
    # A failed run is recorded with the signal's name.
    (record,) = records(tmp_path)
    assert f'"signal": "{signal.Signals(signum).name}"' in (record / "result.json").read_text()


def test_child_dying_of_sigint_makes_gpufix_die_of_sigint_shell_sees_130(tmp_path: Path) -> None:
    # Re-raising SIGINT keeps a calling shell's loop stoppable with Ctrl-C; the status is still 130.
    inner = " ".join([*gpufix_run(tmp_path), "--", PY, "-c", "'import os,signal; os.kill(os.getpid(), signal.SIGINT)'"])
    result = subprocess.run(["sh", "-c", f"{inner}; echo status=$?"], capture_output=True, env=env())
    assert result.stdout.strip().endswith(b"status=130")
    direct = subprocess.run([*gpufix_run(tmp_path), "--", PY, "-c", "import os,signal; os.kill(os.getpid(), signal.SIGINT)"],
                            capture_output=True, env=env())
    assert direct.returncode == -signal.SIGINT


def test_record_dir_that_cannot_be_created_warns_and_runs_the_job(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    result = subprocess.run([*gpufix_run(blocker / "sub"), "--", "sh", "-c", "echo ran; exit 3"], capture_output=True, env=env())
    assert result.returncode == 3
    assert result.stdout == b"ran\n"
    assert result.stderr.startswith(b"gpufix: warning: cannot create a run record")
    assert not os.path.exists(blocker / "sub")


@pytest.mark.parametrize("closed", [">&-", "2>&-", "<&- >&- 2>&-"])
def test_closed_standard_streams_keep_the_status_and_the_record_clean(tmp_path: Path, closed: str) -> None:
    """Issue 14, item 3: started with stdout or stderr closed, gpufix must not let its record take
    descriptor 1 or 2 (the job's bytes would be written twice into output.log) nor lose the status."""
    inner = " ".join([*gpufix_run(tmp_path), "--", "sh", "-c", "'echo out; echo err >&2; exit 6'"])
    result = subprocess.run(["sh", "-c", f"{inner} {closed}; echo status=$?"], capture_output=True, env=env(), timeout=60)
    assert b"status=6" in result.stdout, result
    (log,) = records(tmp_path)
    assert sorted((log / "output.log").read_bytes().splitlines()) == [b"err", b"out"]
    assert b"internal error" not in result.stdout + result.stderr


def test_a_segfault_is_diagnosed_from_the_stack_faulthandler_recorded(tmp_path: Path) -> None:
    """Tried as a user: a job that died of SIGSEGV got "no known failure pattern", although the probe's faulthandler
    had written the Python stacks into the record (probe/faults-<pid>.log). The record's fault logs are read, and
    GEN023 names the crash and the job's own line."""
    import json

    job = tmp_path / "job.py"
    job.write_text("import ctypes, torch\nprint('step 1 loss 0.5', flush=True)\nctypes.string_at(0)\n")  # the probe starts with torch
    done = subprocess.run([*gpufix_run(tmp_path / "runs"), str(job)], capture_output=True, env=env(), timeout=120)
    assert done.returncode == 128 + signal.SIGSEGV, done.stderr.decode()[-2000:]
    (record,) = records(tmp_path / "runs")
    [root] = [f for f in json.loads((record / "result.json").read_text())["findings"] if f["consequence_of"] is None]
    assert root["code"] == "GEN023" and "Segmentation fault" in root["message"], root
    assert f"({job}:3)" in root["message"], root["message"]


def test_a_sigkill_from_outside_with_memory_to_spare_is_not_blamed_on_memory(tmp_path: Path) -> None:
    """Tried as a user: a job killed by SIGKILL got "no known failure pattern": its output says nothing. The record
    knows gpufix did not send the signal, and its host telemetry that memory was plentiful: GEN024 says so (a
    scheduler, preemption or a kill -9), not the out-of-memory killer."""
    import json

    job = tmp_path / "job.py"
    job.write_text("import os, signal, time\nprint('epoch 1 step 10 loss 0.42', flush=True)\ntime.sleep(1.5)\n"
                   "os.kill(os.getpid(), signal.SIGKILL)\n")
    done = subprocess.run([*gpufix_run(tmp_path / "runs", "--interval", "0.2"), str(job)], capture_output=True, env=env(),
                          timeout=120)
    assert done.returncode == 128 + signal.SIGKILL, done.stderr.decode()[-2000:]
    (record,) = records(tmp_path / "runs")
    [root] = [f for f in json.loads((record / "result.json").read_text())["findings"] if f["consequence_of"] is None]
    assert root["code"] == "GEN024" and "which gpufix did not send, while host memory was not short" in root["message"]
    assert float(root["fields"]["avail_share"]) >= 0.4 and "MiB at most" in root["message"], root["message"]


def test_a_job_killed_for_its_cgroup_s_memory_is_read_as_the_out_of_memory_killer(tmp_path: Path) -> None:
    """The same SIGKILL sent by the out-of-memory killer of a 600 MiB cgroup (a container's or a Slurm job's limit):
    the job's output says nothing, the host telemetry shows the room under the limit gone, and GEN012 names it."""
    import json

    job = tmp_path / "job.py"
    job.write_text("import time\nheld = []\nprint('epoch 1 step 10 loss 0.42', flush=True)\nwhile True:\n"
                   "    held.append(bytearray(b'x' * (16 << 20)))\n    time.sleep(0.05)\n")
    with memory_cgroup(tmp_path, 600 << 20) as join:
        done = subprocess.run([*gpufix_run(tmp_path / "runs", "--interval", "0.2"), str(job)], capture_output=True,
                              env=env(), timeout=120, preexec_fn=join)
    assert done.returncode == 128 + signal.SIGKILL, done.stderr.decode()[-2000:]
    (record,) = records(tmp_path / "runs")
    [root] = [f for f in json.loads((record / "result.json").read_text())["findings"] if f["consequence_of"] is None]
    assert root["code"] == "GEN012" and "which gpufix did not send" in root["message"], root
    assert "MiB at gpufix's last samples" in root["message"], root["message"]


def test_a_rank_killed_by_sigkill_under_torchrun_is_the_root_cause_not_the_launcher_s_error(tmp_path: Path) -> None:
    """Tried as a user: rank 1 of two SIGKILLed (plenty of memory left): torchrun prints its '-9' line and raises
    ChildFailedError. GEN024 names the kill; the launcher's exception is its consequence, not 'also found'."""
    import json

    from tests.run.helpers import torchrun_under_gpufix

    (tmp_path / "job.py").write_text(
        "import os, signal, time\nimport torch.distributed as dist\ndist.init_process_group('gloo')\n"
        "print('rank', dist.get_rank(), 'step 1', flush=True)\ntime.sleep(1.0)\n"
        "if dist.get_rank() == 1:\n    os.kill(os.getpid(), signal.SIGKILL)\ntime.sleep(3)\ndist.barrier()\n")
    done, record = torchrun_under_gpufix(tmp_path, "job.py", "--interval", "0.2")
    assert done.returncode != 0, done.stderr.decode()[-2000:]
    findings = json.loads((record / "result.json").read_text())["findings"]
    roots = [f["code"] for f in findings if f["consequence_of"] is None]
    assert roots[0] == "GEN024", [(f["code"], f["consequence_of"]) for f in findings]
    assert "torchrun's worker 1 was killed by SIGKILL" in findings[0]["message"]
    assert {f["code"]: f["consequence_of"] for f in findings}.get("GEN000", "GEN024") == "GEN024"

"""Promise 2: stdout and stderr pass through byte for byte, on their own streams, live."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from gpufix.record.layout import read_stream
from tests.run.helpers import PY, env, gpufix_run, read_until, records, script

NASTY_OUT = b"plain\n\x00nul\xff\xfe invalid utf-8\r\ncrlf\n\x1b[31mred\x1b[0m\n 37%|###7      | 118/320\r 38%|###8      | 121/320\r"
NASTY_ERR = b"err \xc3\x28 half\n\x00\x01\x02\r\nno newline at end"


def test_binary_output_is_exact_on_each_stream_and_in_the_record(tmp_path: Path) -> None:
    child = script(tmp_path, "nasty.py", (
        "import os, sys\n"
        f"out, err = {NASTY_OUT!r}, {NASTY_ERR!r}\n"
        "for i in range(0, len(out), 7):\n    os.write(1, out[i:i + 7])\n"
        "for i in range(0, len(err), 5):\n    os.write(2, err[i:i + 5])\n"
    ))
    bare = subprocess.run([PY, str(child)], capture_output=True)
    wrapped = subprocess.run([*gpufix_run(tmp_path / "r"), str(child)], capture_output=True, env=env())
    assert wrapped.returncode == bare.returncode == 0
    assert wrapped.stdout == bare.stdout == NASTY_OUT
    assert wrapped.stderr == bare.stderr == NASTY_ERR  # nothing added on success
    (record,) = records(tmp_path / "r")
    assert read_stream(str(record), "stdout") == NASTY_OUT
    assert read_stream(str(record), "stderr") == NASTY_ERR
    assert (record / "output.log").stat().st_size == len(NASTY_OUT) + len(NASTY_ERR)


def test_order_within_each_stream_and_50mb_interleaved_without_deadlock(tmp_path: Path) -> None:
    child = script(tmp_path, "bulk.py", (
        "import os\n"
        "for i in range(400):\n"
        "    block = (b'%06d ' % i) * 9362\n"  # 65534 bytes, different per block
        "    os.write(1, block + b'o\\n')\n"
        "    os.write(2, block + b'e\\n')\n"
    ))
    start = time.monotonic()
    result = subprocess.run([*gpufix_run(tmp_path / "r"), str(child)], capture_output=True, env=env(), timeout=60)
    assert time.monotonic() - start < 30
    assert result.returncode == 0
    expected_out = b"".join((b"%06d " % i) * 9362 + b"o\n" for i in range(400))
    expected_err = b"".join((b"%06d " % i) * 9362 + b"e\n" for i in range(400))
    assert len(result.stdout) + len(result.stderr) > 50_000_000
    assert hashlib.sha256(result.stdout).digest() == hashlib.sha256(expected_out).digest()
    assert hashlib.sha256(result.stderr).digest() == hashlib.sha256(expected_err).digest()
    (record,) = records(tmp_path / "r")
    assert hashlib.sha256(read_stream(str(record), "stderr")).digest() == hashlib.sha256(expected_err).digest()


def test_a_flushed_line_and_a_progress_update_arrive_before_the_job_ends(tmp_path: Path) -> None:
    child = script(tmp_path, "slow.py", (
        "import sys, time\n"
        "print('step 1', flush=True)\n"
        "sys.stdout.write('\\r 10%'); sys.stdout.flush()\n"
        "time.sleep(30)\n"
    ))
    proc = subprocess.Popen([*gpufix_run(tmp_path / "r"), str(child)], stdout=subprocess.PIPE, env=env())
    try:
        got = read_until(proc, b"\r 10%", timeout_s=10)
        assert got == b"step 1\n\r 10%"
        assert proc.poll() is None  # the job is still sleeping: the bytes came live
    finally:
        proc.terminate()
        proc.wait(10)
    assert proc.returncode == 143


def test_reader_going_away_gives_the_job_a_broken_pipe(tmp_path: Path) -> None:
    child = script(tmp_path, "many.py", (
        "import sys\n"
        "try:\n"
        "    for i in range(10**7):\n"
        "        print(i)\n"
        "except BrokenPipeError:\n"
        f"    open({str(tmp_path / 'epipe')!r}, 'w').write('yes')\n"
        "    sys.stderr.close()\n"
        "    sys.exit(7)\n"
    ))
    cmd = " ".join([*gpufix_run(tmp_path / "r"), "--no-record", str(child)])
    result = subprocess.run(["bash", "-c", f"{cmd} | head -1; echo status=${{PIPESTATUS[0]}}"],
                            capture_output=True, env=env(), timeout=60)
    assert result.stdout == b"0\nstatus=7\n"
    assert (tmp_path / "epipe").read_text() == "yes"


def test_stdin_is_never_read_by_gpufix(tmp_path: Path) -> None:
    inner = " ".join([*gpufix_run(tmp_path / "r"), "--", "sh", "-c", "'read x; echo got $x'"])
    result = subprocess.run(["sh", "-c", f"printf 'a\\nb\\n' | ({inner}; cat)"], capture_output=True, env=env())
    assert result.stdout == b"got a\nb\n"
    loop = " ".join([*gpufix_run(tmp_path / "r"), "--", "echo", "$x"])
    result = subprocess.run(["sh", "-c", f"printf '1\\n2\\n3\\n' | while read x; do {loop}; done"], capture_output=True, env=env())
    assert result.stdout == b"1\n2\n3\n"


def test_environment_cwd_and_arguments_are_the_callers(tmp_path: Path) -> None:
    work = tmp_path / "work dir"
    work.mkdir()
    # A C locale triggers PEP 538 coercion in gpufix's own Python; the job must not see it.
    base = {k: v for k, v in env().items() if not k.startswith("LC_")}
    base.update(LANG="C", WEIRD="sp ace=\ttab", GPUFIX_TEST_EMPTY="")
    benv: dict[bytes, bytes] = {k.encode(): v.encode() for k, v in base.items()}
    benv[b"BYTES_VALUE"] = b"\xff\xfe not utf-8"
    bare = subprocess.run(["env", "-0"], capture_output=True, env=benv, cwd=work)
    wrapped = subprocess.run([*gpufix_run(tmp_path / "r"), "--no-probe", "--", "env", "-0"], capture_output=True,
                             env=benv, cwd=work)
    strip = lambda out: [e for e in out.split(b"\0") if not e.startswith(b"_=")]  # noqa: E731 - `_` is the shell's
    assert strip(wrapped.stdout) == strip(bare.stdout)
    assert b"LC_CTYPE" not in wrapped.stdout
    # With the probe (the default), exactly its two documented variables differ, and the flight
    # recorder's three (on, dump on timeout, dumps into the record: docs/run-record.md).
    benv[b"PYTHONPATH"] = b"/user/lib"
    probed = subprocess.run([*gpufix_run(tmp_path / "p"), "--", "env", "-0"], capture_output=True, env=benv, cwd=work)
    bare = subprocess.run(["env", "-0"], capture_output=True, env=benv, cwd=work)
    added = set(strip(probed.stdout)) - set(strip(bare.stdout))
    removed = set(strip(bare.stdout)) - set(strip(probed.stdout))
    assert removed == {b"PYTHONPATH=/user/lib"}
    assert {e.split(b"=", 1)[0] for e in added} == {b"PYTHONPATH", b"GPUFIX_PROBE_DIR", b"TORCH_FR_BUFFER_SIZE",
                                                    b"TORCH_NCCL_DUMP_ON_TIMEOUT", b"TORCH_FR_DUMP_TEMP_FILE"}
    assert any(e.startswith(b"PYTHONPATH=") and e.endswith(b"/probe/inject:/user/lib") for e in added)
    # ... and the record says which they are (the post-mortem does not count them as the user's)
    (record,) = records(tmp_path / "p")
    meta = json.loads((record / "meta.json").read_text())
    assert meta["gpufix_env"] == sorted(e.split(b"=", 1)[0].decode() for e in added)
    args = ["a b", "--lr", "3e-4", "-h", "", "--", "ünï"]
    result = subprocess.run([*gpufix_run(tmp_path / "r"), "--", PY, "-c",
                             "import os, sys; print(os.getcwd()); print(sys.argv[1:])", *args],
                            capture_output=True, env=env(), cwd=work)
    assert result.stdout.decode().splitlines() == [str(work), repr(args)]


def test_descriptors_passed_by_the_caller_reach_the_job(tmp_path: Path) -> None:
    target = tmp_path / "fd3.txt"
    with open(target, "wb") as f:
        fd = f.fileno()
        cmd = [*gpufix_run(tmp_path / "r"), "--", PY, "-c", f"import os; os.write({fd}, b'to-fd\\n')"]
        result = subprocess.run(cmd, capture_output=True, env=env(), pass_fds=(fd,))
    assert result.returncode == 0
    assert target.read_bytes() == b"to-fd\n"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_under_our_stdout_does_not_end_the_job(tmp_path: Path) -> None:
    """Issue 14, item 1: ENOSPC on gpufix's own stdout (a log redirected to a full scratch disk)
    must not kill the job: what can be written is, the status is the job's, the loss is said once."""
    with open("/dev/full", "wb") as full:
        result = subprocess.run([*gpufix_run(tmp_path), "--", "sh", "-c", "echo a; sleep 0.5; echo survived >&2; exit 3"],
                                stdout=full, stderr=subprocess.PIPE, env=env(), timeout=60)
    assert result.returncode == 3
    assert result.stderr.startswith(b"survived\n")
    assert result.stderr.count(b"could not be written") == 1
    assert b"2 bytes of the job's stdout could not be written to gpufix's stdout (No space left on device)" in result.stderr
    (record,) = records(tmp_path)
    assert (record / "output.log").read_bytes() == b"a\nsurvived\n"
    assert json.loads((record / "result.json").read_text())["output_lost_bytes"] == {"stdout": 2}

"""The record's writer thread: complete after a SIGKILL of gpufix, and a slow disk never stalls the job."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from gpufix.record import writer
from gpufix.record.layout import iter_chunks, read_stream
from gpufix.record.writer import OutputRecorder
from tests.run.helpers import PY, env, process_gone, records, script, wait_for

BULK = (
    "import os, sys, time\n"
    "mb = int(sys.argv[1])\n"
    "start = time.monotonic()\n"
    "for i in range(mb * 16):\n"
    "    os.write(1, (b'%07d ' % i) * 8191 + b'\\n')\n"  # 65529 bytes, different per block
    "os.write(2, b'took %.3f\\n' % (time.monotonic() - start))\n"
    "open(sys.argv[2], 'w').write(str(os.getpid()))\n"
    "if sys.argv[3] == 'wait':\n"
    "    time.sleep(60)\n"
)


def _bulk_bytes(mb: int) -> bytes:
    return b"".join((b"%07d " % i) * 8191 + b"\n" for i in range(mb * 16))


# A gpufix whose record "disk" sleeps before every write (monkeypatched in the gpufix process).
SLOW_DISK_GPUFIX = (
    "import os, sys, time\n"
    "from gpufix.record import writer\n"
    "delay = float(os.environ['SLOW_DISK_S'])\n"
    "writer.CLOSE_WAIT_S = float(os.environ.get('CLOSE_WAIT_S', writer.CLOSE_WAIT_S))\n"
    "def slow_write(fd, data):\n"
    "    time.sleep(delay)\n"
    "    return os.write(fd, data)\n"
    "init = writer.OutputRecorder.__init__\n"
    "def slow_init(self, record_dir, warn, os_write=None):\n"
    "    init(self, record_dir, warn, os_write=slow_write)\n"
    "writer.OutputRecorder.__init__ = slow_init\n"
    "from gpufix.cli.entry import main\n"
    "main(sys.argv[1:])\n"
)


def test_sigkill_of_gpufix_after_bulk_output_leaves_a_complete_log(tmp_path: Path) -> None:
    child = script(tmp_path, "bulk.py", BULK)
    pidfile = tmp_path / "job.pid"
    proc = subprocess.Popen([PY, "-m", "gpufix", "run", "--record-dir", str(tmp_path / "r"), str(child), "40",
                             str(pidfile), "wait"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env())
    assert wait_for(lambda: pidfile.exists() and pidfile.read_text() != "", timeout_s=30)
    time.sleep(1.0)  # the promise: complete up to the last ~second
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)
    assert wait_for(lambda: process_gone(int(pidfile.read_text())), timeout_s=5)
    (record,) = records(tmp_path / "r")
    expected = _bulk_bytes(40)
    assert hashlib.sha256(read_stream(str(record), "stdout")).digest() == hashlib.sha256(expected).digest()
    assert read_stream(str(record), "stderr").startswith(b"took ")
    assert (record / "output.log").stat().st_size == len(expected) + len(read_stream(str(record), "stderr"))
    assert not (record / "result.json").exists()


def test_a_stalled_disk_never_stalls_the_job_and_the_loss_is_reported(tmp_path: Path) -> None:
    child = script(tmp_path, "bulk.py", BULK)
    start = time.monotonic()
    result = subprocess.run([PY, "-c", SLOW_DISK_GPUFIX, "run", "--record-dir", str(tmp_path / "r"), str(child), "100",
                             str(tmp_path / "pid"), "exit"],
                            capture_output=True, env=env(SLOW_DISK_S="2.0", CLOSE_WAIT_S="1.0"), timeout=60)
    elapsed = time.monotonic() - start
    assert result.returncode == 0
    assert hashlib.sha256(result.stdout).digest() == hashlib.sha256(_bulk_bytes(100)).digest()  # the job's output is whole
    took = float(result.stderr.split(b"took ")[1].split()[0])
    assert took < 5.0, took  # the job itself waited at most briefly for the record
    assert elapsed < 20, elapsed
    assert result.stderr.count(b"gpufix: warning:") == 1
    assert b"bytes of the job's output are missing from the run record (the disk was too slow)" in result.stderr
    (record,) = records(tmp_path / "r")
    dropped = json.loads((record / "result.json").read_text())["record_dropped_bytes"]
    assert dropped > 0 and (record / "output.log").stat().st_size + dropped >= len(result.stdout)
    (record,) = records(tmp_path / "r")
    assert (record / "output.log").stat().st_size < 100 << 20


def test_a_briefly_slow_disk_costs_the_record_nothing(tmp_path: Path) -> None:
    child = script(tmp_path, "bulk.py", BULK)
    result = subprocess.run([PY, "-c", SLOW_DISK_GPUFIX, "run", "--record-dir", str(tmp_path / "r"), str(child), "20",
                             str(tmp_path / "pid"), "exit"], capture_output=True, env=env(SLOW_DISK_S="0.05"), timeout=60)
    assert result.returncode == 0
    assert b"warning" not in result.stderr
    (record,) = records(tmp_path / "r")
    expected = _bulk_bytes(20)
    assert hashlib.sha256(read_stream(str(record), "stdout")).digest() == hashlib.sha256(expected).digest()
    outcome = json.loads((record / "result.json").read_text())
    assert outcome["record_dropped_bytes"] == 0 and outcome["output_bytes"] == len(expected) + len(result.stderr)


def test_recorder_in_process_queue_index_and_drops(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    warnings: list[str] = []
    gate = []

    def stuck_write(fd: int, data: bytes) -> int:
        while not gate:
            time.sleep(0.01)
        return os.write(fd, data)

    monkeypatch.setattr(writer, "MAX_QUEUED_BYTES", 1000)
    monkeypatch.setattr(writer, "FULL_WAIT_S", 0.05)
    rec = OutputRecorder(str(tmp_path), warnings.append, os_write=stuck_write)
    rec.start()
    rec.write("stdout", b"a" * 400, 0.0)
    rec.write("stdout", b"b" * 400, 0.01)   # coalesced with the first (same stream, < 50 ms)
    time.sleep(0.05)                        # the writer holds the first batch, stuck on the disk
    started = time.monotonic()
    rec.write("stderr", b"c" * 400, 0.02)
    rec.write("stderr", b"d" * 400, 0.03)   # the queue is full: a brief wait, then dropped
    rec.write("stderr", b"e" * 400, 0.04)   # stalled: dropped at once
    assert time.monotonic() - started < 1.0
    gate.append(True)
    assert wait_for(lambda: not rec._queue, timeout_s=5)
    rec.write("stdout", b"f" * 10, 1.0)     # caught up: recorded again
    rec.close()
    assert rec.dropped_bytes >= 400
    log = (tmp_path / "output.log").read_bytes()
    assert log.startswith(b"a" * 400 + b"b" * 400) and log.endswith(b"f" * 10)
    assert len(log) + rec.dropped_bytes == 2010
    chunks = list(iter_chunks(str(tmp_path)))
    assert chunks[0].stream == "stdout" and chunks[0].length == 800
    assert sum(c.length for c in chunks) == len(log)
    assert warnings == []


def test_recorder_never_started_writes_on_close(tmp_path: Path) -> None:
    rec = OutputRecorder(str(tmp_path), lambda message: None)
    rec.write("stderr", b"x: command not found\n", 0.0)
    rec.close()
    assert read_stream(str(tmp_path), "stderr") == b"x: command not found\n"


def test_index_is_written_within_a_second_while_the_job_is_quiet(tmp_path: Path) -> None:
    rec = OutputRecorder(str(tmp_path), lambda message: None)
    rec.start()
    rec.write("stdout", b"step 1\n", 0.0)
    assert wait_for(lambda: (tmp_path / "output.idx").stat().st_size > 0, timeout_s=1.5)
    rec.close()


def test_a_record_that_cannot_be_written_does_not_hide_the_diagnosis(tmp_path: Path) -> None:
    """Issue 14, item 4: with the record's file-size limit hit (a full disk alike), the OOM the job
    printed is still the diagnosis (from the output gpufix kept in memory), and the loss is counted."""
    code = ("import sys; sys.stdout.write('x' * 10**7); "
            "sys.stderr.write('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\\n'); sys.exit(3)")
    inner = " ".join([PY, "-m", "gpufix", "run", "--record-dir", str(tmp_path / "r"), "--", PY, "-c", repr(code)])
    result = subprocess.run(["bash", "-c", f"ulimit -f 1000; {inner} > /dev/null"], capture_output=True, env=env(), timeout=120)
    assert result.returncode == 3
    assert b"MEM001" in result.stderr and b"no known failure pattern" not in result.stderr
    assert b"(it could not be written)" in result.stderr
    (record,) = records(tmp_path / "r")
    doc = json.loads((record / "result.json").read_text())
    assert doc["findings"][0]["code"] == "MEM001"
    assert doc["record_dropped_bytes"] + (record / "output.log").stat().st_size >= 10**7
    assert not [p for p in record.iterdir() if ".tmp" in p.name]


def test_the_output_kept_in_memory_is_bounded_head_and_tail() -> None:
    from gpufix.runner import OutputTail

    kept = OutputTail()
    kept.HEAD, kept.TAIL = 10, 20  # small, for the test
    for i in range(100):
        kept.add(b"line %03d\n" % i)
    data = kept.data()
    assert data.startswith(b"line 000\nl") and data.endswith(b"line 099\n")
    head, gap, tail = data[:10], data[10:11], data[11:]
    assert head == b"line 000\nl" and gap == b"\n"  # what was left out never joins two lines
    assert 20 <= len(tail) < 20 + 9 and tail.endswith(b"line 099\n")
    assert kept.size == 900 and "first" in kept.describe()
    small = OutputTail()
    small.add(b"all\n")
    assert small.data() == b"all\n" and small.describe() == "all of it"


def test_chunks_queued_behind_a_failed_write_are_counted_as_lost(tmp_path: Path) -> None:
    """A write error stops recording; what was already queued behind the failed batch is never
    written and must be counted too (it was once silently discarded: dropped + written < output)."""
    def full_disk(fd: int, data: bytes) -> int:
        raise OSError(28, "No space left on device")

    warnings: list[str] = []
    recorder = OutputRecorder(str(tmp_path), warnings.append, os_write=full_disk)
    chunk = b"x" * (3 << 20)  # one chunk a batch (WRITE_BATCH_BYTES is 4 MiB): three failed batches
    for i in range(3):
        recorder.write("stdout", chunk, float(i))
    recorder.write("stderr", b"late\n", 3.0)  # queued as well: the writer thread never started
    recorder.close()
    recorder.write("stderr", b"after\n", 4.0)
    assert recorder.failed and len(warnings) == 1
    assert recorder.dropped_bytes == 3 * len(chunk) + len(b"late\n") + len(b"after\n")
    assert (tmp_path / "output.log").stat().st_size == 0

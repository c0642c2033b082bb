"""The record's output.log keeps a long run's first and last part on disk, its middle punched out, and every
reader skips the hole: a chatty job running for days cannot fill the disk through gpufix."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from gpufix.diagnosis import LogScanner, evidence_from_record
from gpufix.fastscan.core import LogFile, plan_blocks, scan_file
from gpufix.record import writer
from gpufix.record.layout import OUTPUT_LOG, KeptOutput, data_ranges, read_stream
from gpufix.record.writer import OutputRecorder, output_cap
from gpufix.rules.loader import load_ruleset
from tests.run.helpers import PY, env, records, script

HEAD, TAIL, STEP, BATCH = 64 << 10, 192 << 10, 64 << 10, 16 << 10
OOM_TAIL = (b"Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\n    loss.backward()\n"
            b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
            b"79.10 GiB of which 1.02 GiB is free.\n")


def _holes_supported(folder: Path) -> bool:
    probe = folder / "probe.bin"
    probe.write_bytes(b"x" * (64 << 10))
    fd = os.open(probe, os.O_RDWR)
    try:
        writer.punch_hole(fd, 4096, 8192)
        return data_ranges(fd, 64 << 10) == [(0, 4096), (12288, 64 << 10)]
    except OSError:
        return False
    finally:
        os.close(fd)
        probe.unlink()


@pytest.fixture
def small_cap(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    if not _holes_supported(tmp_path):
        pytest.skip("this filesystem cannot punch holes")
    monkeypatch.setattr(writer, "KEEP_HEAD", HEAD)
    monkeypatch.setattr(writer, "KEEP_TAIL", TAIL)
    monkeypatch.setattr(writer, "PUNCH_STEP", STEP)
    monkeypatch.setattr(writer, "WRITE_BATCH_BYTES", BATCH)  # the cap is checked after each batch written


def _lines(count: int) -> bytes:
    return b"".join(b"step %07d loss 0.%04d lr 3e-4 samples/s 812\n" % (i, i % 9973) for i in range(count))


def _record(tmp_path: Path, data: bytes, piece: int = 8192) -> OutputRecorder:
    tmp_path.mkdir(exist_ok=True)
    warnings: list[str] = []
    recorder = OutputRecorder(str(tmp_path), warnings.append)
    recorder.start()
    for i in range(0, len(data), piece):
        recorder.write("stdout", data[i:i + piece], i / 1e6)
    recorder.close()
    recorder.warnings = warnings  # type: ignore[attr-defined]
    return recorder


def test_the_middle_is_punched_out_and_the_head_and_tail_stay_byte_exact(small_cap: None, tmp_path: Path) -> None:
    data = _lines(40_000) + OOM_TAIL  # ~2 MiB: eight times the cap
    recorder = _record(tmp_path, data)
    log = tmp_path / OUTPUT_LOG
    st = log.stat()
    assert st.st_size == len(data) == recorder.bytes_written  # offsets of output.idx stay those of the output
    assert st.st_blocks * 512 <= HEAD + TAIL + STEP + (64 << 10)  # on disk: head + tail + at most one step
    assert recorder.omitted is not None and not recorder.warnings  # type: ignore[attr-defined]
    start, end = recorder.omitted
    assert start == HEAD and len(data) - TAIL - STEP <= end <= len(data) - TAIL
    with open(log, "rb") as f:
        assert data_ranges(f.fileno(), st.st_size) == [(0, start), (end, len(data))]
    kept = data[:start] + data[end:]
    assert read_stream(str(tmp_path), "stdout") == kept  # the index's chunks in the hole are skipped, not zeros
    with KeptOutput(str(log)) as stream:
        assert stream.omitted == end - start
        read = b"".join(iter(lambda: stream.read(5000), b""))
    cut_line = b"" if data[start - 1:start] == b"\n" else b"\n"
    assert read == data[:start] + cut_line + data[end:]


def test_a_long_runs_record_is_diagnosed_from_its_tail_and_says_what_was_left_out(small_cap: None, tmp_path: Path) -> None:
    data = _lines(40_000) + OOM_TAIL
    recorder = _record(tmp_path, data)
    assert recorder.omitted is not None
    ruleset = load_ruleset()
    evidence = evidence_from_record(str(tmp_path), LogScanner.for_rules(ruleset))
    assert evidence.bytes_read < HEAD + TAIL + STEP + 2  # the hole was never read
    assert any("bytes from the middle of the output were not kept" in note for note in evidence.notes)
    assert [e.type for e in evidence.exceptions][-1:] == ["torch.OutOfMemoryError"]
    # the post-mortem's fast scanner plans blocks over the kept ranges only, and finds the same
    with LogFile(str(tmp_path / OUTPUT_LOG)) as file:
        blocks = plan_blocks(file)
        assert all(not (start < e and s < end) for s, e, _kind in blocks for start, end in [recorder.omitted])
    fast = scan_file(str(tmp_path / OUTPUT_LOG), ruleset)
    assert [e.type for e in fast.exceptions] == [e.type for e in evidence.exceptions]
    assert {i: [h.lines for h in hits] for i, hits in fast.hits.items()} == \
        {i: [h.lines for h in hits] for i, hits in evidence.hits.items()}


def test_without_hole_support_recording_stops_at_the_cap_with_one_warning(small_cap: None, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    def no_holes(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(writer, "punch_hole", no_holes)
    data = _lines(40_000)
    recorder = _record(tmp_path, data)
    assert recorder.capped_at is not None and recorder.omitted is None
    size = (tmp_path / OUTPUT_LOG).stat().st_size
    assert size == recorder.capped_at <= HEAD + TAIL + STEP + BATCH
    assert recorder.dropped_bytes == len(data) - size  # counted, so the run diagnoses from its in-memory tail
    assert len(recorder.warnings) == 1 and "cannot drop the middle" in recorder.warnings[0]  # type: ignore[attr-defined]


def test_the_cap_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(writer.OUTPUT_MAX_ENV, "2G")
    assert output_cap() == (512 << 20, 1536 << 20, writer.PUNCH_STEP)
    monkeypatch.setenv(writer.OUTPUT_MAX_ENV, "4MiB")
    assert output_cap() == (1 << 20, 3 << 20, 1 << 20)
    for useless in ("12", "lots", "0.5M", ""):  # under 1 MiB or not a size: the defaults, and a warning if it was set
        monkeypatch.setenv(writer.OUTPUT_MAX_ENV, useless)
        said: list[str] = []
        assert output_cap(said.append) == (writer.KEEP_HEAD, writer.KEEP_TAIL, writer.PUNCH_STEP)
        assert len(said) == (1 if useless else 0) and (not said or f"={useless} is not a size" in said[0]), said


CHATTY_OOM = (
    "import sys\n"
    "for i in range(60000):\n"
    "    print(f'epoch 0 step {i:07d} loss {1 / (i + 1):.6f} lr 0.0003 throughput 812 samples/s')\n"
    "print('Traceback (most recent call last):', file=sys.stderr)\n"
    "print('  File \"train.py\", line 9, in <module>', file=sys.stderr)\n"
    "print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of '\n"
    "      '79.10 GiB of which 1.02 GiB is free.', file=sys.stderr)\n"
    "sys.exit(1)\n"
)


def test_gpufix_run_of_a_chatty_job_keeps_its_record_small_and_still_names_the_failure(tmp_path: Path) -> None:
    if not _holes_supported(tmp_path):
        pytest.skip("this filesystem cannot punch holes")
    import subprocess

    job = script(tmp_path, "chatty.py", CHATTY_OOM)
    proc = subprocess.run([PY, "-m", "gpufix", "run", "--record-dir", str(tmp_path / "runs"), str(job)],
                          capture_output=True, env=env(**{writer.OUTPUT_MAX_ENV: "1M"}), timeout=120)
    assert proc.returncode == 1
    assert proc.stdout.count(b"\n") == 60000  # the job's own output is whole
    [record] = records(tmp_path / "runs")
    result = json.loads((record / "result.json").read_text())
    start, end = result["record_omitted"]
    log = record / OUTPUT_LOG
    assert len(proc.stdout) < log.stat().st_size <= len(proc.stdout) + len(proc.stderr)  # the whole output's length
    assert log.stat().st_blocks * 512 <= (1 << 20) + (256 << 10) + (64 << 10)  # but ~1 MiB of it on disk
    assert start == 256 << 10 and result["record_dropped_bytes"] == 0
    assert [f["code"] for f in result["findings"]][:1] == ["MEM001"]

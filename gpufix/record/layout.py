"""Where a run record lives and what its files are called; reading a record back.

The layout is documented in docs/run-record.md; file names are spelled here only. Later commands
read a record through `gpufix.record.reader.Record`, which builds on these helpers.
"""

from __future__ import annotations

import errno
import os
import time

TYPE_CHECKING = False  # `gpufix run` imports this module before the job starts: keep it light
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

DEFAULT_PARENT = "gpufix-runs"
RECORD_DIR_ENV = "GPUFIX_RECORD_DIR"

META = "meta.json"
RESULT = "result.json"
OUTPUT_LOG = "output.log"
OUTPUT_INDEX = "output.idx"
TELEMETRY = "telemetry.jsonl"
STACKS = "stacks"  # folder: stack dumps of a hang or of `gpufix stacks`
PROBE = "probe"  # folder: what the in-job probe wrote (docs/probe.md)
RANKS = "ranks"  # folder: what gpufix kept of each rank (torchelastic error files)
FLIGHT = "flight"  # folder: PyTorch flight-recorder dumps of each rank, and gpufix's reading of them
FLIGHT_REPORT = os.path.join(FLIGHT, "report.txt")
EXPERIMENT_RESULTS = os.path.join("experiments", "results.json")  # what `gpufix confirm` found (docs/confirm.md)
FORMAT_VERSION = 1

NAME_SAFE_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
NAME_MAX_CHARS = 40


def is_record_dir(path: str | os.PathLike[str]) -> bool:
    """A run record is a directory holding `meta.json` and `output.log` (both writers, `run` and
    `attach`, create output.log first, so a record is one from its first moment)."""
    return os.path.isfile(os.path.join(path, META)) and os.path.isfile(os.path.join(path, OUTPUT_LOG))


def default_name(argv: list[str]) -> str:
    """A short name for the run from its command: the script or module, else the program."""
    words = [os.path.basename(a) for a in argv]
    if "-m" in argv[:-1]:
        name = argv[argv.index("-m") + 1].rsplit(".", 1)[-1]
    else:
        scripts = [w for w in words if w.endswith((".py", ".sh"))]
        name = scripts[0].rsplit(".", 1)[0] if scripts else (words[0] if words else "job")
    return safe_name(name)


def safe_name(name: str) -> str:
    """Reduce a name to characters that are safe in a directory name on every filesystem."""
    out: list[str] = []
    in_run = False
    for char in name:  # each run of other characters becomes one "-" (no `re` before the job starts)
        if char in NAME_SAFE_CHARS:
            out.append(char)
            in_run = False
        elif not in_run:
            out.append("-")
            in_run = True
    return "".join(out).strip("-.")[:NAME_MAX_CHARS] or "job"


def record_parent(option: str | None, environ: dict[str, str]) -> str:
    """The folder that holds records: `--record-dir`, else $GPUFIX_RECORD_DIR, else ./gpufix-runs."""
    return option or environ.get(RECORD_DIR_ENV) or DEFAULT_PARENT


def create_record_dir(parent: str, name: str, started_unix: float) -> str:
    """Make a fresh `<UTC time>-<name>-<short id>` folder under `parent` (created if missing)."""
    os.makedirs(parent, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started_unix))
    for _ in range(8):
        path = os.path.join(parent, f"{stamp}-{safe_name(name)}-{os.urandom(3).hex()}")
        try:
            os.mkdir(path, 0o700)  # records hold job output, which may be private
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"cannot find a free record name under {parent}")


def _chunk_class() -> type:
    """`Chunk`, made on first use: `dataclasses` costs ~10 ms that `gpufix run` must not pay."""
    global _Chunk
    if _Chunk is None:
        from dataclasses import dataclass

        @dataclass(frozen=True)
        class Chunk:
            """One entry of `output.idx`: `length` bytes at `offset` of output.log, from `stream`."""

            time_s: float
            stream: str
            offset: int
            length: int

        Chunk.__module__, Chunk.__qualname__ = __name__, "Chunk"
        _Chunk = Chunk
    return _Chunk


_Chunk: type | None = None


def __getattr__(name: str) -> object:
    if name == "Chunk":
        return _chunk_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def read_json(path: str) -> dict[str, object]:
    import json

    with open(path, encoding="utf-8") as f:
        return json.load(f)


def iter_chunks(record: str) -> Iterator[Any]:  # of Chunk (made on first use)
    """The index entries in order; a torn last line (gpufix killed mid-write) is skipped."""
    import json

    chunk = _chunk_class()
    path = os.path.join(record, OUTPUT_INDEX)
    if not os.path.isfile(path):  # absent, or not a regular file (a FIFO put there would block the read)
        return
    try:
        f = open(path, encoding="utf-8")
    except OSError:
        return
    with f:
        for line in f:
            try:
                d = json.loads(line)
                yield chunk(float(d["t"]), str(d["stream"]), int(d["offset"]), int(d["length"]))
            except (ValueError, KeyError, TypeError):
                continue


def data_ranges(fd: int, size: int) -> list[tuple[int, int]]:
    """The [start, end) byte ranges of an open file that hold data: the whole file, except where the record
    writer punched the middle of an oversized output.log out (record/writer.py). Found with SEEK_DATA and
    SEEK_HOLE (pread-only: the descriptor's position is restored); where the system lacks them, the whole file."""
    seek_data, seek_hole = getattr(os, "SEEK_DATA", None), getattr(os, "SEEK_HOLE", None)
    if size <= 0:
        return []
    if seek_data is None or seek_hole is None:
        return [(0, size)]
    position = os.lseek(fd, 0, os.SEEK_CUR)
    ranges: list[tuple[int, int]] = []
    offset = 0
    try:
        while offset < size:
            start = os.lseek(fd, offset, seek_data)
            if start >= size:
                break
            end = min(os.lseek(fd, start, seek_hole), size)
            ranges.append((start, end))
            offset = end
    except OSError as exc:
        if exc.errno != errno.ENXIO:  # ENXIO: no data past `offset`; anything else: no hole support, all is data
            return [(0, size)]
    finally:
        os.lseek(fd, position, os.SEEK_SET)
    return ranges


def omitted_bytes(ranges: list[tuple[int, int]], size: int) -> int:
    """How many bytes of a file of `size` bytes lie outside its data ranges."""
    return size - sum(end - start for start, end in ranges)


class KeptOutput:
    """An output.log opened for reading from the start, its punched-out middle skipped (`data_ranges`): a
    scan reads what was kept, never gigabytes of the hole's zeros. `omitted` says how much was skipped."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "rb")  # noqa: SIM115 - closed by close()/the context manager
        size = os.fstat(self._file.fileno()).st_size
        self._ranges = data_ranges(self._file.fileno(), size)
        self.omitted = omitted_bytes(self._ranges, size)
        self._ranges = self._ranges or [(0, 0)]  # an empty file: whatever it holds by the time it is read
        self._last = b""

    def read(self, size: int = -1) -> bytes:
        while self._ranges:
            start, end = self._ranges[0]
            last = len(self._ranges) == 1
            at = self._file.tell()
            if at < start:
                self._file.seek(start)
                at = start
            if not last and at >= end:
                self._ranges.pop(0)
                if self._last not in (b"", b"\n"):  # a line the gap cut ends there (as fastscan.plan_blocks cuts it)
                    self._last = b"\n"
                    return b"\n"
                continue
            # past the size the file had when opened (a run still writing) is read with the last range
            data = self._file.read(size if last else end - at if size < 0 else min(size, end - at))
            if data or last:
                self._last = data[-1:] or self._last
                return data
            self._ranges.pop(0)  # shorter than when opened
        return b""

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> KeptOutput:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_stream(record: str, stream: str) -> bytes:
    """The bytes one stream (`stdout`, `stderr` or `tty`) wrote, rebuilt from the index.

    output.log is written before output.idx: a gpufix killed in between leaves bytes past the last
    indexed chunk. They are read too, as the stream of that last chunk (the one still writing),
    or as the whole log's when nothing was indexed: output.log holds what the job printed."""
    parts: list[bytes] = []
    indexed_end, last_stream = 0, None
    with open(os.path.join(record, OUTPUT_LOG), "rb") as log:
        size = os.fstat(log.fileno()).st_size
        kept = data_ranges(log.fileno(), size)
        if not kept or kept[-1][1] == size:  # a run still writing: what comes after this moment is data too
            kept = [*kept[:-1], (kept[-1][0] if kept else 0, 1 << 62)]
        for chunk in iter_chunks(record):
            indexed_end = max(indexed_end, chunk.offset + chunk.length)
            last_stream = chunk.stream
            if chunk.stream == stream:
                for start, end in kept:  # a chunk in the punched-out middle of a long run's log: only what was kept
                    lo, hi = max(start, chunk.offset), min(end, chunk.offset + chunk.length)
                    if lo < hi:
                        log.seek(lo)
                        parts.append(log.read(hi - lo))
        if last_stream in (stream, None):
            log.seek(indexed_end)
            parts.append(log.read())
    return b"".join(parts)

"""Where a run record lives and what its files are called; reading a record back.

The layout is documented in docs/run-record.md; file names are spelled here only. Later commands
read a record through `gpufix.record.reader.Record`, which builds on these helpers.
"""

from __future__ import annotations

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


def read_stream(record: str, stream: str) -> bytes:
    """The bytes one stream (`stdout`, `stderr` or `tty`) wrote, rebuilt from the index.

    output.log is written before output.idx: a gpufix killed in between leaves bytes past the last
    indexed chunk. They are read too, as the stream of that last chunk (the one still writing),
    or as the whole log's when nothing was indexed: output.log holds what the job printed."""
    parts: list[bytes] = []
    indexed_end, last_stream = 0, None
    with open(os.path.join(record, OUTPUT_LOG), "rb") as log:
        for chunk in iter_chunks(record):
            indexed_end = max(indexed_end, chunk.offset + chunk.length)
            last_stream = chunk.stream
            if chunk.stream == stream:
                log.seek(chunk.offset)
                parts.append(log.read(chunk.length))
        if last_stream in (stream, None):
            log.seek(indexed_end)
            parts.append(log.read())
    return b"".join(parts)

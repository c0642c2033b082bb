"""Byte-exact pass-through of the job's output: raw `os.read` chunks to the real fd, unchanged.

No decoding, no line splitting: a `\\r` progress update, a NUL or a half UTF-8 sequence goes out
the moment the job writes it. When the reader of gpufix's own output goes away (`| head -1`),
the job's end of that stream is closed too, so the job gets EPIPE/SIGPIPE as it would bare.
"""

from __future__ import annotations

import errno
import os
import select
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    # (stream name, chunk, seconds since the job started) -> None; the run record's writer.
    Sink = Callable[[str, bytes, float], None]

# Reads start at 64 KiB (a line-writing job's chunks are small) and grow to 1 MiB while the pipe
# keeps filling them (a bulk writer): fewer syscalls and wake-ups per byte, for the relay and for
# the record's writer thread alike.
CHUNK_BYTES = 65536
MAX_CHUNK_BYTES = 1 << 20
BLOCKED_AFTER_S = 0.0005  # a write this long waited for the reader (a plain write takes microseconds)


class Stream:
    """One output channel: the job writes to `source` (pipe or pty), gpufix to `target`."""

    __slots__ = ("name", "source", "target", "open", "target_broken", "chunk_bytes")

    def __init__(self, name: str, source: int, target: int, open: bool = True, target_broken: bool = False) -> None:
        self.name = name  # "stdout", "stderr", or "tty" when one pty carries both
        self.source = source
        self.target = target
        self.open = open
        self.target_broken = target_broken
        self.chunk_bytes = CHUNK_BYTES

    def __repr__(self) -> str:
        return f"Stream({self.name!r}, {self.source}, {self.target}, open={self.open})"


class Relay:
    """Moves chunks from each stream's source to its target and to an optional sink."""

    def __init__(self, streams: list[Stream], sink: Sink | None) -> None:
        self.streams = {s.source: s for s in streams}
        self.sink = sink
        self.last_byte: dict[int, int] = {}  # target fd -> last byte written there
        self.bytes_relayed = 0
        # Seconds (since the job started) -> time spent blocked writing to our own stdout/stderr.
        # While gpufix waits on a slow reader (a terminal over ssh, a notebook, a full pipe), the
        # job's pipe fills and its next print blocks: this is how long its output held it up.
        self.blocked_s: dict[int, float] = {}
        # Stream name -> [bytes not written to our own stdout/stderr, the error]: a full disk or
        # quota where the job's log is redirected (ENOSPC, EDQUOT, EFBIG). The job runs on, as it
        # would bare (its own writes would fail, not kill it); the record still has every byte.
        self.lost: dict[str, list] = {}  # type: ignore[type-arg]

    def pump(self, stream: Stream, now_s: float) -> bool:
        """Relay one chunk from `stream`; False once it is at EOF (or unreadable)."""
        try:
            data = os.read(stream.source, stream.chunk_bytes)
        except BlockingIOError:
            return True
        except OSError as exc:
            if exc.errno != errno.EIO:  # EIO: a pty whose slave side every process has closed
                raise
            data = b""
        if not data:
            return False
        size = len(data)
        if size == stream.chunk_bytes:
            stream.chunk_bytes = min(size * 4, MAX_CHUNK_BYTES)
        elif size < CHUNK_BYTES and stream.chunk_bytes > CHUNK_BYTES:
            stream.chunk_bytes = CHUNK_BYTES
        self.bytes_relayed += size
        if self.sink is not None:
            self.sink(stream.name, data, now_s)
        if not stream.target_broken:
            try:
                started = time.perf_counter()
                _write_all(stream.target, data)
                waited = time.perf_counter() - started
                if waited > BLOCKED_AFTER_S:
                    second = int(now_s)
                    self.blocked_s[second] = self.blocked_s.get(second, 0.0) + waited
                self.last_byte[stream.target] = data[-1]
            except OSError as exc:
                if exc.errno not in (errno.EPIPE, errno.EIO, errno.ENXIO, errno.EBADF):
                    # Cannot be written now (a full disk, a quota): keep relaying what can be.
                    lost = self.lost.setdefault(stream.name, [0, exc.strerror or str(exc)])
                    lost[0] += getattr(exc, "unwritten", size)
                    return True
                # Our reader is gone. Stop reading this stream, so the job's next write to it
                # fails with EPIPE/SIGPIPE, exactly what it would have got writing there itself.
                stream.target_broken = True
                return False
        return True


def _write_all(fd: int, data: bytes) -> None:
    """Write all of `data`; an OSError raised part way carries `unwritten` (bytes not written)."""
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except OSError as exc:
            if not isinstance(exc, BlockingIOError):
                exc.unwritten = len(view)  # type: ignore[attr-defined]
                raise
            # Our stdout may be a non-blocking fd shared with another process: wait until writable.
            poller = select.poll()
            poller.register(fd, select.POLLOUT)
            poller.poll(1000)
            continue
        view = view[written:]

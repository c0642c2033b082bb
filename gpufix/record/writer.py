"""Append the job's output to the record as it passes through, so a killed run loses nothing.

`output.log` gets every chunk, raw, in arrival order, with one unbuffered `os.write` on an
`O_APPEND` descriptor: once the relay has seen a chunk the kernel has it, and a `kill -9` of
gpufix keeps it. `output.idx` says which stream each byte range came from and when; entries for
consecutive chunks of one stream are merged (within `COALESCE_S`) and written in small batches,
so a job printing 100k short lines a second does not pay four syscalls per line. A background
thread `fdatasync`s both files every few seconds, bounding what a machine crash can lose.
A write error (disk full, folder removed) disables recording with one warning; the relay and
the job go on regardless.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from gpufix.record.layout import OUTPUT_INDEX, OUTPUT_LOG

COALESCE_S = 0.05
INDEX_BATCH_ENTRIES = 64
INDEX_FLUSH_S = 0.5
SYNC_INTERVAL_S = 3.0
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC


class OutputRecorder:
    """Writes `output.log` and `output.idx` in a record folder; see the module docstring."""

    def __init__(self, record_dir: str, warn: Callable[[str], None]) -> None:
        self._warn = warn
        self._log_fd = os.open(os.path.join(record_dir, OUTPUT_LOG), _FLAGS, 0o600)
        self._idx_fd = os.open(os.path.join(record_dir, OUTPUT_INDEX), _FLAGS, 0o600)
        self.enabled = True
        self.bytes_written = 0
        # The entry being extended: [time_s, stream, offset, length].
        self._open_entry: list[object] | None = None
        self._batch: list[str] = []
        self._batch_started_s = 0.0
        self._dirty = False
        self._stop = threading.Event()
        self._syncer: threading.Thread | None = None

    def write(self, stream: str, data: bytes, now_s: float) -> None:
        """Record one chunk that `stream` produced at `now_s` (seconds since the job started)."""
        if not self.enabled:
            return
        try:
            os.write(self._log_fd, data)  # O_APPEND on a regular file: written whole or error
        except OSError as exc:
            self._fail(exc)
            return
        entry = self._open_entry
        if entry is not None and entry[1] == stream and now_s - entry[0] < COALESCE_S:  # type: ignore[operator]
            entry[3] += len(data)  # type: ignore[operator]
        else:
            if entry is not None:
                self._queue(entry)
            self._open_entry = [now_s, stream, self.bytes_written, len(data)]
        self.bytes_written += len(data)
        self._dirty = True
        if self._batch and (len(self._batch) >= INDEX_BATCH_ENTRIES or now_s - self._batch_started_s >= INDEX_FLUSH_S):
            self.flush_index()

    @property
    def has_unflushed_index(self) -> bool:
        return self.enabled and (bool(self._batch) or self._open_entry is not None)

    def _queue(self, entry: list[object]) -> None:
        if not self._batch:
            self._batch_started_s = entry[0]  # type: ignore[assignment]
        t, stream, offset, length = entry
        self._batch.append(f'{{"t":{t:.6f},"stream":"{stream}","offset":{offset},"length":{length}}}\n')

    def flush_index(self, close_entry: bool = False) -> None:
        """Write queued index entries (and the open one when `close_entry`)."""
        if close_entry and self._open_entry is not None:
            self._queue(self._open_entry)
            self._open_entry = None
        if not self._batch or not self.enabled:
            return
        data, self._batch = "".join(self._batch).encode(), []
        try:
            os.write(self._idx_fd, data)
        except OSError as exc:
            self._fail(exc)

    def start_syncer(self) -> None:
        """Sync to disk every few seconds in a thread (never in the relay: fsync can stall)."""
        self._syncer = threading.Thread(target=self._sync_loop, name="gpufix-record-sync", daemon=True)
        self._syncer.start()

    def _sync_loop(self) -> None:
        while not self._stop.wait(SYNC_INTERVAL_S):
            if self._dirty and self.enabled:
                self._dirty = False
                try:
                    os.fdatasync(self._log_fd)
                    os.fdatasync(self._idx_fd)
                except OSError:
                    pass  # the next write reports a real problem; syncing is best effort

    def close(self) -> None:
        """Flush the index and close both files."""
        self._stop.set()
        self.flush_index(close_entry=True)
        if self._syncer is not None:
            self._syncer.join(timeout=1.0)
        # No final fsync: the page cache already holds everything and a sync here would add
        # milliseconds to every run's tear-down; the syncer bounds a machine crash's loss.
        for fd in (self._log_fd, self._idx_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.enabled = False

    def _fail(self, exc: OSError) -> None:
        self.enabled = False
        self._warn(f"cannot write the run record ({exc.strerror or exc}); recording stopped, the job goes on")

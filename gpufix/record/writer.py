"""Append the job's output to the record as it passes through, without slowing the relay.

The relay (the supervisor's thread) only hands each raw chunk to `OutputRecorder.write`, which
appends it to an in-memory queue and returns; a writer thread appends the queued chunks to
`output.log` with plain `os.writev`s on an `O_APPEND` descriptor (all queued chunks in one
syscall), keeps `output.idx` (which stream each byte range came from and when; consecutive chunks
of one stream within `COALESCE_S` merged, entries written in small batches at most
`INDEX_FLUSH_S` behind) and `fdatasync`s both files every `SYNC_INTERVAL_S` when they changed.
So the page cache has a chunk at most ~`LINGER_S` after the relay saw it (the writer lets a
trickle of small chunks gather that long instead of waking up for each; a `kill -9` of gpufix
loses only what was still queued: the last moment's output), and copying output to disk runs
beside the relay instead of between its reads and writes.

A slow or stalled disk must never stall the job. The queue holds at most `MAX_QUEUED_BYTES`;
when it is full the relay waits for room at most `FULL_WAIT_S` (a brief hiccup costs the record
nothing), then the recorder counts as stalled: chunks are dropped from the record (never from
the job's own output) and counted in `dropped_bytes` until the writer has caught up to half the
queue. Dropping was chosen over blocking longer (a job blocked on `print` behind an NFS stall can
trip distributed timeouts) and over spilling to memory without bound. A write error (disk full,
folder removed) disables recording with one warning; the relay and the job go on regardless.

The record's disk use is bounded, so that a chatty job running for days cannot fill the disk its own
checkpoints go to. Past `output_cap()` bytes (head + tail) the writer punches the middle of output.log out
(`fallocate(PUNCH_HOLE)`, in `PUNCH_STEP`s): the file keeps its length, so every offset in output.idx and
every reader following its growth (the hang watchdog) stay valid, but only its first `head` and last `tail`
bytes take disk space; readers skip the hole (`layout.data_ranges`). Where the filesystem cannot punch
holes, recording stops at the cap with one note, and the diagnosis uses the tail gpufix keeps in memory.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections import deque

from gpufix.record.layout import OUTPUT_INDEX, OUTPUT_LOG

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

COALESCE_S = 0.05
INDEX_BATCH_ENTRIES = 64
INDEX_FLUSH_S = 0.5
SYNC_INTERVAL_S = 3.0
MAX_QUEUED_BYTES = 32 << 20   # memory the queue may hold while the disk is slower than the job
FULL_WAIT_S = 0.5             # longest the relay waits for room before the recorder counts as stalled
WRITE_BATCH_BYTES = 4 << 20   # at most this much in one writev
LINGER_S = 0.01               # after a small batch, let chunks gather this long before the next
LINGER_BELOW_BYTES = 64 << 10
IOV_MAX = 1024
CLOSE_WAIT_S = 10.0           # at the end, longest wait for the queue to reach the disk
# output.log's disk use: the first KEEP_HEAD and the last KEEP_TAIL bytes of the job's output (the start's
# banners and configuration, the end's failure); the middle is punched out once PUNCH_STEP more has come.
# GPUFIX_RECORD_OUTPUT_MAX (bytes, or with K/M/G: "2G") sets head + tail, in the same 1:3 proportion.
OUTPUT_MAX_ENV = "GPUFIX_RECORD_OUTPUT_MAX"
KEEP_HEAD = 64 << 20
KEEP_TAIL = 192 << 20
PUNCH_STEP = 64 << 20
_BLOCK = 4096                 # holes are punched on block boundaries: whole blocks are freed, none half-zeroed
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC


class OutputRecorder:
    """Writes `output.log` and `output.idx` in a record folder; see the module docstring.

    `write` is called by the relay only; everything else on the files happens in the writer
    thread (`start`), or in `close` when the thread never started.
    """

    def __init__(self, record_dir: str, warn: Callable[[str], None],
                 os_write: Callable[[int, bytes], int] = os.write) -> None:
        self._warn = warn
        self._os_write = os_write  # tests slow the "disk" down through this
        self._log_fd = os.open(os.path.join(record_dir, OUTPUT_LOG), _FLAGS, 0o600)
        self._idx_fd = os.open(os.path.join(record_dir, OUTPUT_INDEX), _FLAGS, 0o600)
        self.enabled = True
        self.bytes_written = 0     # bytes in output.log (writer thread)
        self.dropped_bytes = 0     # bytes the relay passed on but the record lost (a stalled or full disk)
        self.failed = False        # a write failed: recording stopped
        self.incomplete = False    # closed before the writer thread was done: output.log may lack the end
        self._keep_head, self._keep_tail, self._punch_step = output_cap(warn)
        self.omitted: tuple[int, int] | None = None  # output.log's byte range punched out (see the module docstring)
        self.capped_at: int | None = None  # where recording stopped: the cap reached on a filesystem without holes
        self._lock = threading.Lock()
        self._not_empty = threading.Condition(self._lock)
        self._not_full = threading.Condition(self._lock)
        self._linger = threading.Condition(self._lock)
        self._writer_idle = False  # waiting for chunks: the relay must notify `_not_empty`
        self._queue: deque[tuple[str, bytes, float]] = deque()
        self._queued_bytes = 0
        self._relay_waiting = False
        self._stalled = False
        self._closing = False
        self._thread: threading.Thread | None = None
        # Index state, owned by the writer thread. The entry being extended: [time_s, stream, offset, length].
        self._open_entry: list[object] | None = None
        self._batch: list[str] = []
        self._unflushed_since = 0.0  # monotonic time of the oldest entry not yet in output.idx
        self._dirty = False
        self._next_sync = 0.0
        # fdatasync runs in its own thread: syncing a burst of output can take the disk a second,
        # and the writer must keep draining the queue meanwhile (Linux lets write() go on).
        self._sync_request = threading.Event()

    # -- the relay's side ---------------------------------------------------------------------

    def write(self, stream: str, data: bytes, now_s: float) -> None:
        """Queue one chunk that `stream` produced at `now_s` (seconds since the job started)."""
        if not self.enabled:
            if self.failed or self.capped_at is not None:  # could not be written (a full disk), or past the cap
                self.dropped_bytes += len(data)
            return
        size = len(data)
        with self._lock:
            if self._stalled:
                if self._queued_bytes > MAX_QUEUED_BYTES // 2:
                    self.dropped_bytes += size
                    return
                self._stalled = False
            if self._queued_bytes and self._queued_bytes + size > MAX_QUEUED_BYTES:
                deadline = time.monotonic() + FULL_WAIT_S
                self._relay_waiting = True
                while self.enabled and self._queued_bytes and self._queued_bytes + size > MAX_QUEUED_BYTES:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self._stalled = True
                        break
                    self._not_full.wait(left)
                self._relay_waiting = False
                if self._stalled or not self.enabled:
                    self.dropped_bytes += size
                    return
            self._queue.append((stream, data, now_s))
            self._queued_bytes += size
            if self._writer_idle:
                self._not_empty.notify()

    # -- the writer thread ----------------------------------------------------------------------

    def start(self) -> None:
        """Start the writer thread (after the job has started: no thread may exist at fork)."""
        if self._thread is None:
            _reuse_freed_memory()
            self._next_sync = time.monotonic() + SYNC_INTERVAL_S
            self._thread = threading.Thread(target=self._run, name="gpufix-record-writer", daemon=True)
            self._thread.start()
            threading.Thread(target=self._sync_loop, name="gpufix-record-sync", daemon=True).start()

    def _sync_loop(self) -> None:
        while True:
            self._sync_request.wait()
            self._sync_request.clear()
            if not self.enabled:
                return
            try:
                os.fdatasync(self._log_fd)
                os.fdatasync(self._idx_fd)
            except OSError:
                pass  # the next write reports a real problem; syncing is best effort

    start_syncer = start  # the name of the synchronous writer's sync thread

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._queue and not self._closing:
                    self._writer_idle = True
                    self._not_empty.wait(self._idle_timeout())
                    self._writer_idle = False
                items: list[tuple[str, bytes, float]] = []
                size = 0
                for item in self._queue:
                    if items and size + len(item[1]) > WRITE_BATCH_BYTES:
                        break
                    items.append(item)
                    size += len(item[1])
                closing = self._closing and not self._queue
            if items:
                self._append(items, size)
                with self._lock:
                    for _ in items:
                        self._queue.popleft()
                    self._queued_bytes -= size
                    if self._relay_waiting:
                        self._not_full.notify()
                    if size < LINGER_BELOW_BYTES and not self._closing:
                        # A trickle of small chunks (lines, a pty's 4 KiB pieces): let more gather
                        # rather than wake up for each one; the relay does not notify meanwhile.
                        self._linger.wait(LINGER_S)
                self._housekeeping()
                continue
            if closing:
                self._flush_index(close_entry=True)
                return
            self._housekeeping()

    def _idle_timeout(self) -> float | None:
        """How long the writer may sleep with an empty queue before it has index or sync work."""
        deadlines = []
        if self._batch or self._open_entry is not None:
            deadlines.append(self._unflushed_since + INDEX_FLUSH_S)
        if self._dirty:
            deadlines.append(self._next_sync)
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - time.monotonic())

    def _housekeeping(self) -> None:
        now = time.monotonic()
        if (self._batch or self._open_entry is not None) and now - self._unflushed_since >= INDEX_FLUSH_S:
            self._flush_index(close_entry=True)
        if now >= self._next_sync:
            self._next_sync = now + SYNC_INTERVAL_S
            if self._dirty and self.enabled:
                self._dirty = False
                self._sync_request.set()

    def _append(self, items: list[tuple[str, bytes, float]], size: int) -> None:
        if not self.enabled:
            if self.failed or self.capped_at is not None:  # queued before the failure or the cap: lost like the rest
                with self._lock:
                    self.dropped_bytes += size
            return
        try:
            self._write_out([item[1] for item in items], size)
        except OSError as exc:
            self._fail(exc)
            with self._lock:
                self.dropped_bytes += size  # (a short write may have kept part of it: counted as lost)
            return
        for stream, chunk, now_s in items:
            self._index(stream, len(chunk), now_s)
        self._dirty = True
        if self.bytes_written - (self.omitted[1] - self.omitted[0] if self.omitted else 0) > \
                self._keep_head + self._keep_tail + self._punch_step:
            self._punch()
        if len(self._batch) >= INDEX_BATCH_ENTRIES or time.monotonic() - self._unflushed_since >= INDEX_FLUSH_S:
            self._flush_index()

    def _write_out(self, chunks: list[bytes], size: int) -> None:
        """Append `chunks` to output.log: one `writev` (no joined copy), the rest of a short write after."""
        if self._os_write is os.write and len(chunks) > 1:
            written = os.writev(self._log_fd, chunks[:IOV_MAX])
            if written == size:
                return
            data = b"".join(chunks)[written:]  # rare: a short write, or more than IOV_MAX chunks
        else:
            data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        view = memoryview(data)
        while view:
            view = view[self._os_write(self._log_fd, view):]

    def _index(self, stream: str, length: int, now_s: float) -> None:
        entry = self._open_entry
        if entry is not None and entry[1] == stream and now_s - entry[0] < COALESCE_S:  # type: ignore[operator]
            entry[3] += length  # type: ignore[operator]
        else:
            if entry is not None:
                self._batch.append(_index_line(entry))
            elif not self._batch:
                self._unflushed_since = time.monotonic()
            self._open_entry = [now_s, stream, self.bytes_written, length]
        self.bytes_written += length

    def _flush_index(self, close_entry: bool = False) -> None:
        """Write the finished index entries (and the open one when `close_entry`)."""
        if close_entry and self._open_entry is not None:
            self._batch.append(_index_line(self._open_entry))
            self._open_entry = None
        if not self._batch:
            return
        data, self._batch = "".join(self._batch).encode(), []
        if self._open_entry is not None:
            self._unflushed_since = time.monotonic()
        if not self.enabled:
            return
        try:
            view = memoryview(data)
            while view:
                view = view[self._os_write(self._idx_fd, view):]
        except OSError as exc:
            self._fail(exc)

    def _punch(self) -> None:
        """Free the middle of output.log: from the end of the head (or of the last hole) to the start of the tail."""
        start = self.omitted[1] if self.omitted else -(-self._keep_head // _BLOCK) * _BLOCK
        end = (self.bytes_written - self._keep_tail) // _BLOCK * _BLOCK
        if end <= start:
            return
        try:
            punch_hole(self._log_fd, start, end - start)
        except OSError as exc:
            # No holes here (an old NFS, a FUSE mount): stop at the cap rather than fill the disk. The relay's
            # in-memory tail still gives the diagnosis the end of the output (runner.py).
            with self._lock:
                self.capped_at = self.bytes_written
                self.enabled = False
                self._not_full.notify_all()
            self._warn(f"the run record's output reached {self.bytes_written >> 20} MiB and this filesystem cannot "
                       f"drop the middle of it ({exc.strerror or exc}); recording stopped there, the job goes on")
            return
        self.omitted = (self.omitted[0] if self.omitted else start, end)

    # -- the end --------------------------------------------------------------------------------

    def close(self, timeout_s: float | None = None) -> None:
        """Write out what is queued, the index's last entries, and close both files; wait for the
        disk at most `timeout_s` (default `CLOSE_WAIT_S`), then give up on the rest with a warning."""
        with self._lock:
            self._closing = True
            self._not_empty.notify()
            self._linger.notify()
        if self._thread is None:
            self._run()  # never started (the job did not start, or on_started failed): write here
        else:
            self._thread.join(CLOSE_WAIT_S if timeout_s is None else timeout_s)
            if self._thread.is_alive():
                with self._lock:  # still queued (or being written): count it as lost
                    self.dropped_bytes += self._queued_bytes
                    self.enabled = False
                    self.incomplete = True  # output.log may lack what was being written: don't diagnose from it
                return  # the thread still uses the files; the process exits soon
        # No final fsync: the page cache already holds everything and a sync here would add
        # milliseconds to every run's tear-down; the periodic sync bounds a machine crash's loss.
        self.enabled = False
        self._sync_request.set()  # let the sync thread end before the descriptors are closed
        for fd in (self._log_fd, self._idx_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.enabled = False

    def _fail(self, exc: OSError) -> None:
        with self._lock:
            self.failed = True    # before `enabled`: `write` reads both without the lock
            self.enabled = False
            self._not_full.notify_all()
        self._warn(f"cannot write the run record ({exc.strerror or exc}); recording stopped, the job goes on")


def output_cap(warn: Callable[[str], None] | None = None) -> tuple[int, int, int]:
    """(head, tail, step) bytes for output.log: the defaults, or GPUFIX_RECORD_OUTPUT_MAX split 1:3 with a
    step of at most a quarter of it. A value that does not parse, or is under 1 MiB (a cap of a few bytes would
    keep no traceback whole), leaves the defaults, and `warn` says so."""
    given = os.environ.get(OUTPUT_MAX_ENV, "").strip()
    raw = given.upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(raw[-1:], 1) if raw else 1
    try:
        total = int(float(raw.rstrip("KMGT")) * scale) if raw else 0
    except ValueError:
        total = 0
    if total < 1 << 20:
        if given and warn is not None:
            warn(f"{OUTPUT_MAX_ENV}={given} is not a size of at least 1 MiB (such as 512M or 2G); the record keeps "
                 f"the first {KEEP_HEAD >> 20} MiB and the last {KEEP_TAIL >> 20} MiB of the output")
        return KEEP_HEAD, KEEP_TAIL, PUNCH_STEP
    return total // 4, total - total // 4, min(PUNCH_STEP, total // 4)


FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x01, 0x02


def punch_hole(fd: int, offset: int, length: int) -> None:
    """Free `length` bytes of a file's blocks from `offset`, keeping its size (Linux fallocate(2)); OSError where
    the system or filesystem cannot."""
    import ctypes

    try:
        fallocate = ctypes.CDLL(None, use_errno=True).fallocate
    except (OSError, AttributeError):
        raise OSError(errno.ENOTSUP, "fallocate is not available here") from None
    fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    if fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


def _reuse_freed_memory() -> None:
    """Make glibc keep and reuse the memory of chunks the writer thread has written out.

    Chunks are allocated by the relay (up to 1 MiB reads) and freed by the writer thread a moment
    later. With glibc's defaults each is a fresh `mmap` or the heap is trimmed whenever the queue
    drains, so the kernel zero-fills every page again: 3-4x the relay's system time on a bulk
    writer. Only gpufix's own allocator is tuned (nothing reaches the job's environment); freed
    memory kept is bounded by the queue's size. Elsewhere (musl) this is a no-op.
    """
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
        mallopt(M_MMAP_THRESHOLD, 4 << 20)
        mallopt(M_TRIM_THRESHOLD, MAX_QUEUED_BYTES + (8 << 20))
    except (OSError, AttributeError):
        pass


def _index_line(entry: list[object]) -> str:
    t, stream, offset, length = entry
    return f'{{"t":{t:.6f},"stream":"{stream}","offset":{offset},"length":{length}}}\n'

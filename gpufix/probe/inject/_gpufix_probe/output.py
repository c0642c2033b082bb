"""The probe file: `<GPUFIX_PROBE_DIR>/<prefix>-<pid>.jsonl`, one JSON object per line.

Each record is one `os.write` on a file opened with O_APPEND, so a crash keeps every record
written before it and never leaves half a line from a buffer. The file is created at the first
record, which is always preceded by the `start` record. Size is bounded: past MAX_FILE_BYTES only
records marked essential (exceptions, the end) are written; the others are counted as dropped.
After a fork the child never writes into its parent's file (see `after_fork_in_child`).
"""

import json
import os
import threading
import time

FORMAT = 1
MAX_FILE_BYTES = 16 * 1024 * 1024


def _default(value):
    return str(value)


class Output(object):
    def __init__(self, directory, prefix, start_record):
        self.directory = directory
        self.prefix = prefix
        self.start_record = start_record  # callable -> dict, written first
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.fd = None
        self.size = 0
        self.dropped = 0
        self.failed = False

    @property
    def path(self):
        return os.path.join(self.directory, "%s-%d.jsonl" % (self.prefix, self.pid))

    @property
    def opened(self):
        return self.fd is not None

    def write(self, record, essential=False):
        """Append one record (a dict with `kind`); `t` (unix time) is added when missing."""
        if self.failed:
            return False
        with self.lock:
            if self.fd is None and not self._open():
                return False
            record.setdefault("t", round(time.time(), 6))
            line = (json.dumps(record, separators=(",", ":"), default=_default) + "\n").encode("utf-8", "replace")
            if not essential and self.size + len(line) > MAX_FILE_BYTES:
                self.dropped += 1
                return False
            self._write(line)
        return True

    def _open(self):
        try:
            os.makedirs(self.directory, exist_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
            self.fd = os.open(self.path, flags, 0o644)
            self.size = os.fstat(self.fd).st_size
            start = dict(self.start_record())
            start.setdefault("t", round(time.time(), 6))
            self._write((json.dumps(start, separators=(",", ":"), default=_default) + "\n").encode("utf-8", "replace"))
            return True
        except Exception:
            self.failed = True
            return False

    def _write(self, data):
        view = memoryview(data)
        while view:
            written = os.write(self.fd, view)
            view = view[written:]
        self.size += len(data)

    def after_fork_in_child(self):
        """The child gets its own lock and, at its first record, its own file."""
        self.lock = threading.Lock()
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
        self.fd = None
        self.pid = os.getpid()
        self.size = 0
        self.dropped = 0

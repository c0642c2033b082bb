"""Reading files that may be anything (shared log folders, rule folders) without hanging or
reading for ever.

Only regular files are read. A FIFO would block the open (or the read) until a writer comes, a
device such as `/dev/zero` never ends, a socket cannot be opened: each is reported as a note by
the caller (`not_regular` says what the path is) and never opened. `open_regular` opens with
O_NONBLOCK (so a FIFO swapped in after the check cannot block the open), checks the opened
descriptor again with fstat, and returns a reader that stops at the size stat-ed then: a log
that grows while it is read is read as it was, and nothing is read past that size.
"""

from __future__ import annotations

import io
import os
import stat

_OPEN_FLAGS = (os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
               | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0))


class NotRegularFile(OSError):
    """The path is not a regular file (its `strerror` says what it is)."""


_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"),
          (stat.S_ISLNK, "a symbolic link"))


def kind(mode: int) -> str:
    """What a file of this mode is, for a note: `a FIFO (named pipe)`, `a character device`, ..."""
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def _link_text(path: str) -> str:
    try:
        return f" (a symbolic link to {os.readlink(path)})" if os.path.islink(path) else ""
    except OSError:
        return ""


def not_regular(path: str) -> str | None:
    """None for a regular file (after following symbolic links), else why it is not read:
    `a FIFO (named pipe), not a regular file; not read`, `a dangling symbolic link to X; not read`,
    `cannot read (Permission denied)`."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            try:
                target = os.readlink(path)
            except OSError:
                target = "?"
            return f"a dangling symbolic link to {target}; not read"
        return "no longer exists; not read"
    except OSError as exc:
        return f"cannot read ({exc.strerror or exc})"
    if stat.S_ISREG(st.st_mode):
        return None
    return f"{kind(st.st_mode)}{_link_text(path)}, not a regular file; not read"


def is_regular(path: str) -> bool:
    return not_regular(path) is None


class _Bounded(io.RawIOBase):
    """A raw reader of an open regular file that ends at `size` (positional reads: pread)."""

    def __init__(self, fd: int, size: int) -> None:
        super().__init__()
        self._fd = fd
        self.size = size
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def,override]
        want = min(len(buffer), self.size - self._pos)
        if want <= 0:
            return 0
        view = memoryview(buffer).cast("B")[:want]
        if hasattr(os, "preadv"):
            got = os.preadv(self._fd, [view], self._pos)
        else:  # pragma: no cover - platforms without preadv
            data = os.pread(self._fd, want, self._pos)
            got = len(data)
            view[:got] = data
        self._pos += got
        return got

    def close(self) -> None:
        if not self.closed:
            try:
                os.close(self._fd)
            finally:
                super().close()


class BoundedReader(io.BufferedReader):
    """A buffered binary reader of a regular file, ending at the size it had when opened."""

    @property
    def size(self) -> int:
        return self.raw.size  # type: ignore[attr-defined,no-any-return]


def open_regular(path: str, buffer_size: int = io.DEFAULT_BUFFER_SIZE) -> BoundedReader:
    """Open `path` for reading if it is a regular file; reads end at the size it has now.

    Raises NotRegularFile (an OSError whose strerror says what the path is) for anything else,
    OSError when it cannot be opened. Never blocks on a FIFO.
    """
    why = not_regular(path)
    if why is not None:
        raise NotRegularFile(0, why, path)
    fd = os.open(path, _OPEN_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped in after the check above
            raise NotRegularFile(0, f"{kind(st.st_mode)}, not a regular file; not read", path)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        raw = _Bounded(fd, st.st_size)
    except BaseException:
        os.close(fd)
        raise
    return BoundedReader(raw, buffer_size)


def read_regular(path: str, limit: int | None = None) -> bytes:
    """The bytes of a regular file (at most `limit`); OSError / NotRegularFile as `open_regular`."""
    with open_regular(path) as stream:
        return stream.read(stream.size if limit is None else min(limit, stream.size))


__all__ = ["BoundedReader", "NotRegularFile", "is_regular", "kind", "not_regular", "open_regular",
           "read_regular"]

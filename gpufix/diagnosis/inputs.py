"""Reading what users pass: log files, stdin, pasted text. Each becomes `Evidence` through one
`LogScanner`; a file that looks binary (the wrong file passed) is refused with a clear message."""

from __future__ import annotations

import os
import stat

TYPE_CHECKING = False  # typing costs start-up time; annotations are strings (PEP 563)
if TYPE_CHECKING:
    from typing import BinaryIO

    from gpufix.evidence import Evidence
    from gpufix.logscan import LogScanner

from gpufix.errors import InputError

BINARY_SNIFF_BYTES = 65536
BINARY_CONTROL_RATIO = 0.30


def looks_binary(head: bytes) -> bool:
    """Whether the first bytes of an input are binary data rather than a log with some binary in it."""
    if not head:
        return False
    # Logs may hold a few NULs or invalid UTF-8 bytes; binary files are full of both.
    # Backspace and form feed are text here: Keras progress bars are a third backspaces.
    control = sum(1 for b in head if b < 32 and b not in (8, 9, 10, 11, 12, 13, 27)) + head.count(b"\x7f")
    undecodable = head.decode("utf-8", "replace").count("\ufffd")
    return (control + undecodable) / len(head) > BINARY_CONTROL_RATIO


class _Sniffed:
    """A binary stream whose first bytes were read to sniff for binary data, then replayed."""

    def __init__(self, stream: BinaryIO, head: bytes) -> None:
        self.stream, self.head = stream, head

    def read(self, size: int = -1) -> bytes:
        if self.head:
            out, self.head = self.head[:size] if size >= 0 else self.head, self.head[size:] if size >= 0 else b""
            return out
        return self.stream.read(size)


def scan(scanner: LogScanner, stream: BinaryIO, source: str, sniff: bool = True) -> Evidence:
    """Scan one input. `sniff`: refuse one that looks binary (a user passing the wrong file); a
    run record's output is the job's text with whatever binary it printed, and is always scanned."""
    try:
        head = stream.read(BINARY_SNIFF_BYTES)
    except OSError as exc:
        raise InputError(f"cannot read {source}: {exc.strerror or exc}") from None
    if sniff and looks_binary(head):
        raise InputError(
            f"{source} looks like binary data, not a log or traceback",
            hint="pass the text log (for a run record, the log file inside it)",
        )
    try:
        return scanner.scan_stream(_Sniffed(stream, head), source)  # type: ignore[arg-type]
    except OSError as exc:
        raise InputError(f"cannot read {source}: {exc.strerror or exc}") from None


def open_input(path: str) -> BinaryIO:
    """A log file for reading, or an InputError that says what is wrong with the path."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file", hint="pass a log file, or pipe a traceback: gpufix explain < err.txt") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{path} is a directory, not a log file", hint=f"pass the log files inside it, e.g. gpufix explain {path}/*.log")
    try:
        return open(path, "rb")
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None

"""Terminal handling: a pty for the job when gpufix itself writes to a terminal, and the
terminal's foreground handed to the job's process group while it runs.

A pty is what makes a bare job's colours, progress bars and line buffering behave as usual
under a wrapper (`script`, `unbuffer` do the same). Output processing (OPOST) is switched off
so the kernel passes bytes through unchanged: with it on, every `\\n` would come out `\\r\\n`.
The pty is never the job's controlling terminal: stdin, `/dev/tty` and Ctrl-C stay the real
terminal's, exactly as bare.
"""

from __future__ import annotations

import fcntl
import os
import termios

_WINSIZE_BYTES = b"\0" * 8


def window_size(fd: int) -> bytes | None:
    """The raw `struct winsize` of terminal `fd`, or None when it has none."""
    try:
        return fcntl.ioctl(fd, termios.TIOCGWINSZ, _WINSIZE_BYTES)
    except OSError:
        return None


def set_window_size(fd: int, size: bytes) -> None:
    try:
        fcntl.ioctl(fd, termios.TIOCSWINSZ, size)
    except OSError:
        pass


def open_pty(model_fd: int) -> tuple[int, int]:
    """A (master, slave) pair shaped like terminal `model_fd` (modes, window size), OPOST off."""
    master, slave = os.openpty()
    try:
        attrs = termios.tcgetattr(model_fd)
    except termios.error:
        attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.OPOST  # oflag: no \n -> \r\n or any other output rewriting
    try:
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
    except termios.error:
        pass
    size = window_size(model_fd)
    if size is not None:
        set_window_size(slave, size)
    return master, slave


def can_take_foreground() -> bool:
    """True when stdin is our controlling terminal and our process group holds its foreground.

    Only then does the job get the foreground (so it can read the terminal without SIGTTIN);
    a wrapper that grabs a terminal it did not own stops other jobs (Yelp/dumb-init#51).
    """
    try:
        return os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False


def give_foreground(pgid: int) -> bool:
    """Make `pgid` the foreground group of the terminal on stdin (SIGTTOU is ignored by us)."""
    try:
        os.tcsetpgrp(0, pgid)
        return True
    except OSError:
        return False


def holds_foreground() -> bool:
    try:
        return os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False

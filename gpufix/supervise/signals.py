"""Signal plumbing for the supervisor: forward what the job must see, wake the relay on SIGCHLD.

Dispositions are captured before gpufix changes any, so the job can be given exactly what it
would have had bare: a signal the caller ignored (`nohup`, a background job in a script) stays
ignored in the job; one at its default gets forwarded. Handlers run in the main thread; a
self-pipe (`signal.set_wakeup_fd`) makes the relay's `poll` return at once, since PEP 475
would otherwise resume the poll after a handler that does not raise.
"""

from __future__ import annotations

import os
import signal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType
    from typing import Any

    Disposition = Any  # signal.Handlers or a callable, as signal.getsignal returns

# What a supervisor forwards to the job's process group (torchrun forwards the first four;
# USR1/USR2 carry Slurm's and Lightning's requeue requests; WINCH follows the window).
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGWINCH)
# Terminal job control: Ctrl-Z must stop the job and return the prompt, as it would bare.
STOP_REQUEST = signal.SIGTSTP
# Ignored by the supervisor so it can hand the terminal over and take it back from the background.
TERMINAL_ACCESS = (signal.SIGTTOU, signal.SIGTTIN)
MANAGED = FORWARDED + (STOP_REQUEST, signal.SIGCHLD) + TERMINAL_ACCESS


def startup_dispositions() -> dict[int, Disposition]:
    """Each managed signal's disposition as the caller set it, before gpufix touches any.

    Python itself installs a SIGINT handler at start-up only when SIGINT was at its default,
    so finding Python's handler means the caller left it at SIG_DFL.
    """
    found: dict[int, Disposition] = {}
    for signum in MANAGED:
        current = signal.getsignal(signum)
        if current is signal.default_int_handler or current is None or callable(current):
            current = signal.SIG_DFL
        found[signum] = current
    return found


class SignalHub:
    """Installs the supervisor's handlers and restores the caller's dispositions afterwards."""

    def __init__(self, initial: dict[int, Disposition], on_signal: Callable[[int], None]) -> None:
        self.initial = initial
        self._on_signal = on_signal
        self._saved: dict[int, Disposition] = {}
        self._wakeup_r, self._wakeup_w = os.pipe()
        os.set_blocking(self._wakeup_r, False)
        os.set_blocking(self._wakeup_w, False)
        self._old_wakeup = -1

    @property
    def wakeup_fd(self) -> int:
        """Readable whenever a signal arrived; the relay polls it alongside the job's output."""
        return self._wakeup_r

    def install(self) -> None:
        self._old_wakeup = signal.set_wakeup_fd(self._wakeup_w, warn_on_full_buffer=False)
        for signum in FORWARDED + (STOP_REQUEST,):
            # A signal the caller ignored stays ignored: the job inherits SIG_IGN, as it would bare.
            if self.initial.get(signum) is not signal.SIG_IGN:
                self._saved[signum] = signal.signal(signum, self._handle)
        self._saved[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, self._handle)
        for signum in TERMINAL_ACCESS:
            self._saved[signum] = signal.signal(signum, signal.SIG_IGN)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum != signal.SIGCHLD:
            self._on_signal(signum)

    def drain(self) -> None:
        """Empty the wake-up pipe (the handlers have already run)."""
        try:
            while os.read(self._wakeup_r, 512):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def restore(self) -> None:
        for signum, old in self._saved.items():
            try:
                signal.signal(signum, old if old is not None else signal.SIG_DFL)
            except (OSError, ValueError, TypeError):
                pass
        self._saved.clear()
        signal.set_wakeup_fd(self._old_wakeup)
        for fd in (self._wakeup_r, self._wakeup_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def child_dispositions(self) -> list[tuple[int, Disposition]]:
        """What the child must reset before exec: every signal the supervisor set to SIG_IGN or
        that the caller ignored (exec resets caught handlers to SIG_DFL by itself)."""
        resets = {s: self.initial.get(s, signal.SIG_DFL) for s in TERMINAL_ACCESS}
        resets.update({s: d for s, d in self.initial.items() if d is signal.SIG_IGN})
        return list(resets.items())

"""Run one job transparently: spawn it, relay its output, forward signals, reap it, clean up.

The job's exit status, bytes, terminal, signals, stdin, cwd and environment are what they would
be bare (see docs/run-record.md and the `gpufix run` help). One thread does all the work, in a
`poll` loop over the job's output and a signal self-pipe with no timeout while the job runs
(only a job that owns the terminal gets a window-size check every 0.25 s), so the supervisor
costs no CPU while the job is quiet. The `sink` must return at once: the run record queues
chunks for its own writer thread. At the end the loop stops as soon as the job has exited and
its pipes are at EOF; only a pipe that a grandchild still holds open is given
`IDLE_AFTER_EXIT_S` of quiet (at most `DRAIN_MAX_S`).
"""

from __future__ import annotations

import os
import select
import signal
import time

from gpufix.supervise import terminal
from gpufix.supervise.relay import Relay, Stream
from gpufix.supervise.signals import SignalHub, startup_dispositions
from gpufix.supervise.spawn import SpawnError, inherited_fds, original_environ, spawn, start_guardian

TYPE_CHECKING = False  # typing costs start-up time: annotations only (PEP 563 keeps them strings)
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from gpufix.supervise.relay import Sink

IDLE_AFTER_EXIT_S = 0.2    # stop relaying once the job has exited and its pipes are this quiet
DRAIN_MAX_S = 2.0          # ... or after this long, if a grandchild keeps writing
GROUP_GRACE_S = 1.0        # leftover processes get SIGTERM, then SIGKILL after this
WINSIZE_POLL_S = 0.25      # window-size check while the job owns the terminal (it gets SIGWINCH, we don't)
INDEX_FLUSH_POLL_S = 1.0
_TERMINAL_STOPS = (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)


class JobResult:
    """How the job ended, in the shell's terms (`exit_status`) and in detail.

    A plain class, not a dataclass: `dataclasses` imports `inspect`, ~10 ms of every run's start.
    """

    __slots__ = ("exit_status", "returncode", "signal", "pid", "started_unix", "duration_s", "spawn_error",
                 "forwarded_signals", "output_bytes", "stderr_needs_newline", "output_blocked_s", "output_lost",
                 "diagnosed_record")

    def __init__(self, exit_status: int, returncode: int | None, signal: int | None, pid: int | None,
                 started_unix: float, duration_s: float, spawn_error: str | None = None,
                 forwarded_signals: tuple[int, ...] = (), output_bytes: int = 0,
                 stderr_needs_newline: bool = False, output_blocked_s: dict[int, float] | None = None,
                 output_lost: dict[str, list] | None = None) -> None:  # type: ignore[type-arg]
        self.exit_status = exit_status      # what `gpufix run` exits with: the status, or 128+N for signal N
        self.returncode = returncode        # Python's convention: -N for signal N; None if it never started
        self.signal = signal                # the signal that ended the job
        self.pid = pid
        self.started_unix = started_unix
        self.duration_s = duration_s
        self.spawn_error = spawn_error      # "cmd: command not found" and the like
        self.forwarded_signals = forwarded_signals
        self.output_bytes = output_bytes
        self.stderr_needs_newline = stderr_needs_newline  # the job's last byte on our stderr was not \n
        self.output_blocked_s = output_blocked_s or {}  # second of the run -> seconds the relay waited to write
        self.output_lost = output_lost or {}  # stream -> [bytes gpufix could not write to its own stdout/stderr, why]
        self.diagnosed_record: str | None = None  # set by gpufix run: the kept record whose diagnosis found something

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"JobResult({fields})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, JobResult):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in self.__slots__)

    __hash__ = None  # type: ignore[assignment]


class _Channels:
    def __init__(self, streams: list[Stream], child_stdout: int, child_stderr: int, child_ends: list[int],
                 ptys: list[tuple[int, int]] | None = None) -> None:
        self.streams = streams
        self.child_stdout = child_stdout
        self.child_stderr = child_stderr
        self.child_ends = child_ends          # closed in the parent once the child has them
        self.ptys = ptys or []                # (master, terminal it mirrors)


def _open_channels() -> _Channels:
    """A pty for each of our outputs that is a terminal (one shared pty when stdout and stderr are
    the same terminal, so their order is exact); a pipe otherwise, never a pty in batch use."""
    out_tty, err_tty = os.isatty(1), os.isatty(2)
    if out_tty and err_tty and os.fstat(1).st_rdev == os.fstat(2).st_rdev:
        master, slave = terminal.open_pty(1)
        return _Channels([Stream("tty", master, 1)], slave, slave, [slave], [(master, 1)])
    streams, ends, ptys, child = [], [], [], []
    for name, target, is_tty in (("stdout", 1, out_tty), ("stderr", 2, err_tty)):
        if is_tty:
            read_end, write_end = terminal.open_pty(target)
            ptys.append((read_end, target))
        else:
            read_end, write_end = os.pipe()
            _widen_pipe(write_end)
        streams.append(Stream(name, read_end, target))
        ends.append(write_end)
        child.append(write_end)
    return _Channels(streams, child[0], child[1], ends, ptys)


PIPE_BYTES = 1 << 20
F_SETPIPE_SZ = 1031


def _widen_pipe(fd: int) -> None:
    """A 1 MiB pipe (Linux's default is 64 KiB): a burst of output waits in the kernel instead of
    blocking the job while the relay writes the previous chunk out twice."""
    try:
        import fcntl

        fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_BYTES)
    except OSError:
        pass  # over /proc/sys/fs/pipe-max-size for unprivileged users: keep the default


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


class Supervisor:
    """Runs `argv` once. `sink` receives every output chunk; `on_started(pid)` runs right after
    the job has started (record metadata, samplers); `warn` reports gpufix's own problems."""

    def __init__(self, argv: Sequence[str], sink: Sink | None = None,
                 on_started: Callable[[int], None] | None = None,
                 warn: Callable[[str], None] | None = None,
                 env: dict[bytes, bytes] | None = None,
                 index_pending: Callable[[], bool] | None = None,
                 on_idle: Callable[[], None] | None = None) -> None:
        self.argv = list(argv)
        self.sink = sink
        self.on_started = on_started
        self.warn = warn or (lambda message: None)
        self.env = env if env is not None else original_environ()
        self._index_pending = index_pending or (lambda: False)
        self._on_idle = on_idle or (lambda: None)
        self.pgid: int | None = None
        self._pending: list[int] = []
        self._forwarded: list[int] = []
        self._gave_foreground = False
        self._ptys: list[tuple[int, int]] = []
        self._winsizes: dict[int, bytes | None] = {}

    # -- signals -----------------------------------------------------------------------------

    def _on_signal(self, signum: int) -> None:
        if self.pgid is None:
            self._pending.append(signum)  # arrived before the job existed: deliver once it does
            return
        if signum == signal.SIGWINCH:
            self._sync_window_sizes(notify=False)
        self._forwarded.append(signum)
        self._kill_group(signum)

    def _kill_group(self, signum: int) -> None:
        if self.pgid is None:
            return
        try:
            os.killpg(self.pgid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def _sync_window_sizes(self, notify: bool) -> None:
        changed = False
        for master, model in self._ptys:
            size = terminal.window_size(model)
            if size is not None and size != self._winsizes.get(master):
                self._winsizes[master] = size
                terminal.set_window_size(master, size)
                changed = True
        if changed and notify:
            self._kill_group(signal.SIGWINCH)

    # -- job control ---------------------------------------------------------------------------

    def _job_stopped(self, stop_signal: int) -> None:
        """The job stopped for the terminal (Ctrl-Z, background read): stop too, so the shell gets
        its prompt back; when continued, hand the terminal back and continue the job."""
        if stop_signal not in _TERMINAL_STOPS:
            return  # SIGSTOP from a debugger or an admin: not the shell's business
        if self._gave_foreground:
            terminal.give_foreground(os.getpgrp())
        os.kill(os.getpid(), signal.SIGSTOP)
        # ... resumed by `fg` or `bg`.
        if self._gave_foreground and self.pgid is not None and terminal.holds_foreground():
            terminal.give_foreground(self.pgid)
        self._kill_group(signal.SIGCONT)

    def _reap(self, pid: int) -> int | None:
        """The job's return code once it has exited (handling stops), else None."""
        try:
            found, status = os.waitpid(pid, os.WNOHANG | os.WUNTRACED)
        except ChildProcessError:
            return 0
        if found == 0:
            return None
        if os.WIFSTOPPED(status):
            self._job_stopped(os.WSTOPSIG(status))
            return None
        return os.waitstatus_to_exitcode(status)

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> JobResult:
        initial = startup_dispositions()
        passed = inherited_fds()
        channels = _open_channels()
        self._ptys = channels.ptys
        hub = SignalHub(initial, self._on_signal)
        hub.install()
        take_foreground = terminal.can_take_foreground()
        started_unix, t0 = time.time(), time.monotonic()
        try:
            try:
                proc = spawn(self.argv, self.env, channels.child_stdout, channels.child_stderr,
                             take_foreground, hub.child_dispositions(), passed)
            except SpawnError as exc:
                if take_foreground:
                    terminal.give_foreground(os.getpgrp())  # the failed child may have taken it
                return JobResult(exc.exit_status, None, None, None, started_unix,
                                 time.monotonic() - t0, spawn_error=exc.message)
            finally:
                for fd in channels.child_ends:
                    _close(fd)
            self.pgid = proc.pid
            guardian = start_guardian(proc.pid)  # kills the job's group should gpufix be SIGKILLed
            self._gave_foreground = take_foreground
            for signum in self._pending:
                self._on_signal(signum)
            self._pending.clear()
            if self.on_started is not None:
                try:
                    self.on_started(proc.pid)
                except Exception as exc:  # noqa: BLE001 - recording must never hurt the job
                    self.warn(f"could not start recording metadata: {type(exc).__name__}: {exc}")
            relay = Relay(channels.streams, self.sink)
            returncode = self._loop(proc.pid, relay, hub, t0)
            proc.returncode = returncode  # reaped by us; keeps Popen from waiting again
            duration = time.monotonic() - t0
            self._end_group()
            if guardian is not None:
                guardian.stop()
        finally:
            if self._gave_foreground:
                terminal.give_foreground(os.getpgrp())
            hub.restore()
            for stream in channels.streams:
                if stream.open:
                    _close(stream.source)
        sig = -returncode if returncode < 0 else None
        err_target = [s for s in channels.streams if s.target == (1 if channels.streams[0].name == "tty" else 2)]
        last = relay.last_byte.get(err_target[0].target) if err_target else None
        return JobResult(
            exit_status=128 + sig if sig else returncode, returncode=returncode, signal=sig, pid=proc.pid,
            started_unix=started_unix, duration_s=duration, forwarded_signals=tuple(self._forwarded),
            output_bytes=relay.bytes_relayed, stderr_needs_newline=last is not None and last != 0x0A,
            output_blocked_s=relay.blocked_s, output_lost=relay.lost,
        )

    def _loop(self, pid: int, relay: Relay, hub: SignalHub, t0: float) -> int:
        poller = select.poll()
        by_fd = {}
        for stream in relay.streams.values():
            poller.register(stream.source, select.POLLIN)
            by_fd[stream.source] = stream
        poller.register(hub.wakeup_fd, select.POLLIN)
        open_count = len(by_fd)
        watch_winsize = bool(self._ptys) and self._gave_foreground
        if self._ptys:
            self._sync_window_sizes(notify=False)
        returncode: int | None = None
        exited_at = 0.0
        next_winsize_check = time.monotonic() + WINSIZE_POLL_S
        while True:
            now = time.monotonic()
            if returncode is not None:
                if open_count == 0 or now - exited_at > DRAIN_MAX_S:
                    break
                timeout_s: float | None = IDLE_AFTER_EXIT_S
            else:
                timeout_s = None
                if watch_winsize:
                    timeout_s = max(0.0, next_winsize_check - now)
                if self._index_pending():
                    timeout_s = min(timeout_s if timeout_s is not None else INDEX_FLUSH_POLL_S, INDEX_FLUSH_POLL_S)
            events = poller.poll(None if timeout_s is None else timeout_s * 1000)
            now = time.monotonic()
            if not events:
                if returncode is not None:
                    break  # exited and quiet: a grandchild may hold the pipe open for ever
                self._on_idle()
            check_child = False
            for fd, _mask in events:
                if fd == hub.wakeup_fd:
                    hub.drain()
                    check_child = True
                    continue
                stream = by_fd[fd]
                if not relay.pump(stream, now - t0):
                    poller.unregister(fd)
                    _close(fd)
                    stream.open = False
                    open_count -= 1
            if watch_winsize and now >= next_winsize_check:
                self._sync_window_sizes(notify=True)
                next_winsize_check = now + WINSIZE_POLL_S
            if check_child and returncode is None:
                returncode = self._reap(pid)
                if returncode is not None:
                    exited_at = now
        return returncode

    def _end_group(self) -> None:
        """No orphans: whatever is left of the job's process group gets TERM, then KILL."""
        pgid = self.pgid
        if pgid is None or not _group_alive(pgid):
            return
        for signum in (signal.SIGTERM, signal.SIGCONT):
            self._kill_group(signum)
        deadline = time.monotonic() + GROUP_GRACE_S
        while time.monotonic() < deadline:
            time.sleep(0.02)
            if os.getpid() == 1:
                _reap_orphans()  # as a container's init, orphans are ours to reap
            if not _group_alive(pgid):
                return
        self._kill_group(signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
    """True while a process of the group still runs. Zombies do not count: an init that is slow to
    reap (containers, sandboxes) would otherwise make every run wait out the whole grace period."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


def _reap_orphans() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass

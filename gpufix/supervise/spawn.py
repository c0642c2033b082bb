"""Start the job as the caller would have: same argv, environment, cwd, stdin, inherited fds and
signal dispositions; in its own process group; killed if gpufix dies.

The child-side steps run between fork and exec (`preexec_fn`), which is safe here because the
supervisor starts no thread before the job exists.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

PR_SET_PDEATHSIG = 1
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126


class SpawnError(Exception):
    """The command could not be started; `exit_status` is what a shell would return."""

    def __init__(self, message: str, exit_status: int) -> None:
        super().__init__(message)
        self.message = message
        self.exit_status = exit_status


def original_environ() -> dict[bytes, bytes]:
    """The environment gpufix was started with, byte for byte.

    `/proc/self/environ` is the block the kernel received at exec, before Python's start-up
    could change anything (PEP 538 sets LC_CTYPE in a C locale); `os.environb` is the fallback.
    """
    try:
        with open("/proc/self/environ", "rb") as f:
            block = f.read()
    except OSError:
        return dict(os.environb)
    env: dict[bytes, bytes] = {}
    for entry in block.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and name and name not in env:  # execve keeps the first of duplicates for getenv
            env[name] = value
    return env


def inherited_fds() -> list[int]:
    """Descriptors above 2 the caller passed to gpufix (not close-on-exec): the job gets them too,
    so `gpufix run -- cmd 3>file` and make's job-server pipes work as they would bare."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return []
    fds = []
    for name in names:
        fd = int(name)
        if fd > 2:
            try:
                if os.get_inheritable(fd):
                    fds.append(fd)
            except OSError:
                continue
    return fds


def die_with_parent(signum: int = signal.SIGKILL) -> Any:
    """A preexec_fn that has the child receive `signum` when the process that started it dies
    (Linux's PR_SET_PDEATHSIG; a no-op elsewhere), and end at once if that already happened."""
    parent_pid = os.getpid()
    prctl = _prctl()

    def in_child() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
            if os.getppid() != parent_pid:
                os.kill(os.getpid(), signum)

    return in_child


def _prctl() -> Any:
    """libc's prctl, looked up in the parent so the child only calls it."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def spawn(argv: Sequence[str], env: Mapping[bytes, bytes], stdout: int, stderr: int,
          take_foreground: bool, resets: list[tuple[int, Any]], pass_fds: Sequence[int]) -> subprocess.Popen[bytes]:
    """Start `argv`; raise SpawnError with 127/126 when it cannot be executed."""
    die_with_gpufix = die_with_parent(signal.SIGKILL)

    def in_child() -> None:
        # Runs after fork, before exec. Order matters: own group first, then the terminal
        # (the new group must exist before it can be made foreground), then dispositions.
        os.setpgid(0, 0)
        if take_foreground:
            try:
                os.tcsetpgrp(0, os.getpgrp())  # SIGTTOU is still ignored, inherited from us
            except OSError:
                pass
        for signum, disposition in resets:
            signal.signal(signum, disposition)
        die_with_gpufix()  # (and at once if gpufix died before the death signal was armed)

    def start(args: Sequence[str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            list(args), env=dict(env), stdin=None, stdout=stdout, stderr=stderr,
            close_fds=True, pass_fds=tuple(pass_fds), preexec_fn=in_child,
            restore_signals=True,  # SIGPIPE/SIGXFSZ back to default: Python ignores them
        )

    try:
        return start(argv)
    except FileNotFoundError:
        name = argv[0]
        if os.sep in name:
            raise SpawnError(f"{name}: No such file or directory", EXIT_NOT_FOUND) from None
        raise SpawnError(f"{name}: command not found", EXIT_NOT_FOUND) from None
    except PermissionError:
        raise SpawnError(f"{argv[0]}: Permission denied", EXIT_NOT_EXECUTABLE) from None
    except OSError as exc:
        if exc.errno == errno.ENOEXEC:
            # No #! line: run it with sh, as a shell and execvp(3) do.
            try:
                return start(["/bin/sh", _which(argv[0], env), *argv[1:]])
            except OSError as exc2:
                raise SpawnError(f"{argv[0]}: {exc2.strerror}", EXIT_NOT_EXECUTABLE) from None
        raise SpawnError(f"{argv[0]}: {exc.strerror or exc}", EXIT_NOT_EXECUTABLE) from None


def _which(name: str, env: Mapping[bytes, bytes]) -> str:
    if os.sep in name:
        return name
    import shutil

    path = env.get(b"PATH", os.defpath.encode()).decode(errors="surrogateescape")
    return shutil.which(name, path=path) or name


class Guardian:
    """A forked process that kills the job's process group if gpufix dies, SIGKILL included.

    The job's direct child has PR_SET_PDEATHSIG; its own children (DataLoader workers, a
    launcher's ranks, `cmd &` in a script) do not, and would live on holding GPUs. The guardian
    waits on a pipe whose write end only gpufix holds: end of file without the "done" byte means
    gpufix is gone, and the guardian kills the job's group."""

    def __init__(self, pid: int, fd: int) -> None:
        self.pid, self.fd = pid, fd

    def stop(self) -> None:
        """The run ended normally: let the guardian exit without killing anything."""
        try:
            os.write(self.fd, b"d")
        except OSError:
            pass
        try:
            os.close(self.fd)
        except OSError:
            pass
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:  # already reaped (gpufix as a container's init reaps orphans)
            pass


def start_guardian(pgid: int) -> Guardian | None:
    """Fork the guardian of process group `pgid`; None where that cannot be done (no fork)."""
    import warnings

    try:
        read_end, write_end = os.pipe()  # neither is inherited by anything gpufix spawns later
    except OSError:
        return None
    try:
        with warnings.catch_warnings():  # Python 3.12 warns on fork() with threads: nothing here takes a lock
            warnings.simplefilter("ignore")
            pid = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        return None
    if pid == 0:  # the guardian: only system calls from here on
        try:
            for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
                           signal.SIGUSR2, signal.SIGPIPE, signal.SIGTSTP):
                signal.signal(signum, signal.SIG_IGN)  # the terminal's Ctrl-C is for the job and gpufix
            os.closerange(0, read_end)  # hold nothing of gpufix's: its pipes and files close when it does
            os.closerange(read_end + 1, 1 << 16)
            while True:
                try:
                    done = os.read(read_end, 1)
                    break
                except InterruptedError:
                    continue
            if not done:
                os.killpg(pgid, signal.SIGKILL)
        except BaseException:  # noqa: BLE001 - never return into gpufix's code in the child
            pass
        finally:
            os._exit(0)
    os.close(read_end)
    return Guardian(pid, write_end)

"""Promise 3: on a terminal the job gets a terminal (bytes unchanged, size, Ctrl-C once); piped,
it gets pipes."""

from __future__ import annotations

import fcntl
import os
import select
import signal
import struct
import subprocess
import termios
import time
import tty
from pathlib import Path

from tests.run.helpers import env, gpufix_run, script

PROBE = """
import os, signal, sys, time
print("tty", os.isatty(0), os.isatty(1), os.isatty(2), os.get_terminal_size(1), flush=True)
os.write(1, b"a\\nb\\r\\n\\x1b[32mgreen\\x1b[0m\\n")
os.write(2, b"to stderr\\n")
"""


def _raw_pty(rows: int = 33, cols: int = 111) -> tuple[int, int]:
    master, slave = os.openpty()
    tty.setraw(slave)  # the outer terminal itself rewrites nothing, so we see gpufix's bytes
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    return master, slave


def _drain(master: int, proc: subprocess.Popen[bytes], until: bytes | None = None, timeout_s: float = 20) -> bytes:
    out = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if until is not None and until in out:
            break
        ready, _, _ = select.select([master], [], [], 0.05)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        elif until is None and proc.poll() is not None:
            break
    return out


def test_on_a_terminal_the_job_gets_one_with_bytes_unchanged_and_the_window_size(tmp_path: Path) -> None:
    child = script(tmp_path, "probe.py", PROBE)
    master, slave = _raw_pty()
    proc = subprocess.Popen([*gpufix_run(tmp_path / "r"), str(child)], stdin=subprocess.DEVNULL, stdout=slave,
                            stderr=slave, env=env())
    os.close(slave)
    out = _drain(master, proc)
    proc.wait(10)
    os.close(master)
    assert proc.returncode == 0
    assert b"tty False True True os.terminal_size(columns=111, lines=33)\n" in out
    assert b"a\nb\r\n\x1b[32mgreen\x1b[0m\nto stderr\n" in out  # no \n -> \r\n rewriting


def test_piped_the_job_gets_pipes_never_a_pty(tmp_path: Path) -> None:
    child = script(tmp_path, "isatty.py", "import os; print(os.isatty(0), os.isatty(1), os.isatty(2))")
    result = subprocess.run([*gpufix_run(tmp_path / "r"), str(child)], stdin=subprocess.DEVNULL, capture_output=True, env=env())
    assert result.stdout == b"False False False\n"


def test_sigwinch_updates_the_jobs_window_size(tmp_path: Path) -> None:
    child = script(tmp_path, "winch.py", (
        "import os, signal, sys, time\n"
        "def on_winch(s, f):\n    print('size', tuple(os.get_terminal_size(1)), flush=True); sys.exit(0)\n"
        "signal.signal(signal.SIGWINCH, on_winch)\n"
        "print('ready', flush=True)\n"
        "time.sleep(20)\n"
    ))
    master, slave = _raw_pty()
    proc = subprocess.Popen([*gpufix_run(tmp_path / "r"), str(child)], stdin=subprocess.DEVNULL, stdout=slave,
                            stderr=slave, env=env())
    assert b"ready" in _drain(master, proc, until=b"ready\n")
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 150, 0, 0))
    os.close(slave)
    proc.send_signal(signal.SIGWINCH)
    out = _drain(master, proc)
    proc.wait(10)
    os.close(master)
    assert b"size (150, 50)" in out


def test_ctrl_c_on_the_terminal_reaches_the_job_exactly_once_and_it_can_read_the_terminal(tmp_path: Path) -> None:
    child = script(tmp_path, "ctrlc.py", (
        "import signal, sys, time\n"
        "hits = []\n"
        "signal.signal(signal.SIGINT, lambda s, f: hits.append(s))\n"
        "print('ready', flush=True)\n"
        "line = sys.stdin.readline()\n"  # only the foreground group may read the terminal
        "print('read', line.strip(), flush=True)\n"
        "deadline = time.time() + 10\n"
        "while not hits and time.time() < deadline:\n    time.sleep(0.01)\n"
        "time.sleep(0.5)\n"
        "print('hits', len(hits), flush=True)\n"
        "sys.exit(5)\n"
    ))
    master, slave = os.openpty()
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.OPOST
    attrs[3] &= ~termios.ECHO
    termios.tcsetattr(slave, termios.TCSANOW, attrs)

    def controlling_terminal() -> None:
        os.setsid()  # gpufix leads a session whose terminal is this pty, as a login shell's job would
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen([*gpufix_run(tmp_path / "r"), str(child)], stdin=slave, stdout=slave, stderr=slave,
                            env=env(), preexec_fn=controlling_terminal)
    os.close(slave)
    assert b"ready" in _drain(master, proc, until=b"ready\n")
    os.write(master, b"hello\n")
    assert b"read hello" in _drain(master, proc, until=b"read hello")
    os.write(master, b"\x03")  # Ctrl-C: the terminal signals its foreground group
    out = _drain(master, proc, until=b"hits")
    out += _drain(master, proc)
    proc.wait(10)
    os.close(master)
    assert b"hits 1\n" in out
    assert proc.returncode == 5

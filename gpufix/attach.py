"""`gpufix attach PID`: watch a job that was started without gpufix, and never touch it.

What gpufix run gets from being the parent, attach gets from outside: the output by following
the job's log file (`tail -F`: across rotation and truncation) into the record's `output.log`,
GPU telemetry and the hang watchdog exactly as under `gpufix run` (`JobMonitor`), and the end of
the job by polling /proc (it is not our child: its exit status cannot be known). Ctrl-C or TERM
detaches: the record is closed and the job goes on; attach sends the job no signal, unless
`on_hang="kill"` was asked for explicitly.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpufix.watchdog.watchdog import HangReport

from gpufix.errors import InputError
from gpufix.record import RunRecord
from gpufix.record.meta import utc_iso
from gpufix.runner import warn as stderr_warning
from gpufix.watchdog.monitor import JobMonitor, nvml_source
from gpufix.watchdog.proctree import cmdline, read_proc

POLL_S = 0.2
READ_BYTES = 1 << 20


class LogFollower:
    """Follows a file by name like `tail -F`: new bytes, a rotated file (the rest of the old one,
    then the new one from its start), a truncated one (from its start again), one not there yet."""

    def __init__(self, path: str, from_start: bool = False) -> None:
        self.path = path
        self._f: Any = None
        self._ino: int | None = None
        self._open(seek_end=not from_start)

    def _open(self, seek_end: bool) -> None:
        try:
            f = open(self.path, "rb")
        except OSError:
            return
        st = os.fstat(f.fileno())
        if seek_end:
            f.seek(st.st_size)
        self._f, self._ino = f, st.st_ino

    def read(self) -> bytes:
        """What was appended since the last call ('' when nothing was)."""
        if self._f is None:
            self._open(seek_end=False)  # created after we started: all of it is new
            return self._drain() if self._f is not None else b""
        out = self._drain()
        try:
            st = os.stat(self.path)
        except OSError:
            return out  # moved away, not recreated yet: keep reading the old one
        if st.st_ino != self._ino:  # rotated: finish the old file, then the new one from its start
            out += self._drain()
            self._f.close()
            self._open(seek_end=False)
            return out + (self._drain() if self._f is not None else b"")
        if st.st_size < self._f.tell():  # truncated (copytruncate, `> log`)
            self._f.seek(0)
            out += self._drain()
        return out

    def _drain(self) -> bytes:
        parts = []
        while True:
            chunk = self._f.read(READ_BYTES)
            if not chunk:
                return b"".join(parts)
            parts.append(chunk)

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


@dataclass(frozen=True)
class AttachedJob:
    """The `RunningJob` shape `JobMonitor.start` reads."""

    pid: int
    pgid: int
    started_unix: float
    record_dir: str | None


def _alive(pid: int) -> bool:
    info = read_proc(pid)
    return info is not None and info.state != "Z"


def output_file(pid: int) -> str | None:
    """The regular file the job's stdout (else stderr) writes to, as `nohup python train.py > train.log 2>&1 &`
    leaves it: the log `attach` follows when none is named. None for a terminal, a pipe, /dev/null, a deleted
    file, or a process whose descriptors cannot be read (another user's)."""
    for fd in (1, 2):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/") and not target.endswith(" (deleted)") and os.path.isfile(target):
            return target
    return None


def attach(pid: int, record_parent: str, log: str | None = None, name: str | None = None,
           interval_s: float = 1.0, hang_timeout_s: float = 600.0, on_hang: str = "wait",
           source_factory: Callable[[], Any] = nvml_source, report: Callable[[HangReport], None] | None = None,
           log_from_start: bool = False, warn: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Watch `pid` until it ends or we are told to detach (SIGINT/SIGTERM); returns result.json's content.

    The record is written as `gpufix run` writes one (gpufix.record: output.log with its index,
    meta.json, result.json) and, when the job has ended, diagnosed as one: its output, telemetry,
    stack dumps and probe files together."""
    if not _alive(pid):
        raise InputError(f"no running process with pid {pid}", hint="list candidates with: ps -ef | grep python")
    started = time.time()
    command = cmdline(pid)
    run_record = RunRecord.create(record_parent, name or _name(command, pid), started, warn or stderr_warning)
    record = run_record.path
    out_path = run_record.output_log
    run_record.write_meta({"format": 1, "mode": "attach", "status": "running", "job_pid": pid, "gpufix_pid": os.getpid(),
                           "command": command.split(), "log": os.path.abspath(log) if log else None,
                           "record_dir": os.path.abspath(record), "start_utc": utc_iso(started), "end_utc": None})
    try:
        pgid = os.getpgid(pid)
    except OSError:
        pgid = -1
    monitor = JobMonitor(interval_s, hang_timeout_s, on_hang, record, source_factory=source_factory,
                         activity_file=out_path, report=report)
    follower = LogFollower(log, from_start=log_from_start) if log else None
    detached = {"signal": None}

    def detach(signum: int, _frame: object) -> None:
        detached["signal"] = signal.Signals(signum).name

    old = {s: signal.signal(s, detach) for s in (signal.SIGINT, signal.SIGTERM)}
    output_bytes = 0
    try:
        run_record.output.start()
        monitor.start(AttachedJob(pid, pgid, started, record))
        while detached["signal"] is None:
            ended = not _alive(pid)
            if follower is not None:
                data = follower.read()
                if data:
                    run_record.output.write("stdout", data, time.time() - started)  # a log file: one stream
                    output_bytes += len(data)
            if ended:
                break
            time.sleep(POLL_S)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        monitor.stop()
        if follower is not None:
            follower.close()
        run_record.output.close()
    ended_at = time.time()
    result: dict[str, Any] = {
        "mode": "attach", "detached": detached["signal"] is not None, "detach_signal": detached["signal"],
        "process_ended": detached["signal"] is None, "exit_status": None,  # not our child: unknowable
        "duration_s": round(ended_at - started, 3), "end_utc": utc_iso(ended_at), "output_bytes": output_bytes,
        "hangs": [h.to_dict() for h in monitor.hangs], "diagnosed": False, "findings": [], "summary": None,
        "notes": monitor.notes,
    }
    run_record.write_meta({"status": "finished" if result["process_ended"] else "detached", "end_utc": utc_iso(ended_at)})
    if result["process_ended"]:
        run_record.write_result(result)  # the diagnosis reads the record, result.json included
        result.update(_diagnose(record))
        result["notes"] = monitor.notes + result.get("notes", [])
        result["diagnosed"] = True
    run_record.write_result(result)
    result["record_dir"] = record
    return result


def _diagnose(record_dir: str) -> dict[str, Any]:
    """The whole record's diagnosis: output, telemetry, stack dumps, probe files."""
    from gpufix.diagnosis import diagnose_inputs
    from gpufix.rules.loader import load_ruleset

    try:
        return diagnose_inputs([record_dir], load_ruleset()).to_dict()
    except InputError as exc:
        return {"findings": [], "summary": None, "notes": [exc.message]}


def _name(command: str, pid: int) -> str:
    from gpufix.record.layout import default_name

    return default_name(command.split()) if command else f"pid{pid}"

"""The background telemetry sampler: GPUs through a `TelemetrySource`, the job's tree from /proc,
into `telemetry.jsonl` as it goes.

Why a daemon thread and not a poller process: pynvml calls NVML through ctypes, which releases
the GIL for the call, so a hung NVML call stalls only this thread, never the relay; `stop()`
joins for at most `STOP_JOIN_S` and abandons a stuck thread (gpufix leaves through `os._exit`,
which does not wait for daemon threads). A separate process would cost a Python start and a
pynvml import per run (~100 ms of CPU) plus a pipe for the watchdog's readings. What a thread
cannot survive is NVML crashing the process (a segfault in the driver library); the source
interface leaves room to move the NVML source out of process if that is ever seen.

Nothing here prints: degradations are notes (written to the file as they happen, and gathered
into one line by `summary_note()` for the end of the run).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from gpufix.record.layout import TELEMETRY as TELEMETRY_FILE
from gpufix.telemetry.inventory import GpuSample, TelemetrySource, XidEvent
from gpufix.watchdog.proctree import (ProcInfo, TreeUsage, all_procs, children, gpu_device_minors, host_memory,
                                      job_tree, read_proc)

MIN_INTERVAL_S = 0.1
PROCESS_EVERY_S = 5.0  # the process list is a dear NVML call, and so is a full /proc scan
STOP_JOIN_S = 1.0
EVENT_WAIT_SLICE_S = 0.5  # how long one Xid wait may block; bounds how late stop() is seen
STALL_AFTER_S = 10.0  # no sample finished for this long (beyond the interval): NVML hangs
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC


class JsonlWriter:
    """Appends one JSON object per line with a single `os.write` (whole lines survive a kill -9)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._fd: int | None = None
        if path is not None:
            try:
                self._fd = os.open(path, _FLAGS, 0o600)
            except OSError:
                self._fd = None

    def write(self, *objs: dict[str, Any]) -> None:
        """Append the objects, one line each, in one write (one syscall per tick, not per GPU)."""
        if self._fd is None or not objs:
            return
        import json

        try:
            os.write(self._fd, "".join(json.dumps(o, separators=(",", ":")) + "\n" for o in objs).encode())
        except (OSError, TypeError, ValueError):
            self.close()  # disk full or folder gone: telemetry is best effort

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass


class TelemetrySampler:
    """Samples `source` every `interval_s` from a daemon thread; see the module docstring.

    Readable from other threads (the hang watchdog): `latest` (GPU index -> last sample),
    `job_gpus` (GPUs where the job's tree holds memory, or else whose device files it holds open;
    None while unknown), `gpu_ok`,
    `stalled()`. The job is given by pid (and its process group, when it leads one).
    """

    def __init__(self, source_factory: Callable[[], TelemetrySource], path: str | None,
                 interval_s: float = 1.0, process_every_s: float = PROCESS_EVERY_S) -> None:
        self._factory = source_factory
        self._writer = JsonlWriter(path)
        self.interval_s = max(float(interval_s), MIN_INTERVAL_S)
        self.process_every_s = max(process_every_s, self.interval_s)
        self.latest: dict[int, GpuSample] = {}
        self.job_gpus: frozenset[int] | None = None
        self.gpu_ok = False
        self.samples = 0
        self.notes: list[str] = []
        self.xids: list[XidEvent] = []
        self._source: TelemetrySource | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._heartbeat = time.monotonic()
        self._busy_since: float | None = None  # set while inside a source call
        self._stall_noted = False
        self._pid = 0
        self._pgid: int | None = None
        self._tree: list[int] = []
        self._usage = TreeUsage()
        self._minors: dict[int, int] = {}  # device minor -> GPU index

    def start(self, pid: int, pgid: int | None = None) -> None:
        """Begin sampling the job `pid`; returns at once (nvmlInit happens in the thread)."""
        self._pid, self._pgid = pid, pgid
        self._thread = threading.Thread(target=self._guarded_run, name="gpufix-telemetry", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop and close the file; a thread stuck in NVML is abandoned after `STOP_JOIN_S`."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(STOP_JOIN_S)
            if thread.is_alive():
                self._check_stall(force=True)
                self._writer.close()
                return  # never close a source that a stuck call is still inside
        if self._source is not None:
            try:
                self._source.close()
            except Exception:  # noqa: BLE001
                pass
        problems = self._problems()
        self._writer.write({"t": round(time.time(), 3), "end": True, "samples": self.samples,
                            "unsupported": problems})
        self._writer.close()

    def stalled(self) -> bool:
        """Whether a source call has not returned for `STALL_AFTER_S` (NVML hangs)."""
        self._check_stall()
        busy = self._busy_since
        return busy is not None and time.monotonic() - busy > STALL_AFTER_S

    def summary_note(self) -> str | None:
        """All degradations as one line for stderr at the end of the run, or None."""
        return "; ".join(self.notes) if self.notes else None

    # -- the thread ------------------------------------------------------------------------

    def _guarded_run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # noqa: BLE001 - telemetry must never take gpufix down
            self._note(f"telemetry stopped after an internal error ({type(exc).__name__}: {exc})")

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        self._busy_since = time.monotonic()
        try:
            return fn(*args)
        finally:
            self._busy_since = None

    def _run(self) -> None:
        source = self._factory()
        note = self._call(source.open)
        self._source = source
        self.gpu_ok = note is None
        if note:
            self._note(note)
        else:
            identities = self._call(source.identities) or []
            self._minors = {g.minor: g.gpu for g in identities if g.minor is not None}
            if identities:
                self._writer.write({"t": round(time.time(), 3), "gpus": [g.to_dict() for g in identities]})
        next_full_scan = 0.0
        next_tick = time.monotonic()
        while not self._stop.is_set():
            now, mono = time.time(), time.monotonic()
            if mono >= next_full_scan:
                next_full_scan = mono + self.process_every_s
                self._refresh_tree()
                if self.gpu_ok:
                    self._sample_processes(now)
            if self.gpu_ok:
                self._sample_gpus(now)
            self._sample_host(now, mono)
            self.samples += 1
            self._heartbeat = time.monotonic()
            next_tick += self.interval_s
            self._wait_until(next_tick)
            next_tick = max(next_tick, time.monotonic() - self.interval_s)  # no catch-up bursts

    def _wait_until(self, deadline: float) -> None:
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if self.gpu_ok and self._source is not None:
                for event in self._call(self._source.wait_events, min(left, EVENT_WAIT_SLICE_S)):
                    self.xids.append(event)
                    self._writer.write(event.to_dict())
            else:
                self._stop.wait(left)

    def _sample_gpus(self, now: float) -> None:
        assert self._source is not None
        samples = self._call(self._source.sample, now)
        seen = set()
        for sample in samples:
            seen.add(sample.gpu)
            self.latest[sample.gpu] = sample
        self._writer.write(*(sample.to_dict() for sample in samples))
        for gone in sorted(set(self.latest) - seen):
            del self.latest[gone]
            self._note(f"GPU {gone} stopped answering NVML mid-run (lost, or fallen off the bus); its telemetry ends here")
        if not seen and not self.latest:
            self.gpu_ok = False

    def _sample_processes(self, now: float) -> None:
        assert self._source is not None
        users = self._call(self._source.processes)
        tree = set(self._tree)
        mine = [u for u in users if u.pid in tree]
        line: dict[str, Any] = {"t": round(now, 3), "processes": [u.to_dict() for u in mine],
                                "other_processes": len(users) - len(mine)}
        if mine:
            self.job_gpus = frozenset(u.gpu for u in mine)
        else:
            # None of the driver's PIDs is the job's: in a container with its own PID namespace the
            # driver names host PIDs. The GPU device files the job holds open still say which GPUs.
            opened = self._opened_gpus()
            if opened:
                self.job_gpus = opened
                line["device_files"] = sorted(opened)
        self._writer.write(line)

    def _opened_gpus(self) -> frozenset[int]:
        """GPU indices whose /dev/nvidiaN the job's tree holds open (empty when unknown)."""
        if not self._minors:
            return frozenset()
        minors = gpu_device_minors(self._tree)
        return frozenset(self._minors[m] for m in minors if m in self._minors)

    def _refresh_tree(self) -> None:
        self._tree = [p.pid for p in job_tree(self._pid, self._pgid, all_procs())]

    def _sample_host(self, now: float, mono: float) -> None:
        # Between full scans only the known pids and their children are re-read: a few files, not all of /proc
        # (the children: DataLoader workers started since the last scan hold memory that counts).
        known = set(self._tree)
        self._tree += [child for pid in list(self._tree) for child in children(pid) if child not in known]
        infos: list[ProcInfo] = [p for p in (read_proc(pid) for pid in dict.fromkeys(self._tree)) if p is not None]
        if not infos:
            return
        # the host's free memory beside the tree's: a SIGKILL with plenty left was not the out-of-memory killer's
        memory = host_memory(self._pid or "self")
        self._writer.write({"t": round(now, 3), "host": {**self._usage.measure(infos, mono), **memory}})

    # -- notes -----------------------------------------------------------------------------

    def _note(self, text: str) -> None:
        if text in self.notes:
            return
        self.notes.append(text)
        self._writer.write({"t": round(time.time(), 3), "note": text})

    def _check_stall(self, force: bool = False) -> None:
        busy = self._busy_since
        if busy is None or self._stall_noted:
            return
        waited = time.monotonic() - busy
        if waited > STALL_AFTER_S or force:
            self._stall_noted = True
        if waited > STALL_AFTER_S:
            self._note(f"no GPU telemetry: an NVML call has not returned for {waited:.0f} s (driver hung?); sampling abandoned")
        elif force:
            self._note(f"GPU telemetry cut short: NVML was still answering a call ({waited:.1f} s) when the job ended")

    def _problems(self) -> list[str]:
        if self._source is None:
            return []
        try:
            return list(self._source.problems())
        except Exception:  # noqa: BLE001
            return []

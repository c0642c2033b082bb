"""What `gpufix run` and `gpufix attach` plug in: telemetry and the hang watchdog together,
behind the supervisor's `Sampler` protocol (`start(job)` returns at once, `stop()` promptly,
neither raises).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from gpufix.telemetry.sampler import TELEMETRY_FILE, TelemetrySampler
from gpufix.watchdog.watchdog import HangReport, HangWatchdog, OutputActivity, file_activity

STACKS_DIR = "stacks"
OUTPUT_LOG = "output.log"  # gpufix.record.layout.OUTPUT_LOG, not imported: keep this module light
# A machine with no NVIDIA stack at all is not news on every run: such notes stay in the record.
_QUIET_PREFIXES = ("no GPU telemetry: nvidia-ml-py", "no GPU telemetry: NVML did not initialise")


def _stderr_note(text: str) -> None:
    try:
        os.write(2, f"gpufix: note: {text}\n".encode(errors="replace"))
    except OSError:
        pass


def nvml_source() -> Any:
    from gpufix.telemetry.nvml import NvmlTelemetrySource

    return NvmlTelemetrySource()


class JobMonitor:
    """Telemetry sampler plus hang watchdog for one job. See `make_run_sampler`."""

    def __init__(self, interval_s: float, hang_timeout_s: float, on_hang: str, record_dir: str | None,
                 warn: Callable[[str], None] | None = None, source_factory: Callable[[], Any] = nvml_source,
                 activity_file: str | None = None, note: Callable[[str], None] = _stderr_note,
                 report: Callable[[HangReport], None] | None = None) -> None:
        self.interval_s = interval_s
        self.hang_timeout_s = hang_timeout_s
        self.on_hang = on_hang
        self.record_dir = record_dir
        self.activity_file = activity_file
        self.sampler: TelemetrySampler | None = None
        self.watchdog: HangWatchdog | None = None
        self._warn = warn or (lambda _m: None)
        self._factory = source_factory
        self._note = note
        self._report = report
        self._notes: list[str] = []

    def start(self, job: Any) -> None:
        """`job` is a `gpufix.supervise.RunningJob` (pid, pgid, started_unix, record_dir)."""
        record = self.record_dir or getattr(job, "record_dir", None)
        pgid = getattr(job, "pgid", None)
        if self.interval_s > 0:
            path = os.path.join(record, TELEMETRY_FILE) if record else None
            self.sampler = TelemetrySampler(self._factory, path, self.interval_s)
            self.sampler.start(job.pid, pgid)
        if self.hang_timeout_s > 0:
            watched = self.activity_file or (os.path.join(record, OUTPUT_LOG) if record else None)
            if watched is None:
                self._notes.append("hang watchdog off: without a run record gpufix cannot see the job's output")
                return
            stacks = os.path.join(record, STACKS_DIR) if record else os.path.join(os.path.dirname(watched), STACKS_DIR)
            kwargs = {"report": self._report} if self._report else {}
            probe = os.path.join(record, "probe") if record and os.path.isdir(os.path.join(record, "probe")) else None
            # the record's own output: lines printed again do not count as movement (a followed log of attach: any growth)
            activity = file_activity(watched) if self.activity_file else OutputActivity(watched, probe)
            self.watchdog = HangWatchdog(job.pid, pgid, self.hang_timeout_s, stacks, activity,
                                         self.sampler, self.on_hang, probe_dir=probe, **kwargs)
            self.watchdog.start()

    def stop(self) -> None:
        """Stop both; print at most one `gpufix: note:` line about degraded telemetry."""
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.sampler is not None:
            self.sampler.stop()
        note = self.end_note()
        if note:
            self._note(note)

    @property
    def notes(self) -> list[str]:
        """Every degradation (for result.json `notes`)."""
        return self._notes + (list(self.sampler.notes) if self.sampler else [])

    @property
    def hangs(self) -> list[HangReport]:
        """Hangs the watchdog saw (their findings are `Finding.to_dict()` dicts)."""
        return list(self.watchdog.hangs) if self.watchdog else []

    def end_note(self) -> str | None:
        """The one line for stderr at the end, or None (no NVIDIA stack at all is not news)."""
        loud = [n for n in self.notes if not n.startswith(_QUIET_PREFIXES)]
        return "; ".join(loud) if loud else None


def make_run_sampler(interval_s: float, hang_timeout_s: float, on_hang: str, record_dir: str | None,
                     warn: Callable[[str], None] | None = None) -> JobMonitor:
    """The `Sampler` for `gpufix run`: NVML telemetry every `interval_s` (0 = off, floor 0.1 s)
    into `record_dir/telemetry.jsonl`, and a hang watchdog (`hang_timeout_s`, 0 = off) watching
    `record_dir/output.log` that dumps stacks into `record_dir/stacks/` and, with
    `on_hang="kill"`, ends the job. Pass the record's path even when it is temporary (the watchdog
    needs `output.log`); None turns the watchdog off. Construction is cheap and imports no NVML.
    """
    return JobMonitor(interval_s, hang_timeout_s, on_hang, record_dir, warn)

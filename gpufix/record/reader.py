"""Reading a run record back: one `Record` object over the folder (layout: docs/run-record.md).

    record = Record.open("gpufix-runs/20250114T093012Z-train-3f9a1c")
    record.meta, record.result          # dicts; {} when missing or unreadable
    record.stream("stderr")             # the bytes one stream wrote (output.log + output.idx)
    record.telemetry.job_lines          # telemetry.jsonl, other users' GPUs left out once
    record.probe_facts                  # what the in-job probe saw (gpufix.probe.read), read on first use
    record.stack_dumps                  # stacks/*.txt
    record.flight_report                # flight/report.txt: the ranks' flight-recorder dumps compared
    record.rank_errors                  # ranks/error-rank<R>.txt: torchelastic error files, as text
    record.experiment_results           # what `gpufix confirm` stored

Every command reads a record through this module and `is_record` is the one test of what a
record is; file names are spelled in gpufix.record.layout. Cheap to import (`gpufix explain`
asks `is_record` of every path): parsers are imported when a part is first read.
"""

from __future__ import annotations

import os

from gpufix.errors import InputError
from gpufix.record.layout import (EXPERIMENT_RESULTS, FLIGHT_REPORT, META, RANKS, OUTPUT_INDEX, OUTPUT_LOG, PROBE, RESULT, STACKS, TELEMETRY,
                                  is_record_dir, iter_chunks, read_stream)

TYPE_CHECKING = False  # typing costs start-up time; annotations are strings (PEP 563)
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

__all__ = ["NotARecordError", "Record", "RecordTelemetry", "is_record", "json_object", "line_kind"]

# One test, one name: a folder holding meta.json and output.log (docs/run-record.md).
is_record = is_record_dir


class NotARecordError(InputError):
    """A folder that is not a run record was given where one was expected."""


def json_object(path: str) -> dict[str, Any]:
    """A JSON file's object, or {} when it is missing, unreadable or not an object. Only a regular
    file is read: a FIFO or device put in a record must not block or never end a command."""
    import json

    from gpufix.safeio import read_regular

    try:
        data = json.loads(read_regular(path))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class Record:
    """A run record folder. Each part is read when first asked for, then kept: a `Record` is a
    view of the folder at that moment (open a new one to see a running job's later writes)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._cache: dict[str, Any] = {}

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Record:
        """The record at `path`; raises NotARecordError when the folder is not one."""
        if not is_record(path):
            missing = META if not os.path.isfile(os.path.join(path, META)) else OUTPUT_LOG
            raise NotARecordError(f"{os.fspath(path)} is not a run record (no {missing})",
                                  hint="pass a folder made by `gpufix run` (it holds meta.json and output.log)")
        return cls(path)

    def file(self, name: str) -> str:
        """The path of one of the record's files or folders (a name from gpufix.record.layout)."""
        return os.path.join(self.path, name)

    def _once(self, key: str, read: Any) -> Any:
        if key not in self._cache:
            self._cache[key] = read()
        return self._cache[key]

    # --- meta.json, result.json ---------------------------------------------------------------

    @property
    def meta(self) -> dict[str, Any]:
        """meta.json (command, host, environment, ...); {} when missing or unreadable."""
        return self._once(META, lambda: json_object(self.file(META)))

    @property
    def result(self) -> dict[str, Any]:
        """result.json (exit status, duration, findings, ...); {} before the run ended."""
        return self._once(RESULT, lambda: json_object(self.file(RESULT)))

    # --- output -------------------------------------------------------------------------------

    @property
    def output_log(self) -> str:
        return self.file(OUTPUT_LOG)

    @property
    def output_index(self) -> str:
        return self.file(OUTPUT_INDEX)

    def stream(self, name: str) -> bytes:
        """The bytes one stream (`stdout`, `stderr` or `tty`) wrote (gpufix.record.layout.read_stream)."""
        return read_stream(self.path, name)

    def chunks(self) -> Iterator[Any]:
        """The entries of output.idx in order (gpufix.record.layout.iter_chunks)."""
        return iter_chunks(self.path)

    # --- measurements -------------------------------------------------------------------------

    @property
    def telemetry(self) -> RecordTelemetry:
        """telemetry.jsonl, read once; empty when there is none. Raises OSError when it cannot be read."""
        return self._once(TELEMETRY, lambda: RecordTelemetry.read(self.file(TELEMETRY)))

    @property
    def probe_dir(self) -> str:
        """The in-job probe's folder (docs/probe.md); parse it with gpufix.probe.read."""
        return self.file(PROBE)

    @property
    def has_probe(self) -> bool:
        return os.path.isdir(self.probe_dir)

    @property
    def probe_facts(self) -> dict[str, Any]:
        """What the probe saw of the job (gpufix.probe.read.read_probe_facts), read on first use."""
        from gpufix.probe.read import read_probe_facts

        return self._once(PROBE, lambda: read_probe_facts(self.probe_dir))

    @property
    def stack_dumps(self) -> list[str]:
        """The stack dump files (stacks/*.txt) by name; regular files only: a FIFO or device put in
        a record must not block or never end a diagnosis."""
        return self._text_files(STACKS)

    @property
    def rank_errors(self) -> list[str]:
        """The tracebacks of the ranks' torchelastic error files that gpufix kept (ranks/*.txt)."""
        return self._text_files(RANKS)

    @property
    def fault_logs(self) -> list[str]:
        """What faulthandler wrote in the job's processes when one crashed (probe/faults-<pid>.log: the Python stacks
        of a segmentation fault, abort or bus error), non-empty regular files only."""
        return [path for path in self._text_files(PROBE, prefix="faults-", suffix=".log") if os.path.getsize(path) > 0]

    def _text_files(self, folder_name: str, prefix: str = "", suffix: str = ".txt") -> list[str]:
        folder = self.file(folder_name)
        try:
            names = sorted(n for n in os.listdir(folder) if n.startswith(prefix) and n.endswith(suffix))
        except OSError:
            return []
        return [path for path in (os.path.join(folder, n) for n in names) if os.path.isfile(path)]

    @property
    def flight_report(self) -> str | None:
        """gpufix's reading of the ranks' flight-recorder dumps (`# gpufix-flight:` lines), when written;
        a regular file only, as for the stack dumps."""
        path = self.file(FLIGHT_REPORT)
        return path if os.path.isfile(path) else None

    @property
    def experiment_results(self) -> dict[str, Any] | None:
        """The last `gpufix confirm` report stored in the record, or None."""
        return json_object(self.file(EXPERIMENT_RESULTS)) or None


def line_kind(obj: dict[str, Any]) -> str:
    """What one telemetry.jsonl line is: `processes`, `xid`, `gpus` (the GPUs' identities),
    `sample` (one GPU's values), `host`, `note`, `end`, or `other` (docs/run-record.md)."""
    if "processes" in obj:
        return "processes"
    if obj.get("event") == "xid":
        return "xid" if isinstance(obj.get("xid"), int) else "other"
    if isinstance(obj.get("gpus"), list):
        return "gpus"
    if "gpu" in obj and "event" not in obj:
        return "sample"
    if isinstance(obj.get("host"), dict):
        return "host"
    if isinstance(obj.get("note"), str):
        return "note"
    return "end" if obj.get("end") else "other"


class RecordTelemetry:
    """A record's telemetry.jsonl: its readable lines in file order and the GPUs that were the
    job's. `job_lines` leaves the other GPUs' samples and Xids out - another user's idle,
    throttled or faulting GPU on a shared node is not this job's problem - and is where every
    diagnosis reads telemetry; `lines` keeps them (for `gpufix status`, which shows them)."""

    def __init__(self, path: str, lines: list[tuple[int, float, dict[str, Any]]], job_gpus: frozenset[int] | None) -> None:
        self.path = path
        self.lines = lines  # (line number, t, object) of every readable line, in file order
        self.job_gpus = job_gpus  # None: the record does not say which GPUs were the job's
        self._job_lines: list[tuple[int, float, dict[str, Any], str]] | None = None

    @classmethod
    def read(cls, path: str) -> RecordTelemetry:
        """Parse a telemetry.jsonl (torn or foreign lines skipped); empty when it is missing or not
        a regular file."""
        if not os.path.isfile(path):
            return cls(path, [], None)
        from gpufix.telemetry.replay import iter_lines

        seen = JobGpus()
        lines = []
        for line in iter_lines(path):
            if "processes" in line[2]:
                seen.add(line[2])
            lines.append(line)
        return cls(path, lines, seen.result())

    def is_jobs(self, kind: str, obj: dict[str, Any]) -> bool:
        """Whether a line belongs to the job: all do but other GPUs' samples and Xids (an Xid that
        names no GPU may be the job's)."""
        if self.job_gpus is None or kind not in ("sample", "xid"):
            return True
        gpu = obj.get("gpu")
        return gpu in self.job_gpus if kind == "sample" or isinstance(gpu, int) else True

    @property
    def job_lines(self) -> list[tuple[int, float, dict[str, Any], str]]:
        """(line number, t, object, kind) of each line that belongs to the job, in file order."""
        if self._job_lines is None:
            kinds = ((number, t, obj, line_kind(obj)) for number, t, obj in self.lines)
            self._job_lines = [line for line in kinds if self.is_jobs(line[3], line[2])]
        return self._job_lines

    def gpu_lines(self) -> list[dict[str, Any]]:
        """The job's GPU samples and Xid events (objects naming a GPU index), in file order."""
        return [obj for _n, _t, obj, kind in self.job_lines if kind in ("sample", "xid") and isinstance(obj.get("gpu"), int)]


class JobGpus:
    """The GPUs the record's `processes` lines say the job used. By PID where the driver named the
    job's processes; only where it never did (a container's PID namespace) by the device files the
    job held open, which name every GPU CUDA let it see (all of them, early in a run, before the
    driver lists the process)."""

    def __init__(self) -> None:
        self.by_pid: set[int] = set()
        self.by_files: set[int] = set()

    def add(self, obj: dict[str, Any]) -> None:
        procs, files = obj.get("processes"), obj.get("device_files")
        if isinstance(procs, list):
            self.by_pid.update(p["gpu"] for p in procs if isinstance(p, dict) and isinstance(p.get("gpu"), int))
        if isinstance(files, list):
            self.by_files.update(g for g in files if isinstance(g, int) and not isinstance(g, bool))

    def result(self) -> frozenset[int] | None:
        """None when the record does not say."""
        return frozenset(self.by_pid or self.by_files) or None

"""One run's post-mortem: merge its files' evidence, diagnose, and say who failed first and when.

The causal first failure is the rank (or node and GPU) in the root-cause finding's evidence: the
rank that ran out of memory, not the ranks whose collectives then timed out, and not torchrun's
"Root Cause (first observed failure)" rank, which is only the earliest exit it saw.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from gpufix.diagnosis import diagnose
from gpufix.evidence import Evidence
from gpufix.findings import Finding
from gpufix.record.meta import supervisor_alive
from gpufix.postmortem.discover import RunGroup
from gpufix.postmortem.runinfo import environment, line_context, read_record, record_time_at
from gpufix.safeio import not_regular
from gpufix.postmortem.telemetry import read_samples, summarise
from gpufix.postmortem.times import file_mtime, iso, parse_iso, parse_line_time
from gpufix.record.layout import FLIGHT, META, OUTPUT_INDEX, OUTPUT_LOG, PROBE, RANKS, RESULT, STACKS, TELEMETRY
from gpufix.rules.model import RuleSet

FAILING_SEVERITIES = ("error", "critical")
# A run's status. `succeeded_with_findings`: the job ended well (exit 0, or a success marker) but
# gpufix found a problem in it (a NaN loss in its output, a starving DataLoader measured by the
# probe): its root cause and findings are reported like a failed run's, but it is not a failure
# (--fail-on) and not a "good" run (across.py).
SUCCEEDED_WITH_FINDINGS = "succeeded_with_findings"
STATUSES = ("failed", "succeeded", SUCCEEDED_WITH_FINDINGS, "running", "unknown")


def status_label(status: str) -> str:
    """A status for people: `succeeded_with_findings` -> `succeeded with findings`."""
    return status.replace("_", " ")


_RANK_TEXT = re.compile(r"\b[Rr]ank[ :=]?(\d{1,5})\b")
_XID_GPU = re.compile(r"NVRM: Xid \((PCI:[0-9a-fA-F:.]+)\)")
_SYSLOG_HOST = re.compile(r"^\w{3} +\d+ \d\d:\d\d:\d\d (\S+) kernel:")


@dataclass(frozen=True)
class FileResult:
    """One scanned file of a run: its evidence (None when skipped) and facts."""

    path: str
    role: str
    rank: int | None
    evidence: Evidence | None
    facts: dict[str, Any]


@dataclass(frozen=True)
class RunReport:
    """Everything the post-mortem says about one run; `to_dict()` is the JSON schema."""

    id: str
    kind: str
    anchor: str
    paths: list[str]
    status: str
    started: datetime | None
    ended: datetime | None
    exit_status: int | None
    failed_at: datetime | None
    failed_at_basis: str | None
    findings: list[Finding]
    root_cause: Finding | None
    first_failing: dict[str, Any] | None
    affected_ranks: list[int]
    torchrun_reported_rank: int | None
    telemetry: dict[str, Any] | None
    environment: dict[str, Any]
    record_dir: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def first_failing_rank(self) -> int | None:
        ranks = (self.first_failing or {}).get("ranks") or []
        return min(ranks) if ranks else None

    def to_dict(self) -> dict[str, Any]:
        duration = (self.ended - self.started).total_seconds() if self.started and self.ended else None
        return {
            "id": self.id, "kind": self.kind, "paths": list(self.paths), "status": self.status,
            "started": iso(self.started), "ended": iso(self.ended), "duration_s": duration,
            "exit_status": self.exit_status,
            "failed_at": iso(self.failed_at), "failed_at_basis": self.failed_at_basis,
            "root_cause": self.root_cause.to_dict() if self.root_cause else None,
            "first_failing_rank": self.first_failing_rank,
            "first_failing": self.first_failing,
            "affected_ranks": list(self.affected_ranks),
            "torchrun_reported_rank": self.torchrun_reported_rank,
            "findings": [f.to_dict() for f in self.findings],
            "telemetry": self.telemetry,
            "environment": self.environment,
            "notes": list(self.notes),
        }


_RECORD_FILES = (META, RESULT, OUTPUT_INDEX, TELEMETRY)
_RECORD_FOLDERS = (STACKS, PROBE, FLIGHT, RANKS)


def record_hazards(record_dir: str) -> list[str]:
    """Notes for the files of a record that gpufix would read but that are not regular files (a
    FIFO would block the read for ever, a link to /dev/zero never end): the record's own files
    and those in `stacks/` and `probe/`. Stack dumps and measurements are read (gpufix.diagnosis)
    only when there is none."""
    paths = [os.path.join(record_dir, name) for name in _RECORD_FILES]
    for sub in _RECORD_FOLDERS:
        try:
            with os.scandir(os.path.join(record_dir, sub)) as entries:
                paths += sorted(e.path for e in entries if not e.is_dir(follow_symlinks=False))
        except OSError:
            continue
    notes = []
    for path in paths:
        if os.path.lexists(path):
            why = not_regular(path)
            if why is not None:
                notes.append(f"{path}: {why}")
    return notes


def merged_evidence(files: list[FileResult]) -> Evidence:
    """The run's evidence: every scanned file, ranks from per-rank file paths filled in."""
    evidence = Evidence()
    for f in files:
        if f.evidence is not None:
            evidence.merge(f.evidence.with_rank(f.rank) if f.rank is not None else f.evidence)
    return evidence


def analyze_run(group: RunGroup, files: list[FileResult], ruleset: RuleSet, window_s: float = 300.0) -> RunReport:
    """Diagnose one run's files together and work out its status, culprit and timing."""
    notes = [f"{f.path}: binary data (a flight-recorder dump?) not scanned" for f in files if f.facts.get("binary")]
    evidence = merged_evidence(files)
    hazards = record_hazards(group.record_dir) if group.record_dir else []
    notes += hazards
    if group.record_dir and hazards:
        notes.append(f"{group.record_dir}: its stack dumps and measurements were not read (a file in it is not a regular file)")
    elif group.record_dir:
        # What `gpufix run` diagnosed the record from: its stack dumps and measurements too.
        from gpufix.diagnosis.record import add_record_evidence
        from gpufix.logscan import LogScanner

        add_record_evidence(evidence, group.record_dir, LogScanner.for_rules(ruleset))
        notes += evidence.notes
    findings = diagnose(evidence, ruleset).findings
    record = read_record(group.record_dir) if group.record_dir else {}
    status, exit_status = _status(group, files, findings, record)
    started, ended = time_range(files, record)
    # every status but a plain success has its root cause (succeeded_with_findings: failed_at is its problem's moment)
    root = next((f for f in findings if f.consequence_of is None), None) if status != "succeeded" else None
    culprit = _culprit(root, files) if root else None
    culprit_ranks = set((culprit or {}).get("ranks") or [])
    affected = sorted({r for f in findings if f.consequence_of for r in _ranks(f)} - culprit_ranks)
    failed_at, basis, record_moment = _failed_at(root, files, group, record, started) if root else (None, None, None)
    samples = read_samples(group.record_dir, started) if group.record_dir else []
    window_end = record_moment or failed_at or ended
    telemetry = summarise(samples, window_end, window_s, started) if samples else None
    torchrun_rank = next((f.facts["torchrun_rank"] for f in files if f.facts.get("torchrun_rank") is not None), None)
    return RunReport(
        id=group.id, kind=group.kind, anchor=group.anchor, paths=[f.path for f in files], status=status,
        started=started, ended=ended, exit_status=exit_status, failed_at=failed_at, failed_at_basis=basis,
        findings=findings, root_cause=root, first_failing=culprit, affected_ranks=affected,
        torchrun_reported_rank=torchrun_rank, telemetry=telemetry,
        environment=environment(record, files), record_dir=group.record_dir, notes=notes,
    )


def _status(group: RunGroup, files: list[FileResult], findings: list[Finding],
            record: dict[str, Any]) -> tuple[str, int | None]:
    failing = any(f.severity in FAILING_SEVERITIES and f.consequence_of is None for f in findings)
    result, meta = record.get("result"), record.get("meta")
    if result is not None:
        code = result.get("exit_status")
        code = int(code) if isinstance(code, int) else None
        return (_succeeded(findings) if code == 0 else "failed"), code
    if meta is not None and meta.get("status") == "running":
        # a record whose gpufix is gone (SIGKILL, a crashed node) never finishes: its job was
        # killed with it (the death signal), so the run failed, whatever it printed
        return ("failed" if failing or supervisor_alive(meta) is False else "running"), None
    codes = [f.facts["exit_status"] for f in files if isinstance(f.facts.get("exit_status"), int)]
    bad = next((c for c in codes if c != 0), None)
    if bad is not None or any(f.role == "error_file" for f in files):
        return "failed", bad
    if failing or any(f.facts.get("failed_marker") for f in files):
        return "failed", None
    if codes or any(f.facts.get("success_marker") for f in files):
        return _succeeded(findings), 0 if codes else None
    return "unknown", None


def _succeeded(findings: list[Finding]) -> str:
    """A run that ended well: `succeeded`, or `succeeded_with_findings` when gpufix found anything."""
    return SUCCEEDED_WITH_FINDINGS if findings else "succeeded"


def time_range(files: list[FileResult], record: dict[str, Any]) -> tuple[datetime | None, datetime | None]:
    meta, result = record.get("meta") or {}, record.get("result") or {}
    started = parse_iso(meta.get("start_utc"))
    ended = parse_iso(result.get("end_utc")) or parse_iso(meta.get("end_utc"))
    if started is None:
        firsts = [parse_iso(f.facts.get("first_time")) for f in files if f.role != "kernel"]
        started = min((t for t in firsts if t), default=None)
    if ended is None:
        lasts = [parse_iso(f.facts.get("last_time")) for f in files if f.role != "kernel"]
        ended = max((t for t in lasts if t), default=None)
    if started is None:
        mtimes = [file_mtime(f.path) for f in files]
        started = min((t for t in mtimes if t), default=None)
    return started, ended


def _ranks(finding: Finding) -> list[int]:
    """A finding's ranks: from prefixes and per-rank files, else `Rank N` in its evidence text."""
    if finding.ranks:
        return list(finding.ranks)
    return sorted({int(m.group(1)) for ref in finding.all_refs for m in _RANK_TEXT.finditer(ref.text)})


def _culprit(root: Finding, files: list[FileResult]) -> dict[str, Any]:
    if root.category == "hardware_xid":
        node = gpu = None
        for ref in root.all_refs:
            host, pci = _SYSLOG_HOST.search(ref.text), _XID_GPU.search(ref.text)
            node = node or (host.group(1) if host else None)
            gpu = gpu or (pci.group(1) if pci else None)
        if node is None:
            kernel = [f for f in files if f.role == "kernel" and (f.facts.get("env") or {}).get("host")]
            node = kernel[0].facts["env"]["host"] if kernel else None
        gpu = gpu or root.fields.get("gpu") or root.fields.get("pci")
        return {"ranks": list(root.ranks), "node": node, "gpu": gpu, "basis": "kernel log (NVRM Xid)"}
    if root.ranks:
        by_file = any(f.rank is not None for f in files)
        return {"ranks": list(root.ranks), "node": None, "gpu": None,
                "basis": "per-rank log file" if by_file else "rank prefix"}
    ranks = _ranks(root)
    if ranks:
        return {"ranks": ranks, "node": None, "gpu": None, "basis": "rank named in the evidence"}
    return {"ranks": [], "node": None, "gpu": None, "basis": "no rank in the evidence"}


def _failed_at(root: Finding, files: list[FileResult], group: RunGroup, record: dict[str, Any],
               started: datetime | None) -> tuple[datetime | None, str | None, datetime | None]:
    """(moment, basis, record-index moment) of the root cause's first evidence line."""
    ref = root.evidence[0] if root.evidence else None
    if ref is None:
        return None, None, None
    mtime = file_mtime(ref.source)
    year = started.year if started else (mtime.year if mtime else None)
    record_moment = None
    offset, before, after = line_context(ref.source, ref.line)
    if group.record_dir and offset is not None and os.path.realpath(ref.source) == os.path.realpath(
            os.path.join(group.record_dir, OUTPUT_LOG)):  # the index maps output.log offsets only
        record_moment = record_time_at(group.record_dir, offset, record)
    moment, basis = parse_line_time(ref.text, year), "log timestamp"
    for line in ([] if moment else reversed(before)):
        moment, basis = parse_line_time(line, year), "nearest earlier log timestamp"
        if moment:
            break
    for line in ([] if moment else after):
        moment, basis = parse_line_time(line, year), "nearest later log timestamp"
        if moment:
            break
    if moment is not None:
        return moment, basis, record_moment
    if record_moment is not None:
        return record_moment, "record index", record_moment
    return (mtime, "file mtime", None) if mtime else (None, None, None)


def within(moment: datetime | None, start: datetime | None, end: datetime | None, slack_s: float) -> bool:
    """Whether `moment` falls in [start - slack, end + slack] (either end open when None)."""
    if moment is None:
        return False
    slack = timedelta(seconds=slack_s)
    return (start is None or moment >= start - slack) and (end is None or moment <= end + slack)

"""Reusing a run's report from the index: the key that says its inputs are unchanged, and the
report stored as JSON.

A run's report depends on its files (their bytes: the key takes their stat, as the file rows do),
its record's other files (meta.json, result.json, output.idx, telemetry.jsonl, stacks/, probe/:
their stat too), the whole rule pack (patterns, messages, fixes, guards, priorities: a hash of
every rule), the options (`window_s`), the run's id and grouping, and gpufix's version. `run_key`
hashes all of them; a run it cannot vouch for gets no key and is diagnosed every time: a file
that could not be read, a record still "running" (whether its gpufix is alive changes with no
file changing).

The stored report is the RunReport with its findings whole, less `Finding.all_refs` (every
matched line, unredacted: never stored). A report read back carries the shown, redacted
evidence there; what needs every line (the culprit rank, the affected ranks) was worked out
before the report was stored.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import zlib
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gpufix import __version__
from gpufix.evidence import LineRef
from gpufix.findings import Finding, RenderedFix
from gpufix.postmortem.analyze import RunReport
from gpufix.record.layout import FLIGHT, PROBE, RANKS, STACKS

if TYPE_CHECKING:
    from gpufix.postmortem.discover import RunGroup
    from gpufix.postmortem.index import Stamp
    from gpufix.rules.model import RuleSet

# Bump when what analyze_run makes of the same inputs changes, or the stored form does.
REPORT_FORMAT = 1
_RECORD_FOLDERS = (STACKS, PROBE, FLIGHT, RANKS)


def ruleset_fingerprint(ruleset: RuleSet) -> str:
    """A hash of everything a diagnosis reads from the rule pack (not examples, false positives or
    where a rule was loaded from). The same for a pack loaded from the lean cache or in full."""
    digest = hashlib.sha256(f"{__version__}/{REPORT_FORMAT}".encode())
    for rule in ruleset.by_code.values():
        lean = rule.with_details()._replace(examples=None, falsepositives=(), source="", line=0)
        digest.update(repr(lean).encode() + b"\n")
    return digest.hexdigest()


def _entries(folder: str) -> list[list[Any]]:
    """Name, kind and stat of each entry of a folder (not followed into subfolders); [] if none."""
    out: list[list[Any]] = []
    try:
        with os.scandir(folder) as listing:
            for entry in listing:
                try:
                    st = entry.stat()
                except OSError:
                    out.append([entry.name, None])
                    continue
                out.append([entry.name, stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev])
    except OSError as exc:
        return [["", exc.errno]]
    return sorted(out, key=lambda e: e[0])


def record_stamp(record_dir: str) -> list[Any]:
    """The stat of a record's files, and of those in its stacks/ and probe/ folders."""
    return [_entries(record_dir), *(_entries(os.path.join(record_dir, sub)) for sub in _RECORD_FOLDERS)]


def run_key(group: RunGroup, stamps: dict[str, Stamp | None], fingerprint: str, window_s: float) -> str | None:
    """The key of a run's report, or None when it must be diagnosed afresh (see the module doc).

    `stamps`: each file's stat as compared with the index (None: the file's result is not stored).
    """
    files = []
    for log in group.files:
        stamp = stamps.get(log.path)
        if stamp is None:
            return None
        files.append([log.path, log.role, log.rank, *stamp])
    parts: list[Any] = [fingerprint, window_s, group.id, group.kind, group.anchor, group.record_dir, files]
    if group.record_dir:
        parts.append(record_stamp(group.record_dir))
    return hashlib.sha256(json.dumps(parts, separators=(",", ":")).encode()).hexdigest()


def _when(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def _moment(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def _ref(ref: LineRef) -> list[Any]:
    return [ref.source, ref.line, ref.text, ref.rank]


def _finding(f: Finding) -> list[Any]:
    return [f.code, f.name, f.title, f.category, f.severity, f.confidence, f.message, f.explanation,
            f.fields, [_ref(r) for r in f.evidence], f.evidence_count, [list(x) for x in f.fixes],
            f.experiments, list(f.ranks), f.consequence_of, list(f.references), f.priority, f.is_gpu]


def _finding_back(data: list[Any]) -> Finding:
    (code, name, title, category, severity, confidence, message, explanation, fields, evidence, count, fixes,
     experiments, ranks, consequence_of, references, priority, is_gpu) = data
    refs = [LineRef(*r) for r in evidence]
    return Finding(code, name, title, category, severity, confidence, message, explanation, dict(fields), refs,
                   count, [RenderedFix(*x) for x in fixes], list(experiments), list(ranks), consequence_of,
                   list(references), priority, is_gpu, list(refs))


def report_to_blob(run: RunReport) -> bytes:
    root = next((i for i, f in enumerate(run.findings) if f is run.root_cause), None)
    data = {
        "id": run.id, "kind": run.kind, "anchor": run.anchor, "paths": run.paths, "status": run.status,
        "started": _when(run.started), "ended": _when(run.ended), "exit_status": run.exit_status,
        "failed_at": _when(run.failed_at), "failed_at_basis": run.failed_at_basis,
        "findings": [_finding(f) for f in run.findings], "root": root,
        "root_cause": _finding(run.root_cause) if run.root_cause is not None and root is None else None,
        "first_failing": run.first_failing, "affected_ranks": run.affected_ranks,
        "torchrun_reported_rank": run.torchrun_reported_rank, "telemetry": run.telemetry,
        "environment": run.environment, "record_dir": run.record_dir, "notes": run.notes,
    }
    return zlib.compress(json.dumps(data, separators=(",", ":")).encode(), 3)


def report_from_blob(blob: bytes) -> RunReport | None:
    """The stored report, or None when it cannot be read back (then the run is diagnosed again)."""
    try:
        data = json.loads(zlib.decompress(blob))
        findings = [_finding_back(f) for f in data["findings"]]
        root = data["root"]
        root_cause = findings[root] if root is not None else (
            _finding_back(data["root_cause"]) if data["root_cause"] is not None else None)
        return RunReport(
            id=data["id"], kind=data["kind"], anchor=data["anchor"], paths=list(data["paths"]), status=data["status"],
            started=_moment(data["started"]), ended=_moment(data["ended"]), exit_status=data["exit_status"],
            failed_at=_moment(data["failed_at"]), failed_at_basis=data["failed_at_basis"], findings=findings,
            root_cause=root_cause, first_failing=data["first_failing"], affected_ranks=list(data["affected_ranks"]),
            torchrun_reported_rank=data["torchrun_reported_rank"], telemetry=data["telemetry"],
            environment=data["environment"], record_dir=data["record_dir"], notes=list(data["notes"]),
        )
    except (ValueError, KeyError, TypeError, IndexError, zlib.error):
        return None

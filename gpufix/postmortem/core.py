"""`gpufix postmortem`: discover logs, scan what the index does not already hold, group files into
runs, diagnose each run, and compare runs across nights.

    postmortem(paths, ruleset) -> Postmortem(runs ordered by start, summary, notes, samples)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from gpufix.errors import InputError
from gpufix.postmortem.across import summarise_runs
from gpufix.postmortem.analyze import FileResult, RunReport, analyze_run, time_range, within
from gpufix.postmortem.discover import LogFile, RunGroup, discover
from gpufix.postmortem.facts import file_facts
from gpufix.postmortem.index import INDEX_NAME, Index, rules_version
from gpufix.postmortem.runinfo import read_record
from gpufix.safeio import not_regular
from gpufix.postmortem.scan import ScanFn, scan_many
from gpufix.postmortem.telemetry import read_samples
from gpufix.postmortem.times import iso, parse_iso
from gpufix.rules.model import RuleSet

KERNEL_SLACK_S = 600.0


@dataclass(frozen=True)
class Postmortem:
    """The result: runs ordered by start time, the cross-run summary, notes, and per-run telemetry."""

    runs: list[RunReport]
    summary: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    samples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    scanned: int = 0  # files scanned this time (not served by the index)

    def to_dict(self) -> dict[str, Any]:
        """The stable JSON document (docs/postmortem.md)."""
        return {"format": 1, "runs": [r.to_dict() for r in self.runs], "summary": self.summary,
                "notes": list(self.notes)}


def default_index_path(paths: list[str]) -> str:
    """`.gpufix-index.sqlite` in the first PATH (a folder) or next to it (a file)."""
    first = paths[0]
    folder = first if os.path.isdir(first) else os.path.dirname(os.path.abspath(first))
    return os.path.join(folder, INDEX_NAME)


def _results(groups: list[RunGroup], ruleset: RuleSet, index: Index, scan_fn: ScanFn | None,
             jobs: int | None, parallel_min_bytes: int | None) -> tuple[dict[str, FileResult], int, list[str]]:
    """Every file's evidence and facts, from the index when unchanged, else scanned now."""
    notes: list[str] = []
    results: dict[str, FileResult] = {}
    todo: list[tuple[LogFile, str, int, int, dict[str, Any]]] = []
    for log in (f for g in groups for f in g.files):
        abspath = os.path.abspath(log.path)
        why = not_regular(abspath)  # only regular files are read: a FIFO or device is a note, never a hang
        if why is not None:
            notes.append(f"{log.path}: {why}")
            results[log.path] = FileResult(log.path, log.role, log.rank, None, {"error": why})
            continue
        try:
            st = os.stat(abspath)
        except OSError as exc:
            notes.append(f"{log.path}: cannot read ({exc.strerror})")
            results[log.path] = FileResult(log.path, log.role, log.rank, None, {"error": exc.strerror})
            continue
        cached = index.lookup(abspath, st.st_size, st.st_mtime_ns, log.path)
        if cached is not None:
            results[log.path] = FileResult(log.path, log.role, log.rank, cached[0], cached[1])
            continue
        facts = file_facts(abspath)
        if facts.get("error"):
            notes.append(f"{log.path}: {facts['error']}; not scanned")
        if facts.get("binary") or facts.get("error"):
            results[log.path] = FileResult(log.path, log.role, log.rank, None, facts)
            continue
        todo.append((log, abspath, st.st_size, st.st_mtime_ns, facts))
    extra = {"parallel_min_bytes": parallel_min_bytes} if parallel_min_bytes is not None else {}
    scanned = scan_many([t[0].path for t in todo], [t[2] for t in todo], ruleset, scan_fn, jobs, **extra)
    for (log, abspath, size, mtime_ns, facts), evidence in zip(todo, scanned):
        if isinstance(evidence, str):
            notes.append(evidence)
            results[log.path] = FileResult(log.path, log.role, log.rank, None, {"error": evidence})
            continue
        index.store(abspath, size, mtime_ns, evidence, facts)
        results[log.path] = FileResult(log.path, log.role, log.rank, evidence, facts)
    return results, len(todo), notes


def _year(moment: datetime, year: int) -> datetime:
    try:
        return moment.replace(year=year)
    except ValueError:  # 29 February
        return moment


def _attach_kernel_logs(groups: list[RunGroup], results: dict[str, FileResult]) -> list[RunGroup]:
    """A kernel log joins the run whose time it overlaps (nearest folder first), or the only run."""
    runs = [g for g in groups if g.kind != "kernel"]
    kept = list(runs)
    for kernel in (g for g in groups if g.kind == "kernel"):
        facts = results[kernel.files[0].path].facts
        k_start, k_end = parse_iso(facts.get("first_time")), parse_iso(facts.get("last_time"))
        candidates = []
        for run in runs:
            files = [results[f.path] for f in run.files]
            start, end = time_range(files, read_record(run.record_dir) if run.record_dir else {})
            if start is not None and k_start and k_end:
                # syslog times carry no year (facts guessed it from the file's mtime): take the run's
                k_start, k_end = _year(k_start, start.year), _year(k_end, start.year)
            overlaps = within(k_start, start, end, KERNEL_SLACK_S) or within(k_end, start, end, KERNEL_SLACK_S) or (
                within(start, k_start, k_end, 0) if start and k_start and k_end else False)
            if overlaps:
                near = os.path.commonpath([os.path.dirname(kernel.anchor), run.anchor])
                candidates.append((-len(near), run))
        if len(runs) == 1 and not candidates:
            candidates = [(0, runs[0])]
        if candidates:
            min(candidates, key=lambda c: c[0])[1].files.extend(kernel.files)
        else:
            kept.append(kernel)
    return kept


def postmortem(paths: list[str], ruleset: RuleSet, index_path: str | None = None, use_index: bool = True,
               window_s: float = 300.0, fail_on: str = "any", scan_fn: ScanFn | None = None,
               jobs: int | None = None, parallel_min_bytes: int | None = None) -> Postmortem:
    """Diagnose every run found under `paths`; raises InputError when a path is missing or holds no log."""
    if not paths:
        raise InputError("no PATH given", hint="gpufix postmortem gpufix-runs/  (records, logs or folders of them)")
    skipped: list[str] = []  # files not read while discovering (FIFOs, devices, dangling links, unlistable folders)
    groups = discover(paths, skipped)
    if not groups:
        raise InputError(f"no logs found in {', '.join(paths)}" + "".join(f"\n  {n}" for n in skipped[:20]),
                         hint="pass run records, Slurm .out files, torchrun --log-dir trees or *.log files")
    index = Index((index_path or default_index_path(paths)) if use_index else None, rules_version(ruleset))
    try:
        results, scanned, notes = _results(groups, ruleset, index, scan_fn, jobs, parallel_min_bytes)
        groups = _attach_kernel_logs(groups, results)
        runs = [analyze_run(g, [results[f.path] for f in g.files], ruleset, window_s) for g in groups]
        runs.sort(key=lambda r: (r.started or datetime.max, r.id))
        seen = iso(datetime.now(timezone.utc).replace(tzinfo=None))
        for run in runs:
            root = run.root_cause
            index.record_run(run.anchor, run.id, iso(run.started), run.status,
                             root.code if root else None, root.category if root else None, seen or "")
        index.commit()
        history = {}
        for code in sorted({r.root_cause.code for r in runs if r.root_cause and r.status == "failed"}):
            found = index.history(code)
            if found and found.get("runs"):
                history[code] = {k: found[k] for k in ("first_seen", "first_run", "last_seen", "last_run", "runs")}
        summary = summarise_runs(runs, fail_on, history, set(ruleset.by_code))
    finally:
        index.close()
    samples = {r.id: read_samples(r.record_dir) if r.record_dir else [] for r in runs}
    return Postmortem(runs, summary, skipped + notes + index.notes + list(ruleset.notes), samples, scanned)


def since_when(code: str, index_path: str) -> dict[str, Any] | None:
    """The index's answer to "since when has CODE been a root cause", or None without an index."""
    if not os.path.lexists(index_path):
        return None
    index = Index(index_path, "")
    try:
        if not index.enabled and index.notes:  # refused (a symbolic link, not a regular file) or unusable
            raise InputError(index.notes[0].replace("; every file is scanned", ""))
        return index.history(code)
    finally:
        index.close()

"""`gpufix postmortem`: discover logs, scan what the index does not already hold, group files into
runs, diagnose each run the index holds no current report of, and compare runs across nights.

    postmortem(paths, ruleset) -> Postmortem(runs ordered by start, summary, notes, samples)
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from gpufix.errors import InputError
from gpufix.postmortem.across import summarise_runs
from gpufix.postmortem.analyze import FileResult, RunReport, analyze_run, time_range, within
from gpufix.postmortem.discover import LogFile, RunGroup, discover
from gpufix.postmortem.facts import file_facts
from gpufix.postmortem.index import INDEX_NAME, Index, Stamp, rules_version
from gpufix.postmortem.reuse import report_from_blob, report_to_blob, ruleset_fingerprint, run_key
from gpufix.postmortem.runinfo import read_record
from gpufix.postmortem.scan import ScanFn, default_scan_fn, scan_many
from gpufix.safeio import not_regular
from gpufix.postmortem.telemetry import read_samples
from gpufix.record.layout import META, RESULT
from gpufix.postmortem.times import iso, parse_iso
from gpufix.rules.model import RuleSet

KERNEL_SLACK_S = 600.0


class RunSamples(Mapping[str, list[dict[str, Any]]]):
    """Run id -> its record's telemetry samples, read when asked for (only the HTML report draws
    them: a text or JSON re-run reads no record's telemetry)."""

    def __init__(self, record_dirs: dict[str, str | None]) -> None:
        self._dirs = record_dirs
        self._read: dict[str, list[dict[str, Any]]] = {}

    def __getitem__(self, run_id: str) -> list[dict[str, Any]]:
        if run_id not in self._read:
            folder = self._dirs[run_id]
            self._read[run_id] = read_samples(folder) if folder else []
        return self._read[run_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._dirs)

    def __len__(self) -> int:
        return len(self._dirs)


@dataclass(frozen=True)
class Postmortem:
    """The result: runs ordered by start time, the cross-run summary, notes, and per-run telemetry."""

    runs: list[RunReport]
    summary: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    samples: Mapping[str, list[dict[str, Any]]] = field(default_factory=dict)
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
             jobs: int | None, parallel_min_bytes: int | None
             ) -> tuple[dict[str, FileResult], dict[str, Stamp | None], int, list[str]]:
    """Every file's facts, and evidence when it was scanned now; a file unchanged since the index
    stored it is stat-ed only (its evidence is read from the index if its run needs diagnosing).

    Returns the results, each file's stamp when its result is in the index (else None), the
    number of files scanned and the notes.
    """
    notes: list[str] = []
    results: dict[str, FileResult] = {}
    stamps: dict[str, Stamp | None] = {}
    todo: list[tuple[LogFile, str, Stamp, dict[str, Any]]] = []
    for log in (f for g in groups for f in g.files):
        abspath = os.path.abspath(log.path)
        stamps[log.path] = None
        try:
            st = os.stat(abspath)
        except OSError:
            st = None
        if st is None or not stat.S_ISREG(st.st_mode):
            # only regular files are read: a FIFO or device is a note, never a hang
            why = not_regular(abspath) or "changed while it was read; not read"
            notes.append(f"{log.path}: {why}")
            results[log.path] = FileResult(log.path, log.role, log.rank, None, {"error": why})
            continue
        stamp = Stamp.of(st)
        if index.unchanged(abspath, stamp):
            facts = index.facts(abspath)
            if facts is not None:
                results[log.path] = FileResult(log.path, log.role, log.rank, None, facts)
                stamps[log.path] = stamp
                continue
        facts = file_facts(abspath)
        if facts.get("error"):
            notes.append(f"{log.path}: {facts['error']}; not scanned")
        if facts.get("binary") or facts.get("error"):
            results[log.path] = FileResult(log.path, log.role, log.rank, None, facts)
            if facts.get("binary"):
                index.store(abspath, stamp, None, facts)
                stamps[log.path] = stamp
            continue
        todo.append((log, abspath, stamp, facts))
    extra = {"parallel_min_bytes": parallel_min_bytes} if parallel_min_bytes is not None else {}
    scanned = scan_many([t[0].path for t in todo], [t[2].size for t in todo], ruleset, scan_fn, jobs, **extra)
    for (log, abspath, stamp, facts), evidence in zip(todo, scanned):
        if isinstance(evidence, str):
            notes.append(evidence)
            results[log.path] = FileResult(log.path, log.role, log.rank, None, {"error": evidence})
            continue
        index.store(abspath, stamp, evidence, facts)
        results[log.path] = FileResult(log.path, log.role, log.rank, evidence, facts)
        stamps[log.path] = stamp
    return results, stamps, len(todo), notes


class _Records:
    """A record's times and status through the index (attaching kernel logs asks for every
    record's): its meta.json and result.json are read again only when their stat changed. Only
    what is asked for is kept (`_TIMES`), not the job's command line or environment."""

    def __init__(self, index: Index) -> None:
        self._index = index
        self._read: dict[str, dict[str, Any]] = {}

    def __call__(self, record_dir: str) -> dict[str, Any]:
        folder = os.path.abspath(record_dir)
        if folder not in self._read:
            stamp = json.dumps([_stamp_or_none(os.path.join(folder, name)) for name in (META, RESULT)])
            data = self._index.record_info(folder, stamp)
            if data is None:
                whole = read_record(folder)
                data = {part: {k: v for k, v in whole[part].items() if k in keys} if isinstance(whole[part], dict) else None
                        for part, keys in _TIMES.items()}
                self._index.store_record_info(folder, stamp, data)
            self._read[folder] = data
        return self._read[folder]


_TIMES = {"meta": ("start_utc", "end_utc", "status"), "result": ("end_utc",)}  # what time_range and status read


def _stamp_or_none(path: str) -> list[int] | None:
    try:
        return list(Stamp.of(os.stat(path)))
    except OSError:
        return None


def _with_evidence(files: list[FileResult], stamps: dict[str, Stamp | None], index: Index,
                   ruleset: RuleSet, scan_fn: ScanFn | None) -> list[FileResult]:
    """The files of a run to diagnose, with the evidence of those served by the index read back."""
    out = []
    for f in files:
        if f.evidence is None and stamps.get(f.path) is not None and not f.facts.get("binary"):
            evidence = index.evidence(os.path.abspath(f.path), f.path)
            if evidence is None:  # damaged or gone from the index: scan the file now
                try:
                    evidence = (scan_fn or default_scan_fn())(f.path, ruleset)
                except OSError:
                    evidence = None
            f = replace(f, evidence=evidence)
        out.append(f)
    return out


def _analyze(groups: list[RunGroup], results: dict[str, FileResult], stamps: dict[str, Stamp | None],
             ruleset: RuleSet, index: Index, records: _Records, window_s: float,
             scan_fn: ScanFn | None) -> list[RunReport]:
    """Each run's report: the stored one when none of its inputs changed, else diagnosed now (and stored)."""
    fingerprint = ruleset_fingerprint(ruleset) if index.enabled else ""
    runs = []
    for group in groups:
        key = run_key(group, stamps, fingerprint, window_s) if index.enabled else None
        stored = index.analysis(group.anchor, key) if key is not None else None
        report = report_from_blob(stored) if stored is not None else None
        if report is None:
            files = _with_evidence([results[f.path] for f in group.files], stamps, index, ruleset, scan_fn)
            report = analyze_run(group, files, ruleset, window_s)
            if key is not None and not _may_change_by_itself(group, records):
                index.store_analysis(group.anchor, key, report_to_blob(report))
        runs.append(report)
    return runs


def _may_change_by_itself(group: RunGroup, records: _Records) -> bool:
    """A record still "running": its verdict depends on whether its gpufix is alive, not on its files."""
    if not group.record_dir:
        return False
    meta = records(group.record_dir).get("meta") or {}
    return meta.get("status") == "running"


def _year(moment: datetime, year: int) -> datetime:
    try:
        return moment.replace(year=year)
    except ValueError:  # 29 February
        return moment


def _attach_kernel_logs(groups: list[RunGroup], results: dict[str, FileResult],
                        records: Callable[[str], dict[str, Any]] = read_record) -> list[RunGroup]:
    """A kernel log joins the run whose time it overlaps (nearest folder first), or the only run."""
    runs = [g for g in groups if g.kind != "kernel"]
    kept = list(runs)
    for kernel in (g for g in groups if g.kind == "kernel"):
        facts = results[kernel.files[0].path].facts
        k_start, k_end = parse_iso(facts.get("first_time")), parse_iso(facts.get("last_time"))
        candidates = []
        for run in runs:
            files = [results[f.path] for f in run.files]
            start, end = time_range(files, records(run.record_dir) if run.record_dir else {})
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
    for path in paths:
        if not os.path.exists(path):
            raise InputError(f"{path}: no such file or folder",
                             hint="pass run records, log files or folders of them: gpufix postmortem runs/")
    index = Index((index_path or default_index_path(paths)) if use_index else None, rules_version(ruleset), lazy=True)
    try:
        skipped: list[str] = []  # files not read while discovering (FIFOs, devices, dangling links, unlistable folders)
        groups = discover(paths, skipped, index)
        if not groups:
            raise InputError(f"no logs found in {', '.join(paths)}" + "".join(f"\n  {n}" for n in skipped[:20]),
                             hint="pass run records, Slurm .out files, torchrun --log-dir trees or *.log files")
        results, stamps, scanned, notes = _results(groups, ruleset, index, scan_fn, jobs, parallel_min_bytes)
        records = _Records(index)
        groups = _attach_kernel_logs(groups, results, records)
        runs = _analyze(groups, results, stamps, ruleset, index, records, window_s, scan_fn)
        index.forget([os.path.abspath(p) for p in paths] + [os.path.realpath(p) for p in paths],
                     {os.path.abspath(f.path) for g in groups for f in g.files}, {g.anchor for g in groups},
                     {os.path.abspath(g.record_dir) for g in groups if g.record_dir})
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
    samples = RunSamples({r.id: r.record_dir for r in runs})
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

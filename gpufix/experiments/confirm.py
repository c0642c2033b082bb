"""`gpufix confirm`: plan the experiments a record's findings call for, run them, keep the results.

The findings come from the record's result.json (what `gpufix run` diagnosed), root cause first;
each names its experiments (rules/*.yaml `experiments:`). An experiment runs once, for the first
finding that names it. Results go to `<record>/experiments/results.json` (the JSON of
`ConfirmReport.to_dict`), which `gpufix explain RECORD` shows beside the findings (results.py).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

from gpufix.errors import GpufixError
from gpufix.experiments import registry
from gpufix.experiments.base import CONFIRMED, INCONCLUSIVE, REFUTED, Context, Plan, Result, Skip
from gpufix.experiments.results import RESULTS

MIN_TIME_TO_START_S = 5.0


class ConfirmReport(NamedTuple):
    record: str
    plans: list[Plan]
    skipped: list[Skip]
    results: list[Result]
    budget_s: float
    duration_s: float
    ran: bool  # False for --dry-run (or when the user declined)

    def to_dict(self) -> dict[str, Any]:
        counts = {verdict: sum(r.verdict == verdict for r in self.results) for verdict in (CONFIRMED, REFUTED, INCONCLUSIVE)}
        return {
            "record": self.record,
            "experiments": [r.to_dict() for r in self.results],
            "planned": [{"name": p.experiment, "for": p.finding, "what": p.what, "estimate_s": round(p.estimate_s, 1),
                         "uses_gpu": p.uses_gpu, "changes": p.changes} for p in self.plans],
            "skipped": [{"name": s.experiment, "for": s.finding, "reason": s.reason} for s in self.skipped],
            "summary": {**counts, "ran": self.ran, "duration_s": round(self.duration_s, 1), "budget_s": self.budget_s},
        }


def open_context(record_dir: str, budget_s: float, progress: Callable[[str], None],
                 command: list[str] | None = None, batch_size_arg: str | None = None) -> Context:
    """The record, read and checked; raises GpufixError with what to do when it cannot be used."""
    from gpufix.record.reader import Record, is_record
    from gpufix.redact import REDACTED

    record = Path(record_dir).resolve()  # trials run in the job's cwd: every path handed to them is absolute
    if not is_record(str(record)):
        raise GpufixError(f"{record_dir} is not a run record (no meta.json and output.log)",
                          "pass a folder that `gpufix run` wrote, e.g. gpufix-runs/<time>-<name>-<id>")
    opened = Record(record)
    meta, result = opened.meta, opened.result
    argv = list(command) if command else [str(a) for a in meta.get("command") or []]
    if not argv:
        raise GpufixError(f"{record_dir}: the record holds no command to re-run", "give it after --: gpufix confirm "
                          "RECORD -- python train.py ...")
    if any(REDACTED in a for a in argv):
        raise GpufixError(f"{record_dir}: the recorded command had secrets in it, which the record keeps redacted, so "
                          "it cannot be re-run as written", "give the command after --: gpufix confirm RECORD -- "
                          "python train.py --token ...")
    cwd = str(meta.get("cwd") or "")
    if not os.path.isdir(cwd):
        raise GpufixError(f"{record_dir}: the run's working directory {cwd or '(unknown)'} is gone",
                          "re-create it, or run the command under gpufix run again")
    facts = opened.probe_facts if opened.has_probe else {}
    return Context(record, meta, result, argv, cwd, facts, budget_s, progress, batch_size_arg)


def plan(ctx: Context, only: tuple[str, ...] = (), params: dict[str, dict[str, Any]] | None = None,
         ) -> tuple[list[Plan], list[Skip]]:
    """The experiments the record's findings call for, in the findings' order, and those that cannot run."""
    known = registry()
    unknown = [name for name in only if name not in known]
    if unknown:
        raise GpufixError(f"unknown experiment {unknown[0]!r}", f"known: {', '.join(known)}")
    plans: list[Plan] = []
    skips: list[Skip] = []
    seen: set[str] = set()
    findings = [f for f in ctx.result.get("findings") or [] if isinstance(f, dict)]
    # A consequence is explained by the finding it follows from: its experiments would measure that one again
    # (a worker that "exited unexpectedly" because it was killed), so they run only when named with --only.
    wanted_by = [(f, w) for f in findings for w in f.get("experiments") or []
                 if isinstance(w, dict) and (not f.get("consequence_of") or w.get("name") in only)]
    # An experiment named with --only that no finding calls for runs for the root cause (or the run as a whole).
    root = findings[0] if findings else {"code": "-"}
    wanted_by += [(root, {"name": name}) for name in only if name not in {w.get("name") for _f, w in wanted_by}]
    for finding, wanted in wanted_by:
        name = wanted.get("name")
        if not name or name in seen or (only and name not in only):
            continue
        seen.add(name)
        experiment = known.get(name)
        if experiment is None:
            skips.append(Skip(name, str(finding.get("code")), "not a built-in experiment of this gpufix"))
            continue
        given = {**(wanted.get("params") or {}), **((params or {}).get(name) or {})}
        try:
            planned = experiment.plan(ctx, finding, given)
        except Exception as exc:  # an experiment's bug must not cost the others
            planned = Skip(name, str(finding.get("code")), f"could not be planned: {exc!r}")
        (plans if isinstance(planned, Plan) else skips).append(planned)  # type: ignore[arg-type]
    return plans, skips


def run(ctx: Context, plans: list[Plan]) -> list[Result]:
    """Run the planned experiments in order, each guarded and bounded; results are written as they come."""
    known = registry()
    results: list[Result] = []
    for planned in plans:
        experiment = known[planned.experiment]
        started = time.monotonic()
        if ctx.time_left() < MIN_TIME_TO_START_S:
            result = Result(planned.experiment, planned.finding, INCONCLUSIVE, "not run: the time budget was spent", {})
        else:
            try:
                result = experiment.run(ctx, planned)
            except Exception as exc:
                result = Result(planned.experiment, planned.finding, INCONCLUSIVE,
                                f"the experiment failed: {type(exc).__name__}: {exc}", {},
                                duration_s=time.monotonic() - started)
        results.append(result)
        ctx.progress(f"{planned.experiment}: {result.verdict}")
    return results


def save(ctx: Context, report: ConfirmReport) -> Path:
    """Write the report into the record (atomically), beside the trials' own records."""
    ctx.work.mkdir(parents=True, exist_ok=True)
    path = ctx.work / RESULTS
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path

"""Across runs: the summary table, failures grouped by root-cause code, what is new since the
last good run and what recurs, the environment diff between the last good and the first bad
run, and which failures make the exit status 1 (`--fail-on`).

Runs arrive ordered by start time. The **last good run** is the latest succeeded run before the
latest failure; the **first bad run** is the first failed run after it (the first failure of
all when no run before it succeeded).

A `succeeded_with_findings` run (exit 0, but gpufix found a problem) is neither: it is not good
(the last good run is the newest one without a problem, the baseline the environment diff is
taken from) and not a failure (not in `by_code`, `new` or `recurring`, and it never makes the
exit status 1); it is counted under its own key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpufix.errors import GpufixError
from gpufix.postmortem.analyze import STATUSES
from gpufix.postmortem.runinfo import environment_diff
from gpufix.postmortem.times import iso
from gpufix.rules.model import CATEGORIES

if TYPE_CHECKING:
    from gpufix.postmortem.analyze import RunReport


def parse_fail_on(value: str, known_codes: set[str]) -> frozenset[str] | None:
    """`any` -> None (every failure counts); `none` -> empty; else categories and rule codes.

    Raises GpufixError (exit 2) naming what is unknown.
    """
    value = value.strip()
    if value.lower() == "any":
        return None
    if value.lower() == "none":
        return frozenset()
    wanted = {v.strip() for v in value.split(",") if v.strip()}
    unknown = sorted(w for w in wanted if w not in CATEGORIES and w.upper() not in known_codes)
    if unknown or not wanted:
        raise GpufixError(
            f"--fail-on: unknown category or rule code {', '.join(unknown) or repr(value)}",
            hint="use any, none, or categories (" + ", ".join(sorted(CATEGORIES)) + ") and/or codes like MEM001",
        )
    return frozenset(w if w in CATEGORIES else w.upper() for w in wanted)


def counts_as_failure(run: RunReport, fail_on: frozenset[str] | None) -> bool:
    if run.status != "failed":
        return False
    if fail_on is None:
        return True
    root = run.root_cause
    return root is not None and (root.category in fail_on or root.code in fail_on)


def _last_good_first_bad(runs: list[RunReport]) -> tuple[int | None, int | None]:
    failures = [i for i, r in enumerate(runs) if r.status == "failed"]
    goods = [i for i, r in enumerate(runs) if r.status == "succeeded"]
    if not failures:
        return (goods[-1] if goods else None), None
    before = [i for i in goods if i < failures[-1]]
    good = before[-1] if before else None
    bad = next(i for i in failures if good is None or i > good)
    return good, bad


def summarise_runs(runs: list[RunReport], fail_on: str = "any", history: dict[str, Any] | None = None,
                   known_codes: set[str] | None = None) -> dict[str, Any]:
    """The `summary` object of the JSON document (docs/postmortem.md)."""
    parsed = parse_fail_on(fail_on, known_codes or {r.root_cause.code for r in runs if r.root_cause})
    statuses = [r.status for r in runs]
    by_code: dict[str, dict[str, Any]] = {}
    for run in runs:
        if run.status == "failed" and run.root_cause:
            root = run.root_cause
            entry = by_code.setdefault(root.code, {"title": root.title, "name": root.name,
                                                   "category": root.category, "runs": []})
            entry["runs"].append(run.id)
    good, bad = _last_good_first_bad(runs)
    cut = good if good is not None else -1
    before = {r.root_cause.code for r in runs[:cut + 1] if r.root_cause and r.status == "failed"}
    after = [r.root_cause.code for r in runs[cut + 1:] if r.root_cause and r.status == "failed"]
    new = sorted(dict.fromkeys(c for c in after if c not in before))
    recurring = sorted(code for code, entry in by_code.items() if len(entry["runs"]) > 1)
    diff = environment_diff(runs[good].environment, runs[bad].environment) if good is not None and bad is not None else []
    return {
        "runs": len(runs),
        **{status: statuses.count(status) for status in STATUSES},
        "table": [{"id": r.id, "started": iso(r.started), "status": r.status,
                   "root_cause": r.root_cause.code if r.root_cause else None} for r in runs],
        "by_code": by_code,
        "last_good": runs[good].id if good is not None else None,
        "first_bad": runs[bad].id if bad is not None else None,
        "new": new,
        "recurring": recurring,
        "environment_diff": diff,
        "history": dict(history or {}),
        "exit_status": 1 if any(counts_as_failure(r, parsed) for r in runs) else 0,
    }

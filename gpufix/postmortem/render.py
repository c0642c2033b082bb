"""Terminal and markdown reports of a post-mortem, drawn from its JSON-ready document.

Both renderers take the same `Postmortem`; the terminal one reuses `gpufix explain`'s finding
renderer so the wording of a root cause is the same everywhere, and adds rich markup only when
colour is on (a CI log and a terminal show the same lines).
"""

from __future__ import annotations

from typing import Any

from gpufix.postmortem.analyze import STATUSES, SUCCEEDED_WITH_FINDINGS, RunReport, status_label
from gpufix.postmortem.core import Postmortem
from gpufix.postmortem.times import iso
from gpufix.report.markdown import _code
from gpufix.report.text import _Style, render_finding
from gpufix.signals import shown

_STATUS_STYLE = {"failed": "bold red", "succeeded": "green", SUCCEEDED_WITH_FINDINGS: "bold yellow",
                 "running": "yellow", "unknown": "dim"}
# field -> (label, unit) of the telemetry summary's metrics (gpufix.postmortem.telemetry.METRICS)
_UNITS = {s.field: (s.label, f" {s.unit}") for s in shown("postmortem")}


def _when(moment: str | None) -> str:
    return moment.replace("T", " ") if moment else "-"


def _culprit_text(run: RunReport) -> str | None:
    c = run.first_failing
    if not c:
        return None
    if c.get("node") or c.get("gpu"):
        where = ", ".join(x for x in (f"node {c['node']}" if c.get("node") else "",
                                      f"GPU {c['gpu']}" if c.get("gpu") else "") if x)
        return f"{where} ({c['basis']})"
    if c.get("ranks"):
        label = "rank" if len(c["ranks"]) == 1 else "ranks"
        return f"{label} {', '.join(map(str, c['ranks']))} ({c['basis']})"
    return None


def _telemetry_lines(telemetry: dict[str, Any] | None) -> list[str]:
    if not telemetry or not telemetry.get("gpus"):
        return []
    minutes = telemetry["window_s"] / 60
    out = [f"Telemetry, {minutes:g} min up to {_when(telemetry['to'])} ({telemetry['samples']} samples):"]
    for gpu, stats in telemetry["gpus"].items():
        parts = []
        for metric, (label, unit) in _UNITS.items():
            if metric in stats:
                lo, hi = stats[metric]["min"], stats[metric]["max"]
                parts.append(f"{label} {lo:g}–{hi:g}{unit}" if lo != hi else f"{label} {lo:g}{unit}")
        out.append(f"  GPU {gpu}: " + (", ".join(parts) or "no values"))
    return out


def _run_facts(run: RunReport) -> list[str]:
    """The lines about one run that are not the finding itself (shared by both formats)."""
    out = []
    ended = f"exit status {run.exit_status}" if run.exit_status is not None else status_label(run.status)
    at = "failed at" if run.status != SUCCEEDED_WITH_FINDINGS else "problem at"
    out.append(f"started {_when(iso(run.started))}, {ended}"
               + (f", {at} {_when(iso(run.failed_at))} ({run.failed_at_basis})" if run.failed_at else ""))
    culprit = _culprit_text(run)
    if culprit:
        out.append(f"first failing (causally): {culprit}")
    if run.affected_ranks:
        out.append(f"affected as a consequence: ranks {', '.join(map(str, run.affected_ranks))}")
    reported = run.torchrun_reported_rank
    if reported is not None and reported not in ((run.first_failing or {}).get("ranks") or [reported]):
        out.append(f"torchrun's \"Root Cause (first observed failure)\" names rank {reported}: "
                   "only the earliest exit it saw, not the cause")
    return out


def _summary_lines(pm: Postmortem) -> list[str]:
    s = pm.summary
    out = []
    if s["by_code"]:
        out.append("Failures by root cause:")
        for code, entry in s["by_code"].items():
            n = len(entry["runs"])
            out.append(f"  {code} {entry['name']} ({entry['category']}): {n} run{'s' if n != 1 else ''} — "
                       + ", ".join(entry["runs"]))
    if s["new"] and s["runs"] > 1:
        since = f"since the last good run ({s['last_good']})" if s["last_good"] else "(no good run before them)"
        out.append(f"New {since}: " + ", ".join(f"{c} {s['by_code'][c]['name']}" for c in s["new"]))
    for code in s["recurring"]:
        entry, hist = s["by_code"][code], s["history"].get(code)
        first = f", root cause since {_when(hist['first_seen'])} ({hist['runs']} runs in the index)" if hist else ""
        out.append(f"Recurring: {code} {entry['name']} in {len(entry['runs'])} runs{first}")
    if s["environment_diff"]:
        out.append(f"Changed between the last good run ({s['last_good']}) and the first bad run ({s['first_bad']}):")
        width = max(len(d["key"]) for d in s["environment_diff"])
        for d in s["environment_diff"]:
            out.append(f"  {d['key']:<{width}}  {d['last_good'] or '-'} -> {d['first_bad'] or '-'}")
    return out


def render_text(pm: Postmortem, color: bool = False) -> str:
    """The terminal report: summary table, cross-run findings, then each run that did not simply
    succeed (failed, succeeded with findings, running, unknown)."""
    st = _Style(color)
    s = pm.summary
    counts = _counts(s)
    out = [st(f"gpufix postmortem: {s['runs']} run{'s' if s['runs'] != 1 else ''} ({counts})", "bold"), ""]
    rows = [(r["id"], _when(r["started"]), status_label(r["status"]), r["root_cause"] or "-") for r in s["table"]]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(("run", "started", "status", "root cause"))]
    out.append(st("  ".join(h.ljust(w) for h, w in zip(("run", "started", "status", "root cause"), widths)).rstrip(), "bold"))
    for row, status in zip(rows, (r["status"] for r in s["table"])):
        cells = [st.plain(row[0].ljust(widths[0])), st.plain(row[1].ljust(widths[1])),
                 st(row[2].ljust(widths[2]), _STATUS_STYLE.get(status, "")), st.plain(row[3])]
        out.append("  ".join(cells))
    summary = _summary_lines(pm)
    if summary:
        out.append("")
        out += [st.plain(line) for line in summary]
    for run in pm.runs:
        if run.status == "succeeded":
            continue
        out += ["", st(f"== {run.id}: {status_label(run.status)} ==", _STATUS_STYLE.get(run.status, "bold"))]
        out += ["  " + st.plain(line) for line in _run_facts(run)]
        if run.root_cause:
            out.append("")
            out += ["  " + line if line else "" for line in render_finding(run.root_cause, st, 1, None, verbose=False)]
            for fix in run.root_cause.fixes[:3]:
                out.append("    " + st.plain(f"fix: {fix.title}") + st(f"  [{fix.kind}]", "dim"))
        for f in run.findings:
            if f is run.root_cause:
                continue
            ranks = (f" on rank{'s' if len(f.ranks) > 1 else ''} {', '.join(map(str, f.ranks))}" if f.ranks else "")
            label = f"consequence of {f.consequence_of}" if f.consequence_of else "also found"
            out.append("  " + st(f"{label}: {f.code} {f.name}{ranks}", "dim"))
        out += ["  " + st.plain(line) for line in _telemetry_lines(run.telemetry)]
        for note in run.notes:
            out.append("  " + st(f"note: {note}", "dim"))
    for note in pm.notes:
        out.append(st(f"note: {note}", "dim"))
    return "\n".join(out) + "\n"


def _counts(summary: dict[str, Any]) -> str:
    """`4 failed, 2 succeeded, 1 succeeded with findings`: the statuses that occur, in a fixed order."""
    return ", ".join(f"{summary[k]} {status_label(k)}" for k in STATUSES if summary.get(k))


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(pm: Postmortem) -> str:
    """Markdown for an issue or a chat: a table, the cross-run findings, a section per run that did not simply
    succeed (as in the terminal report)."""
    s = pm.summary
    out = ["# gpufix post-mortem", ""]
    counts = _counts(s)
    out += [f"{s['runs']} runs: {counts}.", "", "| run | started | status | root cause |", "|---|---|---|---|"]
    titles = {r.id: r.root_cause for r in pm.runs}
    for row in s["table"]:
        root = titles.get(row["id"])
        cause = f"`{root.code}` {_md_cell(root.title)}" if root else "—"
        status = f"**{row['status']}**" if row["status"] == "failed" else status_label(row["status"])
        out.append(f"| `{row['id']}` | {_when(row['started'])} | {status} | {cause} |")
    summary = _summary_lines(pm)
    if summary:
        out += ["", "## Across runs", ""]
        out += [("- " + line if not line.startswith("  ") else "  - " + " ".join(line.split())) for line in summary]
    for run in pm.runs:
        if run.status == "succeeded":
            continue
        out += ["", f"## `{run.id}`: {status_label(run.status)}", ""]
        out += [f"- {line}" for line in _run_facts(run)]
        root = run.root_cause
        if root:
            out += ["", f"**Root cause: {root.title}** (`{root.code}` {root.name}, {root.category})", "", root.message, ""]
            if root.evidence:
                out.append(_code("\n".join(f"{r.source}:{r.line}: " + (f"[rank {r.rank}] " if r.rank is not None else "")
                                           + r.text for r in root.evidence)))
                out.append("")
            if root.fixes:
                out += [f"{i}. {fix.title} *({fix.kind})*" for i, fix in enumerate(root.fixes[:3], 1)]
                out.append("")
        others = [f for f in run.findings if f is not root]
        if others:
            out += [f"- {'consequence of ' + f.consequence_of if f.consequence_of else 'also found'}: `{f.code}` {f.name}"
                    + (f" (ranks {', '.join(map(str, f.ranks))})" if f.ranks else "") for f in others]
        tele = _telemetry_lines(run.telemetry)
        if tele:
            out += ["", tele[0], ""] + [f"- {line.strip()}" for line in tele[1:]]
    if pm.notes:
        out.append("")
        out += [f"> note: {note}" for note in pm.notes]
    return "\n".join(out).rstrip() + "\n"

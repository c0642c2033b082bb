"""The compact diagnosis `gpufix run` prints on stderr after a failed job's own output.

Shorter than `gpufix explain`'s report: the root cause with its evidence and fixes (no
explanation paragraphs), other findings one line each, then where the record is. It reuses the
terminal report's finding renderer so both always agree on wording.
"""

from __future__ import annotations

import os

from gpufix.findings import Finding
from gpufix.report.text import _Style, confirm_hint, render_finding

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpufix.watchdog.watchdog import HangReport

MAX_FIXES = 5


def outcome(exit_status: int, signal_name: str | None, interrupted_by: str | None = None) -> str:
    """How the job ended, in words: `exit status 1`, `killed by SIGKILL (exit status 137)`,
    `interrupted by SIGINT, which gpufix passed on (exit status 130)`."""
    if interrupted_by:
        return f"interrupted by {interrupted_by}, which gpufix passed on (exit status {exit_status})"
    if signal_name:
        return f"killed by {signal_name} (exit status {exit_status})"
    return f"exit status {exit_status}"


def render_compact(findings: list[Finding], sources: list[str], notes: list[str], how_it_ended: str,
                   color: bool = False, record: str | None = None) -> str:
    """The diagnosis block; markup only when `color`; with the run's `record`, how to confirm the root cause."""
    s = _Style(color)
    interrupted = how_it_ended.startswith("interrupted")
    if how_it_ended == "exit status 0":
        # a job that succeeded is reported when what it printed (a NaN loss, "Using cpu device") or what
        # was measured shows a problem
        headline = f"gpufix: the job succeeded, but its output or measurements show a problem ({how_it_ended})."
    elif interrupted:
        headline = f"gpufix: the job was {how_it_ended}."
    else:
        headline = f"gpufix: the job failed ({how_it_ended})."
    out = [s(headline, "bold")]
    if not findings:
        out.append(s.plain("gpufix: nothing in its output or measurements points to a failure before it was stopped."
                           if interrupted else
                           "gpufix: no known failure pattern in its output; `gpufix rules list` shows what it knows."))
        return "\n".join(out) + "\n"
    root, others = findings[0], findings[1:]
    out.extend(render_finding(root, s, 1, sources[0] if len(sources) == 1 else None, verbose=False))
    if root.fixes:
        out.append("")
        out.append("  " + s("Fixes, in the order to try them", "bold") + ":")
        for i, fix in enumerate(root.fixes[:MAX_FIXES], 1):
            out.append(f"    {i}. " + s.plain(fix.title) + s(f"  [{fix.kind}]", "dim"))
            for line in (fix.snippet or "").splitlines()[:3]:
                out.append("       " + s(line, "green"))
    if root.experiments and record:
        out.append("  " + s(confirm_hint(root, record), "dim"))
    for finding in others:
        label = f"Consequence of {finding.consequence_of}" if finding.consequence_of else "Also found"
        out.append(s(f"{label}: {finding.title} ({finding.code} {finding.name})", "dim"))
    return "\n".join(out) + "\n"


def summary_lines(findings: list[dict[str, Any]], prefix: str = "gpufix: ", limit: int = 5, fixes: int = 1) -> list[str]:
    """Findings (`Finding.to_dict()` shape) as short lines: `CODE message`, then the first fixes."""
    lines = []
    for finding in findings[:limit]:
        lines.append(f"{prefix}{finding['code']} {finding['message']}")
        lines.extend(f"{prefix}  fix: {fix['title']}" for fix in (finding.get("fixes") or [])[:fixes])
    return lines


def render_hang(report: HangReport) -> str:
    """The stderr text for a hang: what was seen, the verdicts, where the dumps are."""
    lines = [f"gpufix: the job looks hung: {report.why} for {report.idle_s:.0f} s; "
             f"stacks of {len(report.dumps)} process(es) dumped"]
    lines += summary_lines(list(report.findings), limit=4)
    if not report.findings:
        lines.append("gpufix: no known wait pattern in the stacks; read them to see where each process is")
    if report.dumps:
        lines.append(f"gpufix: stacks: {os.path.dirname(report.dumps[0])}")
    if report.killed:
        lines.append("gpufix: --on-hang kill: ending the job")
    return "\n".join(lines) + "\n"

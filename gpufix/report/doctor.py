"""Render a `DoctorReport` as text (rich markup only when colour is on), JSON or Markdown."""

from __future__ import annotations

import json

from gpufix.doctor.model import FAIL, PASS, SKIPPED, WARN, CheckResult, DoctorReport

_LABEL = {PASS: "PASS", WARN: "WARN", FAIL: "FAIL", SKIPPED: "SKIP"}
_STYLE = {PASS: "green", WARN: "yellow", FAIL: "bold red", SKIPPED: "dim"}
_MD_ICON = {PASS: "✅ pass", WARN: "⚠️ warn", FAIL: "❌ fail", SKIPPED: "⏭️ skipped"}


def _paint(text: str, style: str, color: bool) -> str:
    if not color:
        return text
    from rich.markup import escape

    return f"[{style}]{escape(text)}[/]"


def _plain(text: str, color: bool) -> str:
    if not color:
        return text
    from rich.markup import escape

    return escape(text)


def _header(report: DoctorReport) -> str:
    py = report.python
    drv = report.driver
    driver = f"driver {drv.get('driver_version')}" if drv.get("available") else "no NVIDIA driver"
    return f"gpufix doctor: {driver}, {len(report.gpus)} GPU(s), Python {py.get('version', '?')} at {py.get('interpreter')}"


def _summary_line(report: DoctorReport) -> str:
    s = report.summary()
    verdict = "something will fail" if s["exit_code"] else "ready"
    return f"{s[PASS]} pass, {s[WARN]} warn, {s[FAIL]} fail, {s[SKIPPED]} skipped: {verdict}"


def render_text(report: DoctorReport, color: bool = False, verbose: bool = False) -> str:
    """The checklist; evidence for every item, the fix under each warn/fail. `verbose` adds skipped reasons' detail."""
    lines = [_paint(_header(report), "bold", color), ""]
    width = max(len(c.title) for c in report.checks) if report.checks else 0
    for c in report.checks:
        label = _paint(f"{_LABEL[c.status]:<4}", _STYLE[c.status], color)
        head = f"{c.title:<{width}}"
        first = c.evidence[0] if c.evidence else ""
        lines.append(f"{label}  {_plain(head, color)}  {_paint(first, 'dim', color) if c.status == SKIPPED else _plain(first, color)}")
        if c.status == SKIPPED and not verbose:
            continue
        for ev in c.evidence[1:]:
            lines.append(" " * 6 + _plain(ev, color))
        if c.fix and c.status in (WARN, FAIL):
            lines.append(" " * 6 + _paint("fix: ", "bold", color) + _plain(c.fix, color))
    lines += ["", _paint(_summary_line(report), "bold", color)]
    return "\n".join(lines) + "\n"


def render_json(report: DoctorReport) -> str:
    return json.dumps(report.to_dict(), indent=2, default=str) + "\n"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_item(c: CheckResult) -> list[str]:
    out = [f"### {_MD_ICON[c.status]}: {c.title} (`{c.id}`)", ""]
    out += [f"- {_md_cell(ev)}" for ev in c.evidence]
    if c.fix and c.status in (WARN, FAIL):
        out += ["", f"**Fix:** {c.fix}"]
    return out + [""]


def render_markdown(report: DoctorReport) -> str:
    """A summary table, then a section for each warn/fail (for pasting into an issue)."""
    lines = [f"## {_header(report)}", "", f"**{_summary_line(report)}**", "", "| status | check | evidence |",
             "|---|---|---|"]
    for c in report.checks:
        lines.append(f"| {_MD_ICON[c.status]} | {_md_cell(c.title)} | {_md_cell(c.evidence[0] if c.evidence else '')} |")
    problems = [c for c in report.checks if c.status in (FAIL, WARN)]
    if problems:
        lines += ["", "## What to fix", ""]
        for c in sorted(problems, key=lambda c: c.status != FAIL):
            lines += _md_item(c)
    return "\n".join(lines).rstrip("\n") + "\n"


def render(report: DoctorReport, fmt: str, color: bool = False) -> str:
    if fmt == "json":
        return render_json(report)
    if fmt == "markdown":
        return render_markdown(report)
    return render_text(report, color=color)

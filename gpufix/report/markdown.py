"""Markdown report: paste into an issue or a chat."""

from __future__ import annotations

from gpufix.findings import Finding
from gpufix.report.text import contradicted, verified_changes

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def _code(text: str) -> str:
    fence = "`" * max(3, max((len(run) for run in text.split("`")[1::2]), default=0) + 1)
    return f"{fence}text\n{text}\n{fence}"


def render(findings: list[Finding], sources: list[str], notes: list[str],
           verdicts: dict[str, list[dict[str, Any]]] | None = None) -> str:
    """The Markdown report; `verdicts` (finding code -> stored `gpufix confirm` results) as in the terminal report."""
    out = ["# gpufix diagnosis", ""]
    if not findings:
        out.append(f"No known failure found in {', '.join(sources)}.")
    elif not any(f.is_gpu for f in findings):
        out += ["**Not a GPU problem**: " + ("nothing failed on its own." if findings[0].severity == "info"
                                             else "an ordinary program error."), ""]
    for number, f in enumerate(findings, 1):
        label = "Root cause" if number == 1 and not f.consequence_of else (
            f"Consequence of {f.consequence_of}" if f.consequence_of else "Also found")
        out += [f"## {label}: {f.title} (`{f.code}` {f.name})", ""]
        out.append(f"*{f.category}, severity {f.severity}, confidence {f.confidence}*")
        out += ["", f.message, "", f.explanation, ""]
        rows = (verdicts or {}).get(f.code) or []
        if f.evidence:
            out.append(f"**Evidence** ({f.evidence_count} lines" + (f", ranks {', '.join(map(str, f.ranks))}" if f.ranks else "") + "):")
            out.append("")
            out.append(_code("\n".join(f"{r.source}:{r.line}: {r.text}" for r in f.evidence)))
            out.append("")
        if f.fixes:
            out.append("**Fixes** (in order):")
            out.append("")
            for i, fix in enumerate(f.fixes, 1):
                out.append(f"{i}. {fix.title} *({fix.kind})*")
                if fix.detail:
                    out.append(f"   {fix.detail}")
                if fix.snippet:
                    out.append(f"   `{fix.snippet}`" if "\n" not in fix.snippet else _code(fix.snippet))
                for name, change in verified_changes(rows):
                    differ = contradicted(fix.snippet, change)
                    if differ:
                        settings = ", ".join(f"`{k}={m}` (not {a})" for k, (a, m) in differ.items())
                        out.append(f"   **Measured instead**: {name} verified {settings}")
            out.append("")
        if rows:
            out.append("**Experiments** (`gpufix confirm`):")
            out.append("")
            for row in rows:
                out.append(f"- **{str(row.get('verdict', '?')).capitalize()}** by `{row.get('name')}`: {row.get('reason', '')}")
                fix = row.get("recommendation") or {}
                if fix.get("title"):
                    state = {True: "verified", False: "did not hold when verified"}.get(row.get("verified"), "not verified")
                    out.append(f"  - fix ({state}): {fix['title']}")
            out.append("")
    for note in notes:
        out.append(f"> note: {note}")
    return "\n".join(out).rstrip() + "\n"

"""Terminal report of a diagnosis. Plain text when not a TTY; rich markup on a terminal.

One renderer serves both: it writes through `_Style`, which adds rich markup only when colour
is on, so a CI log and a terminal show the same lines.
"""

from __future__ import annotations

from gpufix.findings import Finding

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_SEVERITY_STYLE = {"critical": "bold red", "error": "red", "warning": "yellow", "info": "cyan"}


class _Style:
    def __init__(self, color: bool) -> None:
        self.color = color

    def __call__(self, text: str, style: str) -> str:
        if not self.color:
            return text
        from rich.markup import escape

        return f"[{style}]{escape(text)}[/]"

    def plain(self, text: str) -> str:
        if not self.color:
            return text
        from rich.markup import escape

        return escape(text)


def _where(ref_source: str, line: int, only_source: str | None) -> str:
    """`line N` in the one input read; elsewhere (several inputs, or a record's telemetry or probe
    file beside its output.log) the file too, relative to that input's folder when inside it."""
    if only_source is None:
        return f"{ref_source}:{line}"
    if ref_source == only_source:
        return f"line {line}"
    import os

    folder = os.path.dirname(only_source)
    if folder and ref_source.startswith(folder + os.sep):
        return f"{ref_source[len(folder) + 1:]}:{line}"
    return f"{ref_source}:{line}"


def _evidence_line(s: _Style, ref_source: str, line: int, rank: int | None, text: str, only_source: str | None) -> str:
    where = _where(ref_source, line, only_source)
    rank_text = f" [rank {rank}]" if rank is not None else ""
    return "    " + s(f"{where}{rank_text}", "dim") + s.plain(f"  {text}")


def render_finding(finding: Finding, s: _Style, number: int, only_source: str | None, verbose: bool = True,
                   record: str | None = None, verdicts: list[dict[str, Any]] | None = None) -> list[str]:
    """A finding's lines; evidence from `only_source` (the one input, if there is one) shows as `line N`."""
    lines = []
    label = "Root cause" if number == 1 and finding.consequence_of is None else (
        f"Consequence of {finding.consequence_of}" if finding.consequence_of else "Also found"
    )
    head = f"{label}: {finding.title} ({finding.code} {finding.name})"
    lines.append(s(head, "bold " + _SEVERITY_STYLE.get(finding.severity, "")))
    tags = f"category {finding.category}, severity {finding.severity}, confidence {finding.confidence}"
    if not finding.is_gpu:
        tags += " — not a GPU problem"
    lines.append("  " + s(tags, "dim"))
    lines.append("  " + s.plain(finding.message))
    if verbose and finding.explanation:
        lines.append("")
        for para in finding.explanation.splitlines():
            lines.append("  " + s(para, "italic") if para.strip() else "")
    if finding.evidence:
        lines.append("")
        shown = len(finding.evidence)
        more = finding.evidence_count - shown
        ranks = f" on ranks {', '.join(map(str, finding.ranks))}" if len(finding.ranks) > 1 else ""
        lines.append("  " + s("Evidence", "bold") + s(f" ({finding.evidence_count} line{'s' if finding.evidence_count != 1 else ''}{ranks})", "dim") + ":")
        for ref in finding.evidence:
            lines.append(_evidence_line(s, ref.source, ref.line, ref.rank, ref.text, only_source))
        if more > 0:
            lines.append("    " + s(f"… and {more} more", "dim"))
    # a fix verified by `gpufix confirm` outranks the rule's own estimate of the same setting: say so under the
    # estimate (tried: "num_workers=1 here" above a loader sweep that measured num_workers=2 faster)
    measured = verified_changes(verdicts or [])
    if verbose and finding.fixes:
        lines.append("")
        lines.append("  " + s("Fixes, in the order to try them", "bold") + ":")
        for i, fix in enumerate(finding.fixes, 1):
            lines.append(f"    {i}. " + s.plain(fix.title) + s(f"  [{fix.kind}]", "dim"))
            if fix.detail:
                lines.append("       " + s.plain(fix.detail))
            if fix.snippet:
                for snippet_line in fix.snippet.splitlines():
                    lines.append("       " + s(snippet_line, "green"))
            for name, change in measured:
                differ = contradicted(fix.snippet, change)
                if differ:
                    settings = ", ".join(f"{k}={m} (not {a})" for k, (a, m) in differ.items())
                    lines.append("       " + s(f"measured instead: {name} verified {settings}; see below", "bold yellow"))
    ran = {row.get("name") for row in verdicts or []}
    # a consequence's experiments are not planned (the finding it follows from is measured instead): no hint
    if (verbose and finding.experiments and not finding.consequence_of
            and not all(e["name"] in ran for e in finding.experiments)):
        lines.append("  " + s(confirm_hint(finding, record), "dim"))
    for row in verdicts or []:
        fix = row.get("recommendation") or {}
        verified = {True: ", verified", False: ", did not hold when verified"}.get(row.get("verified"), "")
        lines.append("  " + s(f"{str(row.get('verdict', '?')).capitalize()} by {row.get('name')}: ", "bold")
                     + s.plain(str(row.get("reason", ""))))
        if fix.get("title"):
            lines.append("    " + s.plain(f"fix{verified}: {fix['title']}"))
    return lines


def _literal(value: object) -> str:
    """A setting's value as Python source spells it (`True`, `4`, `'x'` as `x`), so a snippet and a JSON change compare."""
    return repr(value) if isinstance(value, bool) else str(value)


def contradicted(snippet: str | None, change: dict) -> dict[str, tuple[str, str]]:  # type: ignore[type-arg]
    """The settings a fix's snippet gives other values than a verified change: name -> (advised, measured).
    `DataLoader(num_workers=1, ...)` against a measured `{"num_workers": 2}` gives {"num_workers": ("1", "2")}."""
    import re  # only with stored verdicts: not on explain's start-up path

    out: dict[str, tuple[str, str]] = {}
    for name, advised in re.findall(r"\b([A-Za-z_]\w*)\s*=\s*([\w.+-]+)", snippet or ""):
        if name in change and not isinstance(change[name], (dict, list)):
            measured = _literal(change[name])
            if advised != measured:
                out[name] = (advised, measured)
    return out


def verified_changes(rows: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(experiment name, change) of each stored `gpufix confirm` result whose recommended change was verified."""
    return [(str(row.get("name")), row["recommendation"]["change"]) for row in rows
            if row.get("verified") is True and isinstance((row.get("recommendation") or {}).get("change"), dict)]


def confirm_hint(finding: Finding, record: str | None) -> str:
    """How to test a finding: the `gpufix confirm` command when the record is known, else the experiments' names."""
    names = ", ".join(e["name"] for e in finding.experiments)
    return f"Confirm: gpufix confirm {record}  ({names})" if record else f"Confirm with: {names}"


# An info-level root (an interruption) is not an error of the program's.
_NOT_GPU_HEADLINE = {False: "this is an ordinary program error", True: "nothing failed on its own"}


def render(findings: list[Finding], sources: list[str], notes: list[str], color: bool = False, verbose: bool = True,
           record: str | None = None, verdicts: dict[str, list[dict[str, Any]]] | None = None) -> str:
    """The whole terminal report; markup only when `color`. For a run record, `record` (its path) makes
    the experiments line a `gpufix confirm` command and `verdicts` (finding code -> stored results of
    `gpufix confirm`) are shown under their findings."""
    s = _Style(color)
    out: list[str] = []
    only = sources[0] if len(sources) == 1 else None
    if not findings:
        out.append(s("No known failure found", "bold green") + " in " + s.plain(", ".join(sources) or "the input") + ".")
        out.append(s("gpufix matched no rule; if this is a failure, `gpufix rules list` shows what it knows.", "dim"))
    else:
        if not any(f.is_gpu for f in findings):
            out.append(s(f"Not a GPU problem: {_NOT_GPU_HEADLINE[findings[0].severity == 'info']}; "
                         "gpufix found no sign of a GPU failure.", "bold"))
            out.append("")
        for number, finding in enumerate(findings, 1):
            if number > 1:
                out.append("")
            out.extend(render_finding(finding, s, number, only, verbose=verbose or number == 1, record=record,
                                      verdicts=(verdicts or {}).get(finding.code)))
    for note in notes:
        out.append(s(f"note: {note}", "dim"))
    return "\n".join(out) + "\n"

"""HTML report of `gpufix postmortem`: one self-contained file to open the morning after.

`render_postmortem(doc, telemetry)` draws the postmortem JSON document (docs/postmortem.md) and
each run's parsed `telemetry.jsonl` objects: a summary (counts, a table of runs, failures by
root-cause code, what is new and what recurs, the environment differences between the last good
and the first bad run), then one section per run (root cause with evidence and fixes, first
failing and affected ranks, consequences, telemetry plots per GPU with the failure marked).

Self-contained and inert: inline CSS, inline SVG, no script at all, and a Content-Security-Policy
that forbids scripts and every network load, so even a mistake in escaping could neither run
code nor fetch anything. All text from logs is escaped and cut to size (`html_text`).
"""

from __future__ import annotations

from typing import Any

from gpufix import __version__
from gpufix.report.html_plot import PANELS, telemetry_html
from gpufix.report.html_style import CSS
from gpufix.report.html_text import MAX_LINE, attr, duration, esc, ranks_text, slug, to_epoch, when

MAX_EVIDENCE = 20  # lines shown per finding
MAX_PATHS = 12
_CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src 'none'; "
        "base-uri 'none'; form-action 'none'")
_GOOD, _BAD = ("succeeded",), ("failed",)
# exit 0, but gpufix found a problem: shown with its root cause like a failed run, marked apart
_WITH_FINDINGS = "succeeded_with_findings"
_STATUSES = ("failed", "succeeded", _WITH_FINDINGS, "running", "unknown")


def _status_class(status: Any) -> str:
    return "bad" if status in _BAD else "good" if status in _GOOD else "other"


def _status_label(status: Any) -> str:
    """A status for people: `succeeded_with_findings` -> `succeeded with findings`."""
    return str(status or "unknown").replace("_", " ")


def _badge(status: Any) -> str:
    return f'<span class="badge {_status_class(status)}">{esc(_status_label(status), 40)}</span>'


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


class _Anchors:
    """Run id -> fragment id, for links from the summary to the run sections."""

    def __init__(self, runs: list[dict[str, Any]]) -> None:
        self.sections = [slug(run.get("id"), index) for index, run in enumerate(runs, 1)]  # unique even for equal ids
        self.ids: dict[str, str] = {}
        for run, anchor in zip(runs, self.sections):
            self.ids.setdefault(str(run.get("id")), anchor)

    def link(self, run_id: Any, limit: int = 120) -> str:
        anchor = self.ids.get(str(run_id))
        text = f"<code>{esc(run_id, limit)}</code>"
        return f'<a href="#{attr(anchor)}">{text}</a>' if anchor else text


def render_postmortem(doc: dict[str, Any], telemetry: dict[str, list[dict[str, Any]]]) -> str:
    """The whole report as one HTML document (a str); `telemetry` maps run id to JSONL objects."""
    runs = [run for run in _list(doc.get("runs")) if isinstance(run, dict)]
    summary = _dict(doc.get("summary"))
    anchors = _Anchors(runs)
    failed = sum(1 for run in runs if run.get("status") in _BAD)
    title = f"gpufix postmortem: {failed} of {len(runs)} run{'s' if len(runs) != 1 else ''} failed"
    with_findings = sum(1 for run in runs if run.get("status") == _WITH_FINDINGS)
    if with_findings:
        title += f", {with_findings} succeeded with findings"
    body = [f"<header><h1>{esc(title)}</h1>",
            f'<p class="meta">{_span_of(runs)}</p></header>',
            _summary_html(runs, summary, anchors)]
    for index, (run, anchor) in enumerate(zip(runs, anchors.sections), 1):
        records = (telemetry or {}).get(str(run.get("id"))) or []
        body.append(_run_html(run, anchor, index, records))
    notes = _list(doc.get("notes"))
    if notes:
        body.append('<section id="notes"><h2>Notes</h2><ul>' + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul></section>")
    body.append(f'<footer>Written by gpufix {esc(__version__)} (<code>gpufix postmortem --format html</code>). '
                "This page loads nothing from the network and runs no script.</footer>")
    return ("<!DOCTYPE html>\n"
            '<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            '<meta name="color-scheme" content="light dark">'
            f"<title>{esc(title)}</title><style>{CSS}</style></head>\n"
            "<body><main>\n" + "\n".join(body) + "\n</main></body></html>\n")


def _span_of(runs: list[dict[str, Any]]) -> str:
    starts = sorted(e for e in (to_epoch(run.get("started")) for run in runs) if e is not None)
    if not starts:
        return f"{len(runs)} run{'s' if len(runs) != 1 else ''}."
    if len(starts) == 1:
        return f"Started {when(starts[0])}."
    return f"Runs started between {when(starts[0], seconds=False)} and {when(starts[-1], seconds=False)}."


# --- summary ---------------------------------------------------------------------------------

def _summary_html(runs: list[dict[str, Any]], summary: dict[str, Any], anchors: _Anchors) -> str:
    out = ['<section id="summary"><h2>Summary</h2>', '<ul class="counts" aria-label="Run counts">']
    counts = [("runs", summary.get("runs", len(runs)), "")]
    for status in _STATUSES:
        value = summary.get(status, sum(1 for run in runs if run.get("status") == status))
        if value or status in ("failed", "succeeded"):
            counts.append((_status_label(status), value, _status_class(status)))
    out += [f'<li class="{css}"><strong>{esc(value, 20)}</strong> {esc(name)}</li>' for name, value, css in counts]
    out.append("</ul>")
    if not runs:
        out.append('<p class="none">No run was found.</p></section>')
        return "".join(out)
    out.append('<table class="runs"><caption>Runs in start order; each links to its section.</caption><thead><tr>'
               '<th scope="col">Run</th><th scope="col">Started</th><th scope="col">Status</th>'
               '<th scope="col">Root cause</th><th scope="col">First failing rank</th></tr></thead><tbody>')
    for run in runs:
        root = _dict(run.get("root_cause"))
        cause = (f"<code>{esc(root.get('code'), 40)}</code> {esc(root.get('title'), 200)}" if root
                 else '<span class="none">none found</span>' if run.get("status") in _BAD else "—")
        out.append(f'<tr><th scope="row">{anchors.link(run.get("id"))}</th><td>{when(run.get("started"), seconds=False)}</td>'
                   f'<td>{_badge(run.get("status"))}</td><td>{cause}</td><td>{_first_failing_short(run)}</td></tr>')
    out.append("</tbody></table>")
    out.append(_by_code_html(runs, summary, anchors))
    out.append(_new_recurring_html(summary, runs, anchors))
    out.append(_environment_diff_html(summary, anchors))
    out.append("</section>")
    return "\n".join(out)


def _first_failing_short(run: dict[str, Any]) -> str:
    """The summary table's cell: the rank, else the node and GPU of a hardware fault."""
    if run.get("first_failing_rank") is not None:
        return esc(run["first_failing_rank"], 20)
    first = _dict(run.get("first_failing"))
    where = [f"node {esc(first['node'], 60)}" if first.get("node") else "", f"GPU {esc(first['gpu'], 60)}" if first.get("gpu") else ""]
    return ", ".join(w for w in where if w) or "—"


def _by_code_html(runs: list[dict[str, Any]], summary: dict[str, Any], anchors: _Anchors) -> str:
    groups = dict(_dict(summary.get("by_code")))
    if not groups:  # a document without the summary's grouping: group the root causes here
        for run in runs:
            root = _dict(run.get("root_cause"))
            if root.get("code") and run.get("status") in _BAD:
                group = groups.setdefault(root["code"], {"title": root.get("title"), "category": root.get("category"), "runs": []})
                group["runs"].append(run.get("id"))
    if not groups:
        return '<h3>Failures by root cause</h3><p class="none">No failed run has a known root cause.</p>'
    history = _dict(summary.get("history"))
    out = ['<h3>Failures by root cause</h3><table class="by-code"><thead><tr><th scope="col">Rule</th>'
           '<th scope="col">Category</th><th scope="col">Runs</th><th scope="col">Since</th></tr></thead><tbody>']
    for code, group in sorted(groups.items(), key=lambda item: (-len(_list(_dict(item[1]).get("runs"))), str(item[0]))):
        group = _dict(group)
        ids = _list(group.get("runs"))
        seen = _dict(history.get(code))
        since = (f"{when(seen.get('first_seen'), seconds=False)} ({esc(seen.get('runs'), 20)} runs in the index)"
                 if seen.get("first_seen") else "—")
        out.append(f'<tr><th scope="row"><code>{esc(code, 40)}</code> {esc(group.get("title"), 200)}</th>'
                   f'<td>{esc(group.get("category") or "—", 60)}</td>'
                   f'<td>{len(ids)}: {", ".join(anchors.link(i, 60) for i in ids[:50])}{" …" if len(ids) > 50 else ""}</td>'
                   f"<td>{since}</td></tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _titles(runs: list[dict[str, Any]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for run in runs:
        for finding in [run.get("root_cause")] + _list(run.get("findings")):
            finding = _dict(finding)
            if finding.get("code") and finding.get("title"):
                out.setdefault(str(finding["code"]), str(finding["title"]))
    return out


def _new_recurring_html(summary: dict[str, Any], runs: list[dict[str, Any]], anchors: _Anchors) -> str:
    if "new" not in summary and "recurring" not in summary:
        return ""
    titles = _titles(runs)
    last_good = summary.get("last_good")
    out = ["<h3>New and recurring failures</h3>",
           f'<p>Relative to the last good run, {anchors.link(last_good)}.</p>' if last_good
           else "<p>No run succeeded before the latest failure: every failure counts as new.</p>"]
    for key, label in (("new", "New since the last good run"), ("recurring", "Recurring (the root cause of more than one failed run)")):
        codes = [c for c in _list(summary.get(key))]
        items = "".join(f"<li><code>{esc(c, 40)}</code> {esc(titles.get(str(c), ''), 200)}</li>" for c in codes)
        out.append(f"<h4>{label}</h4>" + (f"<ul>{items}</ul>" if codes else '<p class="none">none</p>'))
    return "".join(out)


def _environment_diff_html(summary: dict[str, Any], anchors: _Anchors) -> str:
    good, bad = summary.get("last_good"), summary.get("first_bad")
    if not good or not bad or "environment_diff" not in summary:
        return ""
    rows = [row for row in _list(summary.get("environment_diff")) if isinstance(row, dict)]
    out = ["<h3>Environment: last good vs first failed run</h3>"]
    if not rows:
        out.append(f'<p class="none">No difference found between {anchors.link(good)} and {anchors.link(bad)} '
                   "in what the records and logs tell (driver, CUDA, torch, NCCL, GPU, host).</p>")
        return "".join(out)
    out.append(f'<table class="diff"><thead><tr><th scope="col">Setting</th><th scope="col">Last good: {anchors.link(good, 60)}</th>'
               f'<th scope="col">First failed: {anchors.link(bad, 60)}</th></tr></thead><tbody>')
    for row in rows:
        out.append(f'<tr><th scope="row">{esc(row.get("key"), 80)}</th><td>{esc(row.get("last_good") or "—", 300)}</td>'
                   f'<td class="changed">{esc(row.get("first_bad") or "—", 300)}</td></tr>')
    out.append("</tbody></table>")
    return "".join(out)


# --- one run ---------------------------------------------------------------------------------

def _run_html(run: dict[str, Any], anchor: str, index: int, records: list[dict[str, Any]]) -> str:
    status = run.get("status")
    out = [f'<section class="run" id="{attr(anchor)}" aria-labelledby="{attr(anchor)}-h">',
           f'<div class="run-head"><h2 id="{attr(anchor)}-h">Run {index}: <code>{esc(run.get("id"), 200)}</code> {_badge(status)}</h2>'
           '<a class="top" href="#summary">back to summary</a></div>',
           _facts_html(run)]
    root = _dict(run.get("root_cause"))
    findings = [f for f in _list(run.get("findings")) if isinstance(f, dict)]
    if root:
        out.append(_finding_html(root, f"Root cause: {root.get('title') or root.get('code')}", css="finding root"))
        others = [f for f in findings if not (f.get("code") == root.get("code") and f.get("consequence_of") is None)]
    else:
        others = findings
        out.append('<p class="none">' + ("No known failure pattern was found in its output." if status in _BAD
                                         else "No root cause: gpufix found no failure in this run.") + "</p>")
    consequences = [f for f in others if f.get("consequence_of")]
    also = [f for f in others if not f.get("consequence_of")]
    if consequences:
        out.append("<h3>Consequences</h3><p class=\"meta\">Failures caused by the root cause; fixing it removes them.</p>")
        out.append('<ul class="compact">' + "".join(_compact_html(f) for f in consequences) + "</ul>")
    if also:
        out.append("<h3>Also found</h3>" + '<ul class="compact">' + "".join(_compact_html(f) for f in also) + "</ul>")
    failed_at = to_epoch(run.get("failed_at"))
    plots = telemetry_html(records, failed_at, anchor, to_epoch(run.get("started")))
    if not records and _dict(run.get("telemetry")).get("gpus"):
        plots = _telemetry_window_html(_dict(run.get("telemetry")))
    if status in _GOOD and records:  # a healthy run's plots are there to compare with, not to read first
        out.append(f'<details class="telemetry"><summary><h3>Telemetry</h3> (click to show the plots)</summary>{plots}</details>')
    else:
        out.append(f"<h3>Telemetry</h3>{plots}")
    environment = _dict(run.get("environment"))
    if environment:
        out.append("<h3>Environment</h3><dl class=\"facts\">" + "".join(
            f"<dt>{esc(k, 80)}</dt><dd>{_value_html(v)}</dd>" for k, v in environment.items() if v not in (None, "", {}, [])) + "</dl>")
    notes = _list(run.get("notes"))
    if notes:
        out.append("<h3>Notes</h3><ul>" + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>")
    out.append("</section>")
    return "\n".join(out)


def _value_html(value: Any) -> str:
    """An environment value: nested mappings (packages, variables) as `name value` pairs."""
    if isinstance(value, dict):
        pairs = [f"<code>{esc(k, 100)}</code> {esc(v, 300)}" for k, v in list(value.items())[:200]]
        return " · ".join(pairs) + (f" · … and {len(value) - 200} more" if len(value) > 200 else "")
    if isinstance(value, list):
        return ", ".join(esc(v, 300) for v in value[:200])
    return esc(value, 300)


def _telemetry_window_html(window: dict[str, Any]) -> str:
    """Without the samples, the document's per-GPU ranges in the minutes before the failure: a
    column for each plot's main line (gpufix.postmortem.telemetry.METRICS summarises them)."""
    names = tuple((p.lines[0].field, f"{p.lines[0].label} ({p.unit})") for p in PANELS)
    rows = []
    for gpu, metrics in _dict(window.get("gpus")).items():
        cells = []
        for key, _ in names:
            value = _dict(_dict(metrics).get(key))
            cells.append(f"<td>{esc(value.get('min'), 20)} – {esc(value.get('max'), 20)}</td>" if value else "<td>—</td>")
        rows.append(f'<tr><th scope="row">GPU {esc(gpu, 20)}</th>{"".join(cells)}</tr>')
    span = f"from {when(window.get('from'))} to {when(window.get('to'))}" if window.get("from") else "before the failure"
    return (f'<p class="meta">No samples to plot; the ranges (minimum – maximum) {span}:</p>'
            '<table class="window"><thead><tr><th scope="col">GPU</th>'
            + "".join(f'<th scope="col">{label}</th>' for _, label in names)
            + f"</tr></thead><tbody>{''.join(rows)}</tbody></table>")


def _facts_html(run: dict[str, Any]) -> str:
    facts: list[tuple[str, str]] = [("Status", _badge(run.get("status")))]
    if run.get("exit_status") is not None:
        facts[0] = ("Status", f"{_badge(run.get('status'))} exit status {esc(run.get('exit_status'), 20)}")
    facts.append(("Started", when(run.get("started"))))
    if run.get("ended"):
        took = f" ({duration(float(run['duration_s']))})" if isinstance(run.get("duration_s"), (int, float)) else ""
        facts.append(("Ended", when(run.get("ended")) + took))
    if run.get("failed_at"):
        label = "Problem at" if run.get("status") == _WITH_FINDINGS else "Failed at"
        basis = f' <span class="meta">from the {esc(run.get("failed_at_basis"), 60)}</span>' if run.get("failed_at_basis") else ""
        failed, started = to_epoch(run.get("failed_at")), to_epoch(run.get("started"))
        into = f" ({duration(failed - started)} into the run)" if failed is not None and started is not None and failed >= started else ""
        facts.append((label, when(run.get("failed_at")) + into + basis))
    first = _dict(run.get("first_failing"))
    if run.get("first_failing_rank") is not None or first.get("ranks") or first.get("node") or first.get("gpu"):
        text = ranks_text(first.get("ranks") or ([run["first_failing_rank"]] if run.get("first_failing_rank") is not None else []))
        where = [f"node {esc(first['node'], 100)}" if first.get("node") else "", f"GPU {esc(first['gpu'], 100)}" if first.get("gpu") else ""]
        extra = ", ".join(w for w in where if w)
        basis = f' <span class="meta">(from the {esc(first.get("basis"), 60)})</span>' if first.get("basis") else ""
        value = text if text != "—" else ""
        value = (f"{value} on {extra}" if value else extra) if extra else value or "—"
        facts.append(("First failing rank", value + basis))
    if run.get("affected_ranks"):
        facts.append(("Affected ranks", ranks_text(run.get("affected_ranks")) + ' <span class="meta">(as a consequence)</span>'))
    reported = run.get("torchrun_reported_rank")
    if reported is not None and reported != run.get("first_failing_rank"):
        facts.append(("torchrun reported", f"rank {esc(reported, 20)} "
                      '<span class="meta">(its “first observed failure” is only the earliest timestamp)</span>'))
    paths = _list(run.get("paths"))
    if paths:
        shown = "".join(f"<li><code>{esc(p, 400)}</code></li>" for p in paths[:MAX_PATHS])
        more = f"<li>… and {len(paths) - MAX_PATHS} more</li>" if len(paths) > MAX_PATHS else ""
        facts.append(("Files" if len(paths) != 1 else "File", f'<ul class="paths">{shown}{more}</ul>'))
    return '<dl class="facts">' + "".join(f"<dt>{name}</dt><dd>{value}</dd>" for name, value in facts) + "</dl>"


def _tags(finding: dict[str, Any]) -> str:
    tags = [f"<code>{esc(finding.get('code'), 40)}</code> {esc(finding.get('name'), 80)}"]
    tags += [f"{key} {esc(finding[key], 40)}" for key in ("category", "severity", "confidence") if finding.get(key)]
    if finding.get("gpu_related") is False:
        tags.append("not a GPU problem")
    return " · ".join(tags)


def _evidence_html(finding: dict[str, Any]) -> str:
    evidence = [e for e in _list(finding.get("evidence")) if isinstance(e, dict)]
    if not evidence:
        return ""
    count = finding.get("evidence_count") if isinstance(finding.get("evidence_count"), int) else len(evidence)
    ranks = _list(finding.get("ranks"))
    on = f", rank{'s' if len(ranks) != 1 else ''} {ranks_text(ranks)}" if ranks else ""
    head = f"Evidence ({count} line{'s' if count != 1 else ''}{on})"
    shown = evidence[:MAX_EVIDENCE]
    with_rank = any(ref.get("rank") is not None for ref in shown)
    rows = []
    for ref in shown:
        rank = ref.get("rank")
        rank_cell = f'<td>{esc(rank, 20) if rank is not None else ""}</td>' if with_rank else ""
        rows.append(f'<tr><td class="where"><code>{esc(ref.get("source"), 300)}</code>:{esc(ref.get("line"), 20)}</td>'
                    f'{rank_cell}<td class="text">{esc(ref.get("text"), MAX_LINE)}</td></tr>')
    more = count - len(shown)
    return (f"<h4>{head}</h4>"
            '<table class="evidence"><thead><tr><th scope="col">File:line</th>'
            + ('<th scope="col">Rank</th>' if with_rank else "")
            + f'<th scope="col">Line</th></tr></thead><tbody>{"".join(rows)}</tbody></table>'
            + (f'<p class="meta">… and {more} more line{"s" if more != 1 else ""}.</p>' if more > 0 else ""))


def _fixes_html(finding: dict[str, Any]) -> str:
    fixes = [f for f in _list(finding.get("fixes")) if isinstance(f, dict)]
    if not fixes:
        return ""
    items = []
    for fix in fixes:
        item = f"<li><strong>{esc(fix.get('title'), 300)}</strong> <span class=\"kind\">{esc(fix.get('kind'), 20)}</span>"
        if fix.get("detail"):
            item += f"<p>{esc(fix['detail'])}</p>"
        if fix.get("snippet"):
            item += f"<pre><code>{esc(fix['snippet'])}</code></pre>"
        items.append(item + "</li>")
    return f'<h4>Fixes, in the order to try them</h4><ol class="fixes">{"".join(items)}</ol>'


def _references_html(finding: dict[str, Any]) -> str:
    refs = [str(r) for r in _list(finding.get("references"))][:10]
    if not refs:
        return ""
    items = [f'<li><a href="{attr(r, 500)}" rel="noopener noreferrer">{esc(r, 200)}</a></li>'
             if r.startswith(("https://", "http://")) else f"<li>{esc(r, 300)}</li>" for r in refs]
    return f"<h4>References</h4><ul>{''.join(items)}</ul>"


def _finding_html(finding: dict[str, Any], heading: str, css: str) -> str:
    out = [f'<div class="{css}"><h3>{esc(heading, 300)}</h3><p class="tags">{_tags(finding)}</p>']
    if finding.get("message"):
        out.append(f'<p class="message">{esc(finding["message"])}</p>')
    for para in str(finding.get("explanation") or "").split("\n\n")[:8]:
        if para.strip():
            out.append(f"<p>{esc(para.strip())}</p>")
    out += [_evidence_html(finding), _fixes_html(finding)]
    experiments = [_dict(e).get("name") for e in _list(finding.get("experiments")) if _dict(e).get("name")]
    if experiments:
        out.append("<p>Confirm with: " + ", ".join(f"<code>{esc(n, 80)}</code>" for n in experiments) + "</p>")
    out += [_references_html(finding), "</div>"]
    return "".join(out)


def _compact_html(finding: dict[str, Any]) -> str:
    ranks = _list(finding.get("ranks"))
    parts = [f"<strong>{esc(finding.get('title') or finding.get('code'), 300)}</strong> <span class=\"tags\">{_tags(finding)}</span>"]
    if finding.get("consequence_of"):
        parts.append(f'<br><span class="meta">consequence of <code>{esc(finding["consequence_of"], 40)}</code>'
                     + (f" on ranks {ranks_text(ranks)}" if ranks else "") + "</span>")
    elif ranks:
        parts.append(f'<br><span class="meta">ranks {ranks_text(ranks)}</span>')
    if finding.get("message"):
        parts.append(f"<br>{esc(finding['message'], 1000)}")
    evidence = [e for e in _list(finding.get("evidence")) if isinstance(e, dict)][:1]
    for ref in evidence:
        parts.append(f'<br><span class="meta"><code>{esc(ref.get("source"), 300)}</code>:{esc(ref.get("line"), 20)}</span> '
                     f'<code>{esc(ref.get("text"), 300)}</code>')
    return f"<li>{''.join(parts)}</li>"

"""`gpufix confirm` reports: the plan, and the verdict of each experiment with its measurements.

All three formats draw from `ConfirmReport.to_dict()` (the JSON schema, docs/confirm.md), so a
field shown to people is the field machines read.
"""

from __future__ import annotations

import json
from typing import Any

_MARK = {"confirmed": "CONFIRMED", "refuted": "REFUTED", "inconclusive": "INCONCLUSIVE"}
_SKIP_KEYS = ("trials", "results", "checks", "evidence", "devices")  # long lists: summarised, not dumped


def render_plan(data: dict[str, Any]) -> str:
    """The experiments about to run, their cost and what they change; and those that cannot."""
    lines = [f"gpufix confirm: {data['record']}"]
    planned = data.get("planned") or []
    if planned:
        total = sum(p["estimate_s"] for p in planned)
        lines.append(f"Experiments to run (about {_duration(total)} in all, budget {_duration(data['summary']['budget_s'])}):")
        for p in planned:
            changes = ", ".join(f"{k}={v}" for k, v in (p.get("changes") or {}).items())
            lines.append(f"  {p['name']:<28} for {p['for']:<7} ~{_duration(p['estimate_s']):>6}"
                         f"{'  GPU' if p['uses_gpu'] else '     '}  {p['what']}" + (f" [{changes}]" if changes else ""))
    for s in data.get("skipped") or []:
        lines.append(f"  {s['name']:<28} for {s['for']:<7} not run: {s['reason']}")
    if not planned:
        lines.append("Nothing to run: " + ("the findings call for no experiment this gpufix can run."
                                            if data.get("skipped") else "the record has no finding that names an experiment."))
    return "\n".join(lines) + "\n"


def render_text(data: dict[str, Any]) -> str:
    lines = [render_plan(data).rstrip("\n"), ""]
    for r in data.get("experiments") or []:
        lines.append(f"{_MARK.get(r['verdict'], r['verdict'])}  {r['name']} for {r['for']}  ({_duration(r['duration_s'])})")
        lines.append(f"  {r['reason']}")
        lines += [f"  {line}" for line in _measurement_lines(r.get("measurements") or {})]
        rec = r.get("recommendation")
        if rec:
            state = {True: "verified", False: "did not hold when verified", None: "not verified"}[r.get("verified")]
            change = json.dumps(rec.get("change") or {}, sort_keys=True)
            lines.append(f"  Fix ({state}): {rec['title']}" + (f"  {change}" if change != "{}" else ""))
        lines.append("")
    s = data["summary"]
    if s["ran"]:
        lines.append(f"Summary: {s['confirmed']} confirmed, {s['refuted']} refuted, {s['inconclusive']} inconclusive, "
                     f"in {_duration(s['duration_s'])}. Results: {data['record']}/experiments/results.json")
    return "\n".join(lines).rstrip("\n") + "\n"


def render_markdown(data: dict[str, Any]) -> str:
    lines = [f"## gpufix confirm: `{data['record']}`", ""]
    if data.get("experiments"):
        lines += ["| experiment | for | verdict | reason | fix | verified | time |", "|---|---|---|---|---|---|---|"]
        for r in data["experiments"]:
            rec = r.get("recommendation") or {}
            lines.append(f"| {r['name']} | {r['for']} | **{r['verdict']}** | {_cell(r['reason'])} | "
                         f"{_cell(rec.get('title', ''))} | {_cell(str(r.get('verified')).lower())} | {_duration(r['duration_s'])} |")
        lines.append("")
        for r in data["experiments"]:
            rows = _measurement_lines(r.get("measurements") or {})
            if rows:
                lines += [f"**{r['name']}**", "", *[f"- {_cell(row)}" for row in rows], ""]
    for s in data.get("skipped") or []:
        lines.append(f"- not run: `{s['name']}` for {s['for']}: {_cell(s['reason'])}")
    return "\n".join(lines).rstrip("\n") + "\n"


def render_json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2) + "\n"


def _measurement_lines(m: dict[str, Any]) -> list[str]:
    out = []
    simple = [f"{k} {_value(v)}" for k, v in m.items() if k not in _SKIP_KEYS and v is not None and not isinstance(v, (dict, list))]
    if simple:
        out.append("; ".join(simple))
    for key in ("best",):
        if isinstance(m.get(key), dict):
            out.append(f"{key}: " + ", ".join(f"{k}={v}" for k, v in m[key].items()))
    for row in m.get("trials") or []:
        if isinstance(row, dict):
            head = row.get("label") if "setting" not in row else ", ".join(f"{k}={v}" for k, v in row["setting"].items())
            if "batch_size" in row:
                head = f"batch size {row['batch_size']}"
            parts = [str(row.get("outcome"))]
            if row.get("step_time_ms") is not None:
                parts.append(f"{row['step_time_ms']} ms/step")
            if row.get("peak_memory_mib") is not None:
                parts.append(f"peak {row['peak_memory_mib']} MiB {row.get('memory_kind') or ''}".rstrip())
            out.append(f"  {head}: {', '.join(parts)}")
    for row in m.get("results") or []:
        if isinstance(row, dict) and "op" in row:
            out.append(f"  {row['op']} {row['bytes']} B: {row['time_us']} us, bus {row['busbw_gbps']} GB/s"
                       + ("" if row.get("correct") else ", WRONG RESULT"))
    return out


def _value(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")

"""`gpufix compare`: run records side by side, with each number's ratio to the first record.

Median step time comes from what the record's probe measured (`probe/`, docs/probe.md) when it
has one, else from progress lines in output.log (tqdm `it/s` / `s/it`, HF
Trainer `train_steps_per_second`, `step time` / `time/step` logs), else it is unknown. The
telemetry rows (the catalogue's, gpufix.signals: memory, utilisation, temperature, power) come
from `telemetry.jsonl`; exit status, duration and findings from `result.json`.
"""

from __future__ import annotations

import os
import re
import statistics
from dataclasses import dataclass
from typing import Any

from gpufix.errors import InputError
from gpufix.postmortem.telemetry import read_samples
from gpufix.record.reader import Record, is_record
from gpufix.signals import Signal, shown

LOG_READ_BYTES = 64 << 20  # progress lines are everywhere; the first 64 MiB are plenty
_RATES = (
    (re.compile(rb"(\d+(?:\.\d+)?)\s*it/s\b"), "tqdm it/s", True),
    (re.compile(rb"(\d+(?:\.\d+)?)\s*s/it\b"), "tqdm s/it", False),
    (re.compile(rb"'train_steps_per_second':\s*(\d+(?:\.\d+)?)"), "HF train_steps_per_second", True),
    (re.compile(rb"(?:step[ _]time|time/step|time_per_step)[\s=:]+(\d+(?:\.\d+)?)\s*(ms|s)\b", re.I), "step time log", False),
)
# The telemetry rows, from the catalogue (gpufix.signals: `compare=` is a row's place). Each is
# summed up over the run as its range, under its field's name, but for two: (key, label, summary).
TELEMETRY_ROWS = shown("compare")
_SUMMARIES = {"gpu.memory_used_mib": ("peak_memory_mib", "peak GPU memory", "peak"),
              "gpu.power_w": ("power_w", "power mean / max", "mean_max")}
_RATIO_ORDER = ("step_time_s", "peak_memory_mib", "duration_s", "power_w")  # as the JSON has had them


@dataclass(frozen=True)
class RecordStats:
    """One record's numbers; None where the record does not say."""

    id: str
    path: str
    exit_status: int | None
    duration_s: float | None
    step_time_s: float | None
    step_time_basis: str | None
    telemetry: dict[str, Any]  # key (see _how) -> the row's summary: peak_memory_mib, util_gpu_pct, ...
    findings: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "path": self.path, "exit_status": self.exit_status, "duration_s": self.duration_s,
                "step_time_s": self.step_time_s, "step_time_basis": self.step_time_basis,
                **self.telemetry, "findings": list(self.findings)}


def _how(signal: Signal) -> tuple[str, str, str]:
    """(key, row label, summary) of a telemetry row. Summaries: `range` (min and max), `peak` (the
    maximum, with its ratio to the first record's) and `mean_max` (the ratio is the means')."""
    return _SUMMARIES.get(signal.name, (signal.field, signal.title, "range"))


def _summarise(kind: str, values: list[float]) -> Any:
    if not values:
        return None
    if kind == "peak":
        return max(values)
    if kind == "mean_max":
        return {"mean": round(statistics.fmean(values), 1), "max": max(values)}
    return {"min": min(values), "max": max(values)}


def _amount(kind: str, summary: Any) -> float | None:
    """The number a summary's ratio is taken of (None: the summary has none)."""
    if kind == "peak":
        return summary
    return (summary or {}).get("mean") if kind == "mean_max" else None


def _probe_step_time(record: Record) -> float | None:
    """Median step time the in-process probe measured (record/probe, docs/probe.md)."""
    if not record.has_probe:
        return None
    from gpufix.probe.read import read_probe_series

    steps = [s.value for s in read_probe_series(record.probe_dir).get("probe.step_time_s", [])]
    return statistics.median(steps) if steps else None


def _log_step_time(record: Record) -> tuple[float | None, str | None]:
    try:
        with open(record.output_log, "rb") as f:
            data = f.read(LOG_READ_BYTES)
    except OSError:
        return None, None
    for regex, basis, is_rate in _RATES:
        values = []
        for m in regex.finditer(data):
            value = float(m.group(1))
            if len(m.groups()) > 1 and m.group(2) == b"ms":
                value /= 1000
            if value > 0:
                values.append(1 / value if is_rate else value)
        if values:
            return statistics.median(values), basis
    return None, None


def record_stats(record: str) -> RecordStats:
    """Read one record's numbers; raises InputError when `record` is not a run record."""
    if not is_record(record):
        raise InputError(f"{record} is not a run record (no meta.json and output.log)",
                         hint="pass folders written by `gpufix run`, e.g. gpufix compare gpufix-runs/*")
    opened = Record(record)
    result = opened.result
    step, basis = _probe_step_time(opened), "probe"
    if step is None:
        step, basis = _log_step_time(opened)
    samples = read_samples(record)

    def values(key: str) -> list[float]:
        return [float(s[key]) for s in samples if isinstance(s.get(key), (int, float)) and not isinstance(s.get(key), bool)]

    telemetry: dict[str, Any] = {}
    for signal in TELEMETRY_ROWS:
        key, _label, kind = _how(signal)
        telemetry[key] = _summarise(kind, values(signal.field))
    codes = [f.get("code") for f in result.get("findings") or [] if isinstance(f, dict) and f.get("code")]
    exit_status = result.get("exit_status")
    duration = result.get("duration_s")
    return RecordStats(
        id=os.path.basename(os.path.normpath(record)), path=record,
        exit_status=exit_status if isinstance(exit_status, int) else None,
        duration_s=float(duration) if isinstance(duration, (int, float)) else None,
        step_time_s=step, step_time_basis=basis if step is not None else None,
        telemetry=telemetry, findings=codes,
    )


def _ratio(value: float | None, base: float | None) -> float | None:
    if value is None or not base:
        return None
    return round(value / base, 3)


def compare(records: list[str]) -> dict[str, Any]:
    """The comparison document: each record's numbers and their ratios to the first record's."""
    if not records:
        raise InputError("no RECORD given", hint="gpufix compare gpufix-runs/RUN_A gpufix-runs/RUN_B")
    stats = [record_stats(r) for r in records]
    base = stats[0]
    out = []
    for s in stats:
        entry = s.to_dict()
        ratios = {"step_time_s": _ratio(s.step_time_s, base.step_time_s),
                  "duration_s": _ratio(s.duration_s, base.duration_s)}
        for signal in TELEMETRY_ROWS:
            key, _label, kind = _how(signal)
            if kind != "range":
                ratios[key] = _ratio(_amount(kind, s.telemetry[key]), _amount(kind, base.telemetry[key]))
        order = {key: i for i, key in enumerate(_RATIO_ORDER)}
        entry["ratios"] = dict(sorted(ratios.items(), key=lambda item: order.get(item[0], len(order))))
        out.append(entry)
    return {"records": out}


def _fmt(value: float | None, unit: str = "", digits: int = 3) -> str:
    if value is None:
        return "n/a"
    return f"{value:.{digits}g}{unit}" if abs(value) < 1000 else f"{value:,.0f}{unit}"


def _rng(r: dict[str, float] | None, unit: str) -> str:
    if not r:
        return "n/a"
    return f"{r['min']:g}{unit}" if r["min"] == r["max"] else f"{r['min']:g}–{r['max']:g}{unit}"


def table_rows(doc: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows (one per metric, one column per record) for the terminal and markdown tables."""
    recs = doc["records"]
    header = ["", *[r["id"] for r in recs]]

    def with_ratio(r: dict[str, Any], text: str, key: str) -> str:
        ratio = r["ratios"].get(key)
        return text if ratio is None or r is recs[0] else f"{text} (×{ratio:g})"

    def cell(r: dict[str, Any], key: str, kind: str, unit: str) -> str:
        if kind == "range":
            return _rng(r[key], unit)
        if kind == "peak":
            return with_ratio(r, _fmt(r[key], unit, 6), key)
        return with_ratio(r, f"{r[key]['mean']:g} / {r[key]['max']:g}{unit}", key) if r[key] else "n/a"

    rows = [
        ["exit status", *[str(r["exit_status"]) if r["exit_status"] is not None else "n/a" for r in recs]],
        ["duration", *[with_ratio(r, _fmt(r["duration_s"], " s", 4), "duration_s") for r in recs]],
        ["median step time", *[with_ratio(r, _fmt(r["step_time_s"], " s"), "step_time_s") for r in recs]],
    ]
    for signal in TELEMETRY_ROWS:
        key, label, kind = _how(signal)
        rows.append([label, *[cell(r, key, kind, f" {signal.unit}") for r in recs]])
    rows.append(["findings", *[", ".join(r["findings"]) or "-" for r in recs]])
    return header, rows


def render_text(doc: dict[str, Any]) -> str:
    header, rows = table_rows(doc)
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    return "\n".join(lines) + "\n" + "(ratios ×N are to the first record)\n"


def render_markdown(doc: dict[str, Any]) -> str:
    header, rows = table_rows(doc)
    out = ["| " + " | ".join(f"`{h}`" if h else "" for h in header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(out) + "\n\nRatios (×N) are to the first record.\n"

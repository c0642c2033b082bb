"""Conditions over measured series: telemetry (per GPU) and probe measurements (per rank).

A rule leaf such as

    series: gpu.util_gpu_pct     # which series
    agg: mean                    # how a window is summarised
    window: 60s                  # sliding window (or `all`: the whole run, judged once)
    op: '<'                      # compared with `value`
    value: 30
    for: 120s                    # must hold continuously this long, so a blip does not fire
    per: gpu                     # judged per GPU (or rank); any group may match
    min_samples: 30              # fewer samples: "not evaluated", never "healthy"
    as: util                     # field name for the value in messages and guards
    compare: others              # optional: the group's value over the median of the other groups

is evaluated here, on plain lists of samples. No I/O, no rules machinery: a pure function.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

TYPE_CHECKING = False  # typing costs start-up time; annotations are strings (PEP 563)
if TYPE_CHECKING:
    from typing import Any, NamedTuple
else:
    from gpufix.tuples import NamedTuple

AGGREGATES = ("mean", "min", "max", "median", "p90", "p10", "first", "last", "delta", "late_delta", "slope", "spread",
              "count", "sum")
OPERATORS = ("<", "<=", ">", ">=", "==", "!=")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*$")


class Sample(NamedTuple):
    """One measurement: time (unix seconds), value, the GPU/rank it belongs to, where it was read."""

    t: float
    value: float
    group: str | None = None
    source: str = ""
    line: int = 0


class SeriesCondition(NamedTuple):
    series: str
    agg: str
    op: str
    value: float
    window_s: float | None  # None: the whole run
    for_s: float = 0.0
    per: str = "none"
    min_samples: int = 1
    name: str = "value"
    compare: str | None = None  # "others": ratio to the median of the other groups


class SeriesResult(NamedTuple):
    """`status` is matched, not_matched or not_evaluated (too few samples to judge)."""

    status: str
    fields: dict[str, str]
    evidence: list[tuple[str, int, str]]  # (source, line, text) quoting the measurement
    reason: str = ""


# The series a rule may name, with their natural grouping, are the catalogue's (gpufix.signals:
# where each is read from, its unit, its displays). Telemetry comes from a run record's
# telemetry.jsonl (gpufix.telemetry), `output.*` from its output index, `probe.*` from the
# in-process probe. A rule naming anything else is rejected by `gpufix rules check`. Made on
# first use (__getattr__): `gpufix explain` judges rules without them, and its start-up is budgeted.
SERIES: dict[str, str]  # series name -> grouping
GROUPINGS: tuple[str, ...]  # a rule's `per:`


def __getattr__(name: str) -> Any:
    if name in ("SERIES", "GROUPINGS"):
        from gpufix import signals

        globals().update(SERIES={s.name: s.per for s in signals.SIGNALS}, GROUPINGS=signals.GROUPINGS)
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


SERIES_KEYS = {"series": True, "agg": True, "op": True, "value": True, "window": True, "for": False,
               "per": False, "min_samples": False, "as": False, "compare": False}


def condition_from_dict(item: dict[str, Any]) -> SeriesCondition:
    """Build a condition from a validated rule leaf (see schema.py for the checks)."""
    return SeriesCondition(
        series=item["series"], agg=item["agg"], op=str(item["op"]), value=float(item["value"]),
        window_s=parse_duration(item["window"]), for_s=parse_duration(item.get("for", 0)) or 0.0,
        per=item.get("per", "none"), min_samples=int(item.get("min_samples", 1)),
        name=item.get("as", "value"), compare=item.get("compare"),
    )


def parse_duration(text: Any) -> float | None:
    """'60s' -> 60.0, '5m' -> 300.0, 90 -> 90.0; None for `all`; ValueError when unreadable."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    if isinstance(text, str) and text.strip() == "all":
        return None
    match = _DURATION.match(str(text))
    if not match:
        raise ValueError(f"cannot read duration {text!r} (expected e.g. 30s, 5m, 1h or 'all')")
    unit = match.group(2) or "s"
    return float(match.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}[unit]


def aggregate(agg: str, samples: Sequence[Sample]) -> float:
    values = [s.value for s in samples]
    if agg == "count":
        return float(len(values))
    if not values:
        return math.nan
    if agg == "mean":
        return sum(values) / len(values)
    if agg == "sum":
        return float(sum(values))
    if agg == "min":
        return min(values)
    if agg == "max":
        return max(values)
    if agg in ("median", "p90", "p10"):
        ordered = sorted(values)
        q = {"median": 0.5, "p90": 0.9, "p10": 0.1}[agg]
        return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]
    if agg == "first":
        return values[0]
    if agg == "last":
        return values[-1]
    if agg == "delta":
        return values[-1] - values[0]
    if agg == "late_delta":  # growth over the second half only: a leak keeps growing, warm-up stops
        return values[-1] - values[len(values) // 2]
    if agg == "spread":
        return max(values) - min(values)
    if agg == "slope":  # least-squares change per second
        ts = [s.t for s in samples]
        n = len(ts)
        if n < 2:
            return 0.0
        t_mean, v_mean = sum(ts) / n, sum(values) / n
        var = sum((t - t_mean) ** 2 for t in ts)
        return 0.0 if var == 0 else sum((t - t_mean) * (v - v_mean) for t, v in zip(ts, values)) / var
    raise ValueError(f"unknown aggregate {agg!r}")


def _holds(op: str, left: float, right: float) -> bool:
    if math.isnan(left):
        return False
    return {"<": left < right, "<=": left <= right, ">": left > right, ">=": left >= right,
            "==": left == right, "!=": left != right}[op]


def describe(cond: SeriesCondition) -> str:
    """A condition in words, for rule docs: 'series probe.data_wait_frac: median over the whole
    run >= 0.3, per rank, at least 20 samples (as wait)'."""
    window = "over the whole run" if cond.window_s is None else f"over {_fmt(cond.window_s)} s windows"
    text = f"series {cond.series}: {cond.agg} {window}"
    if cond.compare == "others":
        text += " relative to the other groups' median"
    text += f" {cond.op} {_fmt(cond.value)}"
    if cond.for_s:
        text += f", holding for {_fmt(cond.for_s)} s"
    if cond.per != "none":
        text += f", per {cond.per}"
    if cond.min_samples > 1:
        text += f", at least {cond.min_samples} samples"
    return text + (f" (as {cond.name})" if cond.name != "value" else "")


def _fmt(value: float) -> str:
    if math.isnan(value):
        return "n/a"
    if abs(value) >= 100 or value == int(value):
        return f"{value:.0f}"
    return f"{value:.3g}" if abs(value) < 1 else f"{value:.1f}"


def _windows(samples: list[Sample], window_s: float | None) -> list[tuple[Sample, list[Sample]]]:
    """(end sample, samples in the window ending there) at each sample; one window for `all`."""
    if window_s is None:
        return [(samples[-1], samples)] if samples else []
    out = []
    start = 0
    for end, sample in enumerate(samples):
        if sample.t - samples[0].t < window_s:
            continue  # the run is younger than one window: not a full window yet
        while samples[start].t <= sample.t - window_s:
            start += 1
        out.append((sample, samples[start:end + 1]))
    return out


def _group_values(cond: SeriesCondition, groups: dict[str, list[Sample]]) -> dict[str, list[tuple[Sample, float, int]]]:
    """For each group, the aggregate at each window end: (end sample, value, samples in window)."""
    return {g: [(end, aggregate(cond.agg, win), len(win)) for end, win in _windows(ss, cond.window_s)]
            for g, ss in groups.items()}


def evaluate(cond: SeriesCondition, samples: Sequence[Sample], prefer: str | None = None) -> SeriesResult:
    """Judge one condition over its samples (any order; grouped per `cond.per`). Its fields come
    from the first group that matched, or from `prefer` when that group matched too: the GPU or
    rank an earlier condition of the rule picked, so one message does not mix two ranks' numbers."""
    groups: dict[str, list[Sample]] = {}
    for sample in sorted(samples, key=lambda s: s.t):
        key = "all" if cond.per == "none" else (sample.group if sample.group is not None else "?")
        groups.setdefault(key, []).append(sample)
    judged = {g: ss for g, ss in groups.items() if len(ss) >= cond.min_samples}
    if not judged:
        most = max((len(ss) for ss in groups.values()), default=0)
        return SeriesResult("not_evaluated", {}, [],
                            f"{most} sample(s) of {cond.series}, at least {cond.min_samples} needed")
    values = _group_values(cond, judged)
    if cond.compare == "others":
        values = _relative_to_others(values)
    matches: list[tuple[str, Sample, Sample, float]] = []
    for group, points in values.items():
        run_start: Sample | None = None
        for end, value, _count in points:
            if _holds(cond.op, value, cond.value):
                run_start = run_start or end
                if end.t - run_start.t >= cond.for_s:
                    matches.append((group, run_start, end, value))
                    break
            else:
                run_start = None
    if not matches:
        return SeriesResult("not_matched", {}, [])
    group, first, last, value = next((m for m in matches if m[0] == prefer), matches[0])
    fields = {cond.name: _fmt(value), f"{cond.name}_for_s": _fmt(last.t - first.t)}
    if cond.per != "none":
        fields[cond.per] = group
        fields[f"{cond.name}_{cond.per}s"] = ", ".join(m[0] for m in matches)
    evidence = []
    for g, start, end, v in matches[:8]:
        who = f"{cond.per} {g}: " if cond.per != "none" else ""
        span = "over the whole run" if cond.window_s is None else f"for {_fmt(end.t - start.t)} s"
        rel = " of the other groups' median" if cond.compare == "others" else ""
        text = f"{who}{cond.series} {cond.agg} {_fmt(v)}{rel} {cond.op} {_fmt(cond.value)} {span}"
        evidence.append((end.source, end.line, text))
    return SeriesResult("matched", fields, evidence)


def _relative_to_others(values: dict[str, list[tuple[Sample, float, int]]]) -> dict[str, list[tuple[Sample, float, int]]]:
    """Each group's last value divided by the median of the other groups' last values."""
    last = {g: pts[-1] for g, pts in values.items() if pts}
    out: dict[str, list[tuple[Sample, float, int]]] = {}
    for group, (end, value, count) in last.items():
        others = sorted(v for g, (_e, v, _c) in last.items() if g != group and not math.isnan(v))
        if not others:
            continue
        median = others[len(others) // 2]
        ratio = math.inf if median == 0 and value > 0 else (math.nan if median == 0 else value / median)
        out[group] = [(end, ratio, count)]
    return out


def expand_values(spec: Any) -> list[float]:
    """Values written compactly for rule examples: "95*10, 8*300" is ten 95s then three hundred 8s;
    a list of numbers is taken as is. ValueError when unreadable."""
    if isinstance(spec, list):
        return [float(v) for v in spec]
    values: list[float] = []
    for part in str(spec).split(","):
        part = part.strip()
        if not part:
            continue
        value, _, repeat = part.partition("*")
        values += [float(value)] * (int(repeat) if repeat else 1)
    return values


def example_series(spec: dict[str, Any], interval_s: float = 1.0, start: float = 1_700_000_000.0) -> dict[str, list[Sample]]:
    """Series for a rule example: {series name: {group: values}} sampled every `interval_s`."""
    out: dict[str, list[Sample]] = {}
    for name, groups in spec.items():
        samples = out.setdefault(name, [])
        for group, values in groups.items():
            for i, value in enumerate(expand_values(values)):
                samples.append(Sample(start + i * interval_s, value, None if group == "all" else str(group), "<example>", i + 1))
    return out

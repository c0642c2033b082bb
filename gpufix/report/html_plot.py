"""Telemetry plots for the HTML report: inline SVG drawn here, no charting library.

Per GPU, small panels over one shared time axis (UTC), as the catalogue (gpufix.signals: a row's
`panel`) places the signals: memory used against the total, utilisation (GPU and memory
controller), power against the limit, temperature. The failure moment is a red vertical line
with a label on every panel; Xid events the sampler saw are orange lines. A missing value (a
field NVML did not report, or a pause in sampling longer than three sampling intervals) is a gap
in the line, never a line drawn across it. A series denser than `BUCKETS` time buckets per plot
is drawn as the band between each bucket's minimum and maximum (a few hundred points, whatever
the length of the run), so a one-second spike in a ten-hour run still shows; a sparser one is a
line through every sample, a lone sample a dot.

Colours come from CSS classes defined by the page, so the plots follow its light or dark scheme
and print in black on white.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from gpufix import signals
from gpufix.report.html_text import attr, clock, esc, when
from gpufix.signals import Signal

BUCKETS = 240  # time buckets per plot; a denser series is drawn as its min-max band
UNIX_FLOOR = 1e9  # 2001: a smaller `t` is seconds since the job started
GAP_FACTOR = 3.0  # a pause longer than this many median intervals breaks the line
WIDTH, HEIGHT = 320.0, 150.0
LEFT, RIGHT, TOP, BOTTOM = 40.0, 10.0, 22.0, 20.0
_NOT_SAMPLES = ("event", "processes", "host", "note", "end")
_TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800)


class Line(NamedTuple):
    field: str
    label: str  # the signal's heading: "Memory used"
    css: str  # "main" (solid) or "ref" (dashed reference: a total or a limit)


class Panel(NamedTuple):
    key: str
    title: str
    unit: str
    lines: tuple[Line, ...]


# The panels in their order on the page, and their titles; a panel the catalogue names that is
# not here follows them, titled after its main line.
_PANEL_TITLES = {"memory": "Memory", "util": "Utilisation", "power": "Power", "temp": "Temperature"}


def panels(rows: tuple[Signal, ...] | None = None) -> tuple[Panel, ...]:
    """The plots per GPU, from the catalogue's (default: SIGNALS) `panel` column: a panel's solid
    (main) line first, then its dashed ones, each in the catalogue's order; the main line's unit."""
    drawn = [s for s in (signals.SIGNALS if rows is None else rows) if s.panel]
    out = []
    for key in dict.fromkeys([*_PANEL_TITLES, *(s.panel for s in drawn)]):
        mine = sorted((s for s in drawn if s.panel == key), key=lambda s: s.ref)
        if mine:
            out.append(Panel(key, _PANEL_TITLES.get(key, mine[0].heading), mine[0].unit,
                             tuple(Line(s.field, s.heading, "ref" if s.ref else "main") for s in mine)))
    return tuple(out)


PANELS = panels()


class Marker(NamedTuple):
    t: float
    label: str
    css: str  # "fail" or "xid"


def _number(value: Any) -> float | None:
    kind = type(value)
    if kind is float:
        return value if math.isfinite(value) else None
    return float(value) if kind is int else None


def split_telemetry(records: list[Any], started: float | None = None
                    ) -> tuple[dict[int, list[dict[str, Any]]], list[tuple[float, int | None, str]]]:
    """GPU samples by GPU index (time order) and Xid events `(t, gpu, code)` from raw JSONL objects.

    A `t` below `UNIX_FLOOR` counts from the job's start (older or replayed files), as the
    postmortem core reads it; without a start such a sample cannot be placed and is left out."""
    by_gpu: dict[int, list[dict[str, Any]]] = {}
    xids: list[tuple[float, int | None, str]] = []
    for obj in records:
        if not isinstance(obj, dict):
            continue
        t = _number(obj.get("t"))
        if t is not None and t < UNIX_FLOOR:
            t = t + started if started is not None else None
            obj = dict(obj, t=t)
        if t is None:
            continue
        gpu = obj.get("gpu")
        gpu = gpu if type(gpu) is int else None
        if obj.get("event") == "xid":
            xids.append((t, gpu, str(obj.get("xid", "?"))[:12]))
        elif gpu is not None and not any(key in obj for key in _NOT_SAMPLES):
            by_gpu.setdefault(gpu, []).append(obj)
    for samples in by_gpu.values():
        samples.sort(key=lambda s: s["t"])
    return dict(sorted(by_gpu.items())), xids


class GpuSeries:
    """One GPU's samples, with the sampling pause that counts as a gap worked out once."""

    def __init__(self, samples: list[dict[str, Any]]) -> None:
        self.samples = samples
        self.times = [float(s["t"]) for s in samples]
        steps = sorted(b - a for a, b in zip(self.times, self.times[1:]) if b > a)
        self.pause = steps[len(steps) // 2] * GAP_FACTOR if steps else math.inf

    def runs(self, field: str, scale: float = 1.0) -> list[list[tuple[float, float]]]:
        """The field's values as unbroken runs of (t, value): broken at missing values and long pauses."""
        out: list[list[tuple[float, float]]] = []
        current: list[tuple[float, float]] = []
        last_t = -math.inf
        for sample, t in zip(self.samples, self.times):
            value = _number(sample.get(field))
            if value is None or t - last_t > self.pause:
                if current:
                    out.append(current)
                current = []
            if value is not None:
                current.append((t, value * scale))
            last_t = t
        if current:
            out.append(current)
        return out


def buckets(run: list[tuple[float, float]], t_lo: float, bucket_s: float) -> list[tuple[float, float, float]]:
    """`(t, min, max)` per time bucket of `bucket_s` seconds; one bucket per point when they are sparse."""
    if bucket_s <= 0:
        return [(t, v, v) for t, v in run]
    out: list[tuple[float, float, float]] = []
    index = None
    first_t = last_t = low = high = 0.0
    for t, v in run:
        here = int((t - t_lo) // bucket_s)
        if here != index:
            if index is not None:
                out.append(((first_t + last_t) / 2, low, high))
            index, first_t, low, high = here, t, v, v
        else:
            low, high = min(low, v), max(high, v)
        last_t = t
    if index is not None:
        out.append(((first_t + last_t) / 2, low, high))
    return out


def nice_ticks(lo: float, hi: float, count: int = 4) -> list[float]:
    """Round-numbered ticks covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.floor(lo / step) * step
    ticks = []
    value = first
    while value <= hi + step * 1e-9:
        ticks.append(round(value, 10))
        value += step
    return ticks


def _fmt(value: float) -> str:
    if abs(value) >= 100 or value == int(value):
        return f"{value:.0f}"
    return f"{value:.1f}"


class Frame(NamedTuple):
    """Shared time axis of one run's plots."""

    t_lo: float
    t_hi: float
    markers: tuple[Marker, ...]
    edge_note: str  # a failure outside the recording, said in words

    def x(self, t: float) -> float:
        return LEFT + (t - self.t_lo) / (self.t_hi - self.t_lo) * (WIDTH - LEFT - RIGHT)


def make_frame(by_gpu: dict[int, list[dict[str, Any]]], failed_at: float | None) -> Frame:
    """The time axis: the recording, stretched to include the failure when it is near."""
    times = [float(s["t"]) for samples in by_gpu.values() for s in samples]
    t_lo, t_hi = min(times), max(times)
    span = t_hi - t_lo
    markers: list[Marker] = []
    note = ""
    if failed_at is not None:
        reach = max(span * 0.5, 60.0)
        if t_lo - reach <= failed_at <= t_hi + reach:
            t_lo, t_hi = min(t_lo, failed_at), max(t_hi, failed_at)
            markers.append(Marker(failed_at, "failed " + clock(failed_at, 0), "fail"))
        else:
            side = "after the recording ended" if failed_at > t_hi else "before the recording started"
            note = f"The failure ({when(failed_at)}) is {side}; it is not marked on the plots."
    if t_hi - t_lo < 1.0:
        t_lo, t_hi = t_lo - 30.0, t_hi + 30.0
    return Frame(t_lo, t_hi, tuple(markers), note)


def _time_ticks(frame: Frame) -> list[float]:
    span = frame.t_hi - frame.t_lo
    step = next((s for s in _TIME_STEPS if span / s <= 4), _TIME_STEPS[-1])
    first = math.ceil(frame.t_lo / step) * step
    return [first + i * step for i in range(int((frame.t_hi - first) // step) + 1)]


def _y_range(panel: Panel, values: list[float]) -> tuple[float, float]:
    if panel.key == "util":
        return 0.0, 100.0
    top = max(values) if values else 1.0
    if panel.key == "temp":
        low = min(values) if values else 0.0
        return max(0.0, math.floor((low - 10) / 10) * 10), max(top + 5, low + 20)
    return 0.0, max(top * 1.05, 1.0)


def panel_svg(panel: Panel, series: GpuSeries, frame: Frame, gpu: int, xids: list[tuple[float, str]]) -> str:
    """One panel as an `<svg>` element."""
    lines = [(line, series.runs(line.field)) for line in panel.lines]
    unit = panel.unit
    if panel.key == "memory" and max((v for _, runs in lines for run in runs for _, v in run), default=0) >= 2048:
        unit = "GiB"
        lines = [(line, [[(t, v / 1024) for t, v in run] for run in runs]) for line, runs in lines]
    values = [v for _, runs in lines for run in runs for _, v in run]
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    headline = _headline(panel, lines, unit)
    label = f"GPU {gpu} {panel.title.lower()} over time: {headline}"
    parts = [f'<svg class="plot" viewBox="0 0 {WIDTH:.0f} {HEIGHT:.0f}" role="img" aria-label="{attr(label)}" '
             f'xmlns="http://www.w3.org/2000/svg"><title>{esc(label)}</title>',
             f'<text class="ptitle" x="{LEFT}" y="13">{esc(panel.title)} ({esc(unit)})</text>'
             f'<text class="pvalue" x="{WIDTH - RIGHT}" y="13" text-anchor="end">{esc(headline)}</text>']
    if not values:
        parts.append(f'<rect class="frame" x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}"/>'
                     f'<text class="empty" x="{LEFT + plot_w / 2}" y="{TOP + plot_h / 2}" text-anchor="middle">not reported</text></svg>')
        return "".join(parts)
    y_lo, y_hi = _y_range(panel, values)
    ticks = [v for v in nice_ticks(y_lo, y_hi) if y_lo <= v <= y_hi * 1.0001]
    y_hi = max(y_hi, ticks[-1]) if ticks else y_hi

    def y(value: float) -> float:
        return TOP + plot_h - (min(max(value, y_lo), y_hi) - y_lo) / (y_hi - y_lo) * plot_h

    for tick in ticks:
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(tick):.1f}" y2="{y(tick):.1f}"/>'
                     f'<text class="tick" x="{LEFT - 4}" y="{y(tick) + 3:.1f}" text-anchor="end">{_fmt(tick)}</text>')
    span = frame.t_hi - frame.t_lo
    for t in _time_ticks(frame):
        x = frame.x(t)
        anchor = "end" if x > WIDTH - 30 else "start" if x < 30 else "middle"  # labels stay inside the plot
        parts.append(f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{TOP + plot_h}"/>'
                     f'<text class="tick" x="{x:.1f}" y="{HEIGHT - 6}" text-anchor="{anchor}">{clock(t, span)}</text>')
    parts.append(f'<rect class="frame" x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}"/>')
    bucket_s = span / BUCKETS
    for line, runs in lines:
        for run in runs:
            parts.append(_run_svg(buckets(run, frame.t_lo, bucket_s), len(run), frame, y, f"{line.css} {panel.key}"))
    markers = list(frame.markers) + [Marker(t, f"Xid {code}", "xid") for t, code in xids]
    for marker in markers:
        x = frame.x(marker.t)
        anchor, dx = ("end", -3) if x > LEFT + plot_w * 0.6 else ("start", 3)
        row = TOP + 10 if marker.css == "fail" else TOP + 21
        parts.append(f'<g class="marker {marker.css}"><title>{esc(marker.label)} UTC</title>'
                     f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{TOP + plot_h}"/>'
                     f'<text x="{x + dx:.1f}" y="{row}" text-anchor="{anchor}">{esc(marker.label)}</text></g>')
    parts.append("</svg>")
    return "".join(parts)


def _run_svg(reduced: list[tuple[float, float, float]], count: int, frame: Frame, y: Any, css: str) -> str:
    """One unbroken run: a dot, a line through the samples, or (when buckets hold several) the
    band between each bucket's minimum and maximum, so spikes survive the reduction."""
    if len(reduced) == 1 and count == 1:
        t, v, _ = reduced[0]
        return f'<circle class="dot {css}" cx="{frame.x(t):.1f}" cy="{y(v):.1f}" r="2.5"/>'
    if len(reduced) == count:
        path = "M" + " L".join(f"{frame.x(t):.1f},{y(v):.1f}" for t, v, _ in reduced)
        return f'<path class="line {css}" d="{path}"/>'
    upper = " L".join(f"{frame.x(t):.1f},{y(high):.1f}" for t, _, high in reduced)
    lower = " L".join(f"{frame.x(t):.1f},{y(low):.1f}" for t, low, _ in reversed(reduced))
    return f'<path class="band {css}" d="M{upper} L{lower} Z"/>'


def _headline(panel: Panel, lines: list[tuple[Line, list[list[tuple[float, float]]]]], unit: str) -> str:
    """The panel's numbers in words: the peak of the main line, against the reference line."""
    main = [v for run in lines[0][1] for _, v in run]
    if not main:
        return "not reported"
    peak = f"peak {_fmt(max(main))}"
    if len(lines) > 1:
        ref = [v for run in lines[1][1] for _, v in run]
        if ref and panel.key in ("memory", "power"):
            return f"{peak} of {_fmt(max(ref))} {unit}"
        if ref:
            return f"GPU peak {_fmt(max(main))}, memory {_fmt(max(ref))} {unit}"
    return f"{peak} {unit}"


def telemetry_html(records: list[Any] | None, failed_at: float | None, anchor: str, started: float | None = None) -> str:
    """The telemetry block of one run: a figure of PANELS per GPU, or a sentence saying why not."""
    by_gpu, xids = split_telemetry(records or [], started)
    if not by_gpu:
        return '<p class="none">No telemetry recorded for this run.</p>'
    frame = make_frame(by_gpu, failed_at)
    count = sum(len(s) for s in by_gpu.values())
    span = frame.t_hi - frame.t_lo
    out = [f'<p class="meta">{count:,} sample{"s" if count != 1 else ""} from {len(by_gpu)} GPU{"s" if len(by_gpu) != 1 else ""}; '
           f'times in UTC. Solid: measured; dashed: total, limit or memory-controller utilisation.'
           + (" The red line marks the failure." if frame.markers else "") + "</p>"]
    if frame.edge_note:
        out.append(f'<p class="note">{esc(frame.edge_note)}</p>')
    if span <= 0:
        return "".join(out)
    for gpu, samples in by_gpu.items():
        mine = [(t, code) for t, g, code in xids if g is None or g == gpu]
        series = GpuSeries(samples)
        panels = "".join(panel_svg(panel, series, frame, gpu, mine) for panel in PANELS)
        out.append(f'<figure class="gpu" id="{attr(f"{anchor}-gpu-{gpu}")}"><figcaption>GPU {gpu}'
                   f' <span class="meta">({len(samples):,} sample{"s" if len(samples) != 1 else ""})</span></figcaption>'
                   f'<div class="panels">{panels}</div></figure>')
    return "".join(out)

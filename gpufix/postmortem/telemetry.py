"""Telemetry around a failure, from a record's `telemetry.jsonl` (written by `gpufix run`).

GPU sample lines (`{"t": ..., "gpu": 0, "memory_used_mib": ..., ...}`) and Xid events are read,
of the job's GPUs when the process lines name them; host lines, notes and torn lines are skipped,
and a record without the file simply has no telemetry. `t` is Unix seconds; a small `t` (seconds
since the job started, as in older or replayed files) is placed after the record's start.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from gpufix.postmortem.times import from_unix, iso
from gpufix.signals import shown

# The fields summarised, from the catalogue (gpufix.signals: `postmortem=` is a row's place).
METRICS = tuple(s.field for s in shown("postmortem"))
_UNIX_FLOOR = 1e9  # 2001: anything smaller is relative to the job's start


def read_samples(record_dir: str, started: datetime | None = None) -> list[dict[str, Any]]:
    """The GPU samples and Xid events (`"event": "xid"`) of a record's telemetry.jsonl in file
    order, of the job's GPUs only where the record names them (docs/run-record.md); [] when
    there is none."""
    from gpufix.record.reader import Record

    try:
        return Record(record_dir).telemetry.gpu_lines()
    except OSError:
        return []


def sample_time(sample: dict[str, Any], started: datetime | None) -> datetime | None:
    t = float(sample["t"])
    if t >= _UNIX_FLOOR:
        return from_unix(t)
    return started + timedelta(seconds=t) if started else None


def summarise(samples: list[dict[str, Any]], end: datetime | None, window_s: float,
              started: datetime | None = None) -> dict[str, Any] | None:
    """Per GPU min/max of the METRICS (memory, utilisation, temperature, power) in the window before `end`.

    Without `end` (a run with no known failure time) the window is the last one recorded.
    """
    timed = [(sample_time(s, started), s) for s in samples if "event" not in s]
    timed = [(t, s) for t, s in timed if t is not None]
    if not timed:
        return None
    last = max(t for t, _s in timed)
    end = min(end, last) if end is not None and end >= min(t for t, _s in timed) else last
    begin = end - timedelta(seconds=window_s)
    inside = [s for t, s in timed if begin <= t <= end]
    gpus: dict[str, dict[str, dict[str, float]]] = {}
    for s in inside:
        stats = gpus.setdefault(str(s["gpu"]), {})
        for metric in METRICS:
            value = s.get(metric)
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            cur = stats.get(metric)
            stats[metric] = {"min": min(cur["min"], value), "max": max(cur["max"], value)} if cur else {"min": value, "max": value}
    return {"window_s": window_s, "from": iso(begin), "to": iso(end), "samples": len(inside),
            "gpus": dict(sorted(gpus.items(), key=lambda kv: int(kv[0])))}

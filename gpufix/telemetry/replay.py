"""Reading a recorded `telemetry.jsonl` back: as values (`read_telemetry`), or as a
`TelemetrySource` that plays the recording to the sampler (`ReplayTelemetrySource`), so the
sampler, the watchdog and later telemetry rules run on a real machine's numbers without a GPU.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from collections.abc import Iterator
from typing import Any

from gpufix.telemetry.inventory import GpuIdentity, GpuProcessUse, GpuSample, XidEvent


@dataclass(frozen=True)
class Telemetry:
    """Everything one `telemetry.jsonl` holds, in file order."""

    samples: tuple[GpuSample, ...] = ()
    xids: tuple[XidEvent, ...] = ()
    processes: tuple[tuple[float, tuple[GpuProcessUse, ...]], ...] = ()
    host: tuple[tuple[float, dict[str, Any]], ...] = ()
    notes: tuple[str, ...] = ()
    unsupported: tuple[str, ...] = field(default=())
    identities: tuple[GpuIdentity, ...] = ()

    def gpus(self) -> list[int]:
        return sorted({s.gpu for s in self.samples})

    def series(self, gpu: int, name: str) -> list[tuple[float, Any]]:
        """(t, value) of one field of one GPU, skipping missing values."""
        return [(s.t, getattr(s, name)) for s in self.samples if s.gpu == gpu and getattr(s, name) is not None]


def iter_lines(path: str) -> Iterator[tuple[int, float, dict[str, Any]]]:
    """(line number, t, object) of each readable line; torn or foreign lines are skipped."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            try:
                obj = json.loads(line)
                t = float(obj["t"])
            except (ValueError, KeyError, TypeError):
                continue
            if isinstance(obj, dict):
                yield number, t, obj


def read_telemetry(path: str) -> Telemetry:
    """Parse a `telemetry.jsonl`; unreadable or torn lines (a killed writer) are skipped."""
    samples, xids, procs, host, notes, unsupported, identities = [], [], [], [], [], [], []
    for _number, t, obj in iter_lines(path):
        try:
            if isinstance(obj.get("gpus"), list):
                identities = [GpuIdentity.from_dict(g) for g in obj["gpus"] if isinstance(g, dict) and isinstance(g.get("gpu"), int)]
            elif obj.get("event") == "xid":
                xids.append(XidEvent(t, obj.get("gpu"), int(obj["xid"])))
            elif "processes" in obj:
                procs.append((t, tuple(GpuProcessUse(int(p["gpu"]), int(p["pid"]), p.get("used_mib"))
                                       for p in obj["processes"])))
            elif "host" in obj:
                host.append((t, dict(obj["host"])))
            elif "note" in obj:
                notes.append(str(obj["note"]))
            elif obj.get("end"):
                unsupported.extend(str(u) for u in obj.get("unsupported") or ())
            elif "gpu" in obj:
                samples.append(GpuSample.from_dict(obj))
        except (ValueError, KeyError, TypeError):
            continue
    return Telemetry(tuple(samples), tuple(xids), tuple(procs), tuple(host), tuple(notes), tuple(unsupported),
                     tuple(identities))


class ReplayTelemetrySource:
    """Plays a recording: each `sample()` returns the next recorded moment's GPUs, re-stamped
    with the caller's clock; Xid events and process lists come out as their moment is reached.
    After the end the last moment repeats (a recording's end is not a lost GPU).
    """

    def __init__(self, path: str, sleep: bool = True) -> None:
        self._path = path
        self._sleep = sleep
        self._ticks: list[tuple[float, list[GpuSample]]] = []
        self._data = Telemetry()
        self._pos = -1
        self._xid_pos = 0

    def open(self) -> str | None:
        try:
            self._data = read_telemetry(self._path)
        except OSError as exc:
            return f"no GPU telemetry: cannot read the recording {self._path} ({exc.strerror or exc})"
        by_t: dict[float, list[GpuSample]] = {}
        for s in self._data.samples:
            by_t.setdefault(s.t, []).append(s)
        self._ticks = sorted(by_t.items())
        if not self._ticks:
            return f"no GPU telemetry: the recording {self._path} holds no GPU samples"
        return None

    @property
    def _t(self) -> float:
        return self._ticks[max(self._pos, 0)][0]

    def sample(self, now: float) -> list[GpuSample]:
        self._pos = min(self._pos + 1, len(self._ticks) - 1)
        return [GpuSample.from_dict({**s.to_dict(), "t": now}) for s in self._ticks[self._pos][1]]

    def wait_events(self, timeout_s: float) -> list[XidEvent]:
        if self._sleep:
            time.sleep(max(0.0, timeout_s))
        out = []
        xids = self._data.xids
        while self._xid_pos < len(xids) and xids[self._xid_pos].t <= self._t:
            e = xids[self._xid_pos]
            out.append(XidEvent(time.time(), e.gpu, e.xid))
            self._xid_pos += 1
        return out

    def processes(self) -> list[GpuProcessUse]:
        seen = [users for t, users in self._data.processes if t <= self._t]
        return list(seen[-1]) if seen else []

    def identities(self) -> list[GpuIdentity]:
        return list(self._data.identities)

    def problems(self) -> list[str]:
        return list(self._data.unsupported)

    def close(self) -> None:
        return None

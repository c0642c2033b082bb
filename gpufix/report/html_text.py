"""Text for the HTML report: escaping that survives hostile log lines, truncation, times.

Everything that came from a log, a record or a rule goes through `esc` (element text) or `attr`
(attribute values) before it reaches the page. Besides `&<>"'`, control characters become
escapes as Python writes them (an ESC shows as `\\x1b`), lone surrogates from undecodable bytes
become U+FFFD, and bidirectional overrides (the "Trojan Source" trick that makes a line read
differently from what it is) are shown as `\\u202e` instead of acting.
"""

from __future__ import annotations

import html
import math
import re
from datetime import datetime, timezone
from typing import Any

MAX_TEXT = 4000  # one message, explanation or snippet
MAX_LINE = 1000  # one evidence line (a CUDA OOM message alone runs to 700 characters)

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_BIDI = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_SLUG = re.compile(r"[^A-Za-z0-9_-]+")
_ZONE = re.compile(r"T.*[+-]\d\d:?\d\d$")


def _visible_control(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def clean(value: Any, limit: int | None = MAX_TEXT) -> str:
    """`value` as displayable text: controls shown as `\\x1b`, then cut to `limit` characters."""
    text = "" if value is None else str(value)
    cut = 0
    if limit is not None and len(text) > limit:
        cut = len(text) - limit
        text = text[:limit]
    text = _SURROGATE.sub("\ufffd", text)
    text = _CONTROL.sub(_visible_control, text)
    text = _BIDI.sub(_visible_control, text)
    if cut:
        text += f" … ({cut:,} more characters)" if cut > 50 else "…"
    return text


def esc(value: Any, limit: int | None = MAX_TEXT) -> str:
    """Element text: cleaned, then HTML-escaped."""
    return html.escape(clean(value, limit), quote=True)


def attr(value: Any, limit: int | None = 300) -> str:
    """An attribute value (always written between double quotes): newlines and tabs become spaces."""
    return esc(value, limit).replace("\n", " ").replace("\t", " ")


def slug(value: Any, index: int) -> str:
    """A unique, safe fragment id for the `index`-th item named `value`."""
    tail = _SLUG.sub("-", str(value))[:48].strip("-")
    return f"run-{index}" + (f"-{tail}" if tail else "")


def to_epoch(value: Any) -> float | None:
    """Unix seconds from a number or an ISO 8601 string (`Z` or an offset; naive means UTC)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str) and value.strip():
        text = value.strip().replace("Z", "+00:00").replace("z", "+00:00")
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            return None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        return moment.timestamp()
    return None


def when(value: Any, seconds: bool = True) -> str:
    """A moment as `2025-01-14 09:41:02 UTC` (escaped); an unparseable value is shown as given."""
    epoch = to_epoch(value)
    if epoch is None:
        return esc(value, 80) if value not in (None, "") else "—"
    moment = datetime.fromtimestamp(epoch, tz=timezone.utc)
    # A naive ISO string is shown as written (log times carry no zone); numbers and zoned strings are UTC.
    zoned = not isinstance(value, str) or value.rstrip().endswith(("Z", "z")) or _ZONE.search(value) is not None
    return moment.strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M") + (" UTC" if zoned else "")


def clock(epoch: float, span_s: float) -> str:
    """A tick label: `09:41` for long spans, `09:41:02` for short ones (UTC)."""
    moment = datetime.fromtimestamp(epoch, tz=timezone.utc)
    return moment.strftime("%H:%M" if span_s >= 1800 else "%H:%M:%S")


def duration(seconds: float) -> str:
    """`45 s`, `12 min 3 s`, `3 h 05 min`."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


def ranks_text(ranks: Any) -> str:
    """`0, 1, 2, 4–7` for a list of ints; escaped text otherwise."""
    if not ranks:
        return "—"
    if not isinstance(ranks, (list, tuple)) or not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
        return esc(ranks if not isinstance(ranks, (list, tuple)) else ", ".join(map(str, ranks)), 300)
    values = sorted(set(ranks))
    parts: list[str] = []
    start = prev = values[0]
    for rank in values[1:] + [None]:
        if rank is not None and rank == prev + 1:
            prev = rank
            continue
        parts.append(str(start) if start == prev else f"{start}\u2013{prev}" if prev > start + 1 else f"{start}, {prev}")
        if rank is not None:
            start = prev = rank
    return ", ".join(parts)

"""Timestamps as logs write them, read into naive `datetime`s (log times carry no zone).

Formats, most specific first: ISO / `2026-11-30 03:12:44[,.]fff`, torchelastic
`time : 2026-11-30_11:11:05`, glog `[E1130 07:03:29.118...]` / `E1130 07:03:29.118000 51820 ...`
(no year: the caller's `year`), syslog `Nov 30 03:12:44` (no year either). dmesg's
`[12345.678]` seconds since boot is not read: without the boot time it names no moment.
"""

from __future__ import annotations

import os
import re
from datetime import datetime, timezone

_ISO = re.compile(
    r"(?P<y>20\d\d)-(?P<mo>\d\d)-(?P<d>\d\d)[T _](?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)"
)
_GLOG = re.compile(r"(?:^|[\[\s])[IWEF](?P<mo>\d\d)(?P<d>\d\d) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)\.\d+")
_SYSLOG = re.compile(
    r"(?:^|\s)(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +(?P<d>\d{1,2}) "
    r"(?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)"
)
_MONTHS = {m: i for i, m in enumerate("Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split(), 1)}


def parse_line_time(text: str, year: int | None = None) -> datetime | None:
    """The first timestamp in one log line, or None. Year-less formats need `year`."""
    if not text:
        return None
    m = _ISO.search(text)
    if m:
        return _make(int(m["y"]), int(m["mo"]), int(m["d"]), m)
    if year is None:
        return None
    m = _GLOG.search(text)
    if m:
        return _make(year, int(m["mo"]), int(m["d"]), m)
    m = _SYSLOG.search(text)
    if m:
        return _make(year, _MONTHS[m["mon"]], int(m["d"]), m)
    return None


def _make(year: int, month: int, day: int, m: re.Match[str]) -> datetime | None:
    try:
        return datetime(year, month, day, int(m["h"]), int(m["mi"]), int(m["s"]))
    except ValueError:
        return None


def parse_iso(value: object) -> datetime | None:
    """A record's `start_utc`-style ISO string (with or without `Z`) as naive UTC, or None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is not None:
        moment = moment.astimezone(timezone.utc).replace(tzinfo=None)
    return moment.replace(microsecond=0)


def from_unix(seconds: float) -> datetime:
    """Unix seconds as naive UTC (the zone records use)."""
    return datetime.fromtimestamp(seconds, timezone.utc).replace(tzinfo=None, microsecond=0)


def file_mtime(path: str) -> datetime | None:
    try:
        return from_unix(os.stat(path).st_mtime)
    except OSError:
        return None


def iso(moment: datetime | None) -> str | None:
    """The JSON form: `YYYY-MM-DDTHH:MM:SS`, or None."""
    return moment.replace(microsecond=0).isoformat() if moment else None

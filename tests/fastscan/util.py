"""Helpers: the reference scan, and a field-by-field comparison of Evidence."""

from __future__ import annotations

from pathlib import Path

from gpufix.evidence import Evidence
from gpufix.logscan import LogScanner


def reference(path: Path | str, ruleset) -> Evidence:
    with open(path, "rb") as f:
        return LogScanner.for_rules(ruleset).scan_stream(f, str(path))


def contents(ev: Evidence) -> dict:
    """Everything in an Evidence, dict key order included (the engine iterates hits in order)."""
    return {
        "sources": ev.sources,
        "hits": list(ev.hits.items()),
        "hit_counts": list(ev.hit_counts.items()),
        "exceptions": ev.exceptions,
        "exception_count": ev.exception_count,
        "lines_read": ev.lines_read,
        "bytes_read": ev.bytes_read,
        "notes": ev.notes,
        "tails": ev.tails,
        "facts": ev.facts,
    }


def assert_same(expected: Evidence, actual: Evidence) -> None:
    want, got = contents(expected), contents(actual)
    for key in want:
        assert got[key] == want[key], f"{key} differs"

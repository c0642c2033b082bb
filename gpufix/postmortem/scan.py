"""Scanning files for a post-mortem: the one place a file's bytes meet the rule patterns.

`scan_file(path, ruleset) -> Evidence` is the contract a faster engine (gpufix/fastscan.py)
implements too; everything else calls `scan_many`, which picks the engine once, and scans the
files in parallel processes when there is more than about a block of data and more than one
core, serially otherwise (a process pool costs more than it saves on small inputs).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import TYPE_CHECKING

from gpufix.evidence import Evidence
from gpufix.logscan import BLOCK_BYTES, LogScanner
from gpufix.safeio import open_regular

if TYPE_CHECKING:
    from gpufix.rules.model import RuleSet

ScanFn = Callable[[str, "RuleSet"], Evidence]
_SCANNERS: weakref.WeakKeyDictionary[RuleSet, LogScanner] = weakref.WeakKeyDictionary()


def scan_file(path: str, ruleset: RuleSet) -> Evidence:
    """Scan one file for the rule pack's patterns; the evidence's source is `path` as given.

    Only a regular file is read, and only up to the size it had when opened (safeio); raises
    OSError when the file cannot be read or is not a regular file (the caller notes it and goes on).
    """
    scanner = _SCANNERS.get(ruleset)
    if scanner is None:
        scanner = _SCANNERS[ruleset] = LogScanner.for_rules(ruleset)
    with open_regular(path) as stream:
        return scanner.scan_stream(stream, path)


def default_scan_fn() -> ScanFn:
    """The fast engine when it is installed, else the reference scanner above."""
    try:
        from gpufix.fastscan import scan_file as fast  # type: ignore[import-not-found]
    except ImportError:
        return scan_file
    return fast  # type: ignore[no-any-return]


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# Worker state: set once per process by the pool's initializer, not pickled per task.
_WORKER: dict[str, object] = {}


def _init_worker(ruleset: RuleSet, fn: ScanFn) -> None:
    _WORKER["ruleset"], _WORKER["fn"] = ruleset, fn


def _scan_in_worker(path: str) -> Evidence | str:
    try:
        return _WORKER["fn"](path, _WORKER["ruleset"])  # type: ignore[operator,no-any-return]
    except OSError as exc:
        return f"{path}: cannot read: {exc.strerror or exc}"


def _scan_here(fn: ScanFn, path: str, ruleset: RuleSet) -> Evidence | str:
    try:
        return fn(path, ruleset)
    except OSError as exc:
        return f"{path}: cannot read: {exc.strerror or exc}"


def scan_many(paths: list[str], sizes: list[int], ruleset: RuleSet, fn: ScanFn | None = None,
              jobs: int | None = None, parallel_min_bytes: int = BLOCK_BYTES) -> list[Evidence | str]:
    """Scan each path; a result is the Evidence or, for an unreadable file, a note."""
    fn = fn or default_scan_fn()
    jobs = min(jobs or cpu_count(), len(paths))
    if jobs <= 1 or sum(sizes) <= parallel_min_bytes:
        return [_scan_here(fn, p, ruleset) for p in paths]
    # Biggest first, so one large file does not start last and hold up the end.
    order = sorted(range(len(paths)), key=lambda i: -sizes[i])
    results: list[Evidence | str] = [""] * len(paths)
    with ProcessPoolExecutor(max_workers=jobs, initializer=_init_worker, initargs=(ruleset, fn)) as pool:
        for i, result in zip(order, pool.map(_scan_in_worker, [paths[i] for i in order])):
            results[i] = result
    return results

"""Scanning many files, or one big file, on every available core.

Work is cut into tasks: a whole file, or a run of consecutive blocks of a big file (the blocks
`LogScanner` would read, planned once in the parent with one `rfind` per MiB). Worker processes
scan tasks and send back `Partial`s; the parent merges each file's partials in order, which gives
exactly the serial result (see `core.merge`).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import TYPE_CHECKING, Any

from gpufix.fastscan.core import (
    SPLIT_MIN_PART,
    Block,
    FastScanner,
    Partial,
    LogFile,
    available_cpus,
    keep_file_tail,
    merge,
    plan_blocks,
    split_ranges,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gpufix.evidence import Evidence
    from gpufix.rules.model import RuleSet

TASKS_PER_JOB = 4  # smaller tasks than one per core: a noisy neighbour slows one core, not the run

_WORKER: FastScanner | None = None


def _init_worker(patterns: list[tuple[str, bool]], literals: list[Any] | None) -> None:
    global _WORKER
    if _WORKER is None or _WORKER.patterns != patterns:  # a forked worker has the parent's already
        _WORKER = FastScanner(patterns, literals)


def _scan_task(path: str, blocks: list[Block] | None) -> tuple[Partial, int]:
    """Scan a whole file (blocks None) or the given blocks of it; also return the file's size."""
    assert _WORKER is not None
    with LogFile(path) as mapped:
        if blocks is None:
            blocks = plan_blocks(mapped)
        return _WORKER.scan_blocks(mapped, blocks, path), mapped.size


def _plan(paths: list[str], jobs: int) -> list[tuple[str, int, list[Block] | None, int]]:
    """Tasks as (path, part number, blocks or None for the whole file, bytes), biggest first."""
    sizes = {path: os.stat(path).st_size for path in paths}
    part_bytes = max(SPLIT_MIN_PART, sum(sizes.values()) // (jobs * TASKS_PER_JOB) + 1)
    tasks: list[tuple[str, int, list[Block] | None, int]] = []
    for path in paths:
        if sizes[path] < 2 * part_bytes:
            tasks.append((path, 0, None, sizes[path]))
            continue
        with LogFile(path) as mapped:
            ranges = split_ranges(plan_blocks(mapped), mapped.size, part_bytes)
        for number, blocks in enumerate(ranges):
            tasks.append((path, number, blocks, blocks[-1][1] - blocks[0][0]))
    tasks.sort(key=lambda task: -task[3])
    return tasks


def _context() -> Any:
    # fork starts workers in milliseconds with the rule pack already imported; elsewhere (macOS,
    # Windows) the platform's default start method is the safe one.
    if sys.platform.startswith("linux"):
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context()


def scan_files_parallel(paths: Sequence[str], ruleset: RuleSet, jobs: int | None = None) -> dict[str, Evidence]:
    unique = list(dict.fromkeys(paths))
    jobs = max(1, jobs or available_cpus())
    if jobs == 1 or not unique:
        from gpufix.fastscan.core import scan_file

        return {path: scan_file(path, ruleset) for path in unique}
    tasks = _plan(unique, jobs)
    if len(tasks) == 1:
        from gpufix.fastscan.core import scan_file

        return {unique[0]: scan_file(unique[0], ruleset)}
    global _WORKER
    _WORKER = FastScanner.for_rules(ruleset)  # inherited, compiled and warm, by forked workers
    parts: dict[str, dict[int, Partial]] = {path: {} for path in unique}
    sizes: dict[str, int] = {}
    workers = min(jobs, len(tasks))
    with ProcessPoolExecutor(workers, mp_context=_context(), initializer=_init_worker,
                             initargs=(ruleset.line_patterns, ruleset.line_literals())) as pool:
        futures = [(path, number, pool.submit(_scan_task, path, blocks)) for path, number, blocks, _ in tasks]
        for path, number, future in futures:
            part, size = future.result()
            parts[path][number] = part
            sizes[path] = size
    found = {path: merge([parts[path][n] for n in sorted(parts[path])], path, sizes[path]) for path in unique}
    for path, evidence in found.items():
        with LogFile(path) as file:
            keep_file_tail(evidence, file, path)
    return found

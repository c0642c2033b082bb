"""Fast log scanning for `gpufix postmortem`: `LogScanner`'s exact results at grep speed or better.

    scan_file(path, ruleset) -> Evidence           # one file, this process
    scan_files(paths, ruleset, jobs=None) -> {path: Evidence}   # processes on every core

`scan_file(path, rs)` equals `LogScanner.for_rules(rs).scan_stream(open(path, "rb"), path)` in
every field. How: see `gpufix.fastscan.core`; parallel and split scanning: `gpufix.fastscan.parallel`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpufix.fastscan.core import scan_file

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gpufix.evidence import Evidence
    from gpufix.rules.model import RuleSet

__all__ = ["scan_file", "scan_files"]


def scan_files(paths: Sequence[str], ruleset: RuleSet, jobs: int | None = None) -> dict[str, Evidence]:
    """Scan files in parallel processes (default: one per CPU this process may run on).

    A big file is split into ranges of whole blocks so one file also uses every core; results
    are identical to `scan_file` on each path. Keys are the paths as given (duplicates once).
    An unreadable path raises its OSError.
    """
    from gpufix.fastscan.parallel import scan_files_parallel

    return scan_files_parallel(paths, ruleset, jobs)

"""Reading back what `gpufix confirm` stored in a record: `<record>/experiments/results.json`.

Kept apart from confirm.py (nothing heavy) so that `gpufix explain RECORD` can show the verdicts
beside the findings without loading the experiments.
"""

from __future__ import annotations

import os

from gpufix.record.layout import EXPERIMENT_RESULTS

RESULTS = os.path.basename(EXPERIMENT_RESULTS)  # in the work folder of the experiments, in the record
from gpufix.record.reader import Record


def results_path(record_dir: str) -> str:
    return os.path.join(record_dir, EXPERIMENT_RESULTS)


def read_results(record_dir: str) -> dict | None:  # type: ignore[type-arg]
    """The last `gpufix confirm` report stored in a record (its JSON), or None."""
    return Record(record_dir).experiment_results


def verdicts_by_finding(data: dict | None) -> dict[str, list[dict]]:  # type: ignore[type-arg]
    """Finding code -> the experiment results for it, in run order."""
    out: dict[str, list[dict]] = {}  # type: ignore[type-arg]
    for row in (data or {}).get("experiments") or []:
        if isinstance(row, dict) and isinstance(row.get("for"), str):
            out.setdefault(row["for"], []).append(row)
    return out

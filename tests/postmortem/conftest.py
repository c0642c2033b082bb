"""Post-mortem test helpers: the fixtures folder and the rule pack, loaded once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpufix.rules.loader import load_ruleset
from gpufix.rules.model import RuleSet

PM_FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "postmortem"


def write_record(root: Path, name: str, output: bytes, exit_status: int, telemetry: list[dict],
                 stamp: str = "2025-11-30T10:53:20.000Z", **meta: Any) -> Path:
    """A minimal finished run record of `gpufix run` under `root`; `meta` adds meta.json keys."""
    record = root / name
    record.mkdir(parents=True)
    (record / "meta.json").write_text(json.dumps({"format": 1, "status": "finished", "name": "train",
                                                  "command": ["python", "train.py"], "start_utc": stamp, **meta}))
    (record / "output.log").write_bytes(output)
    (record / "output.idx").write_text(json.dumps({"t": 1.0, "stream": "stdout", "offset": 0, "length": len(output)}) + "\n")
    (record / "result.json").write_text(json.dumps({"exit_status": exit_status, "returncode": exit_status,
                                                    "signal": None, "duration_s": 60.0, "findings": []}))
    (record / "telemetry.jsonl").write_text("".join(json.dumps(line) + "\n" for line in telemetry))
    return record


@pytest.fixture(scope="session")
def ruleset() -> RuleSet:
    return load_ruleset(use_cache=False)

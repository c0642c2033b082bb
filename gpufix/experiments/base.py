"""What every confirming experiment shares: the verdicts, the result, the context it runs in.

An experiment is a module-level object with a `name`, a `description`, a `budget_s` (the most it
may take; the caller may give it less), `params` (name -> (type, default, help)), `plan(ctx,
finding)` and `run(ctx, plan)`. `plan` returns a `Plan` saying what the experiment will do and
cost, or a `Skip` with the reason it cannot run for this record (no DataLoader seen, no GPU, a
command with redacted secrets). `run` returns a `Result`. Neither raises: a failure inside an
experiment is an "inconclusive" result with the reason (confirm.py guards that too).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

CONFIRMED = "confirmed"
REFUTED = "refuted"
INCONCLUSIVE = "inconclusive"
VERDICTS = (CONFIRMED, REFUTED, INCONCLUSIVE)


class Plan(NamedTuple):
    """What an experiment will do for one finding, shown before anything runs."""

    experiment: str
    finding: str  # the finding's code
    what: str  # one sentence: what it runs and what it changes
    estimate_s: float  # expected time
    uses_gpu: bool
    changes: dict[str, Any]  # the settings it changes in the re-runs (env, knobs)
    params: dict[str, Any]


class Skip(NamedTuple):
    """An experiment the record's findings call for that cannot run here, and why."""

    experiment: str
    finding: str
    reason: str


class Result(NamedTuple):
    """One experiment's verdict on one finding, with what it measured."""

    experiment: str
    finding: str
    verdict: str
    reason: str
    measurements: dict[str, Any]  # names carry their unit: step_time_ms, peak_memory_mib, speedup (ratio)
    recommendation: dict[str, Any] | None = None  # {"title": ..., "change": {...}}
    verified: bool | None = None  # the recommended change ran and did what it should; None: nothing to verify
    duration_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.experiment, "for": self.finding, "verdict": self.verdict, "reason": self.reason,
                "measurements": self.measurements, "recommendation": self.recommendation,
                "verified": self.verified, "duration_s": round(self.duration_s, 2)}


class Context:
    """The record an experiment works from, where its trials go, and how much time is left."""

    def __init__(self, record: Path, meta: dict[str, Any], result: dict[str, Any], argv: list[str], cwd: str,
                 facts: dict[str, Any], budget_s: float, progress: Callable[[str], None],
                 batch_size_arg: str | None = None, python: str | None = None) -> None:
        self.record = record
        self.meta = meta
        self.result = result
        self.argv = argv
        self.cwd = cwd
        self.facts = facts  # what the probe measured in the original run (gpufix.probe.read.read_probe_facts)
        self.batch_size_arg = batch_size_arg
        self.python = python or _executable(meta.get("job_python")) or _executable(meta.get("python")) or "python3"
        self.progress = progress
        self.work = record / "experiments"
        self._deadline = time.monotonic() + budget_s

    def time_left(self) -> float:
        return max(0.0, self._deadline - time.monotonic())

    @property
    def gpu(self) -> bool:
        """The original run saw a CUDA device (the probe's torch.cuda.is_available())."""
        return bool(self.facts.get("cuda_available"))

    @property
    def cpus_usable(self) -> int:
        try:
            return len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            return os.cpu_count() or 1

    def steps_through_failure(self, at_least: int) -> int:
        """Steps for a re-run to reach where the original run failed: its steps plus one, at least `at_least`."""
        steps = self.facts.get("steps")
        return max(at_least, int(steps) + 1) if isinstance(steps, int) and steps < 1000 else at_least

    def main_loader(self) -> dict[str, Any] | None:
        """The DataLoader the job trained from: the first whose settings the probe recorded."""
        loaders = [loader for loader in self.facts.get("loaders") or [] if isinstance(loader, dict)]
        return loaders[0] if loaders else None


class Experiment:
    """Base for the built-in experiments (subclasses set the class attributes)."""

    name = ""
    description = ""
    budget_s = 120.0
    uses_gpu = False
    params: dict[str, tuple[type, Any, str]] = {}

    def plan(self, ctx: Context, finding: dict[str, Any], params: dict[str, Any]) -> Plan | Skip:
        raise NotImplementedError

    def run(self, ctx: Context, plan: Plan) -> Result:
        raise NotImplementedError

    def result(self, plan: Plan, verdict: str, reason: str, measurements: dict[str, Any], started: float,
               recommendation: dict[str, Any] | None = None, verified: bool | None = None) -> Result:
        return Result(self.name, plan.finding, verdict, reason, measurements, recommendation, verified,
                      time.monotonic() - started)

    def with_defaults(self, params: dict[str, Any]) -> dict[str, Any]:
        """The experiment's parameters: its defaults, overridden by those the rule or the user gave."""
        out = {key: default for key, (_kind, default, _help) in self.params.items()}
        for key, value in params.items():
            if key in self.params:
                kind = self.params[key][0]
                try:
                    out[key] = kind(value) if kind is not bool else str(value).lower() in ("1", "true", "yes")
                except (TypeError, ValueError):
                    pass
        return out


def _executable(value: Any) -> str | None:
    """meta.json's job_python/python: {"executable": ...} (or a bare path in older records)."""
    if isinstance(value, dict):
        value = value.get("executable")
    return value if isinstance(value, str) and value else None


def median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2

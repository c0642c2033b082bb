"""Doctor's result types: one `CheckResult` per checklist item, and the `DoctorReport` around them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PASS, WARN, FAIL, SKIPPED = "pass", "warn", "fail", "skipped"
STATUSES = (PASS, WARN, FAIL, SKIPPED)
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class CheckResult:
    """One checklist item. `fix` is set whenever status is warn or fail (the command where one exists)."""

    id: str
    title: str
    status: str
    evidence: tuple[str, ...] = ()
    fix: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"bad status {self.status!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "status": self.status, "evidence": list(self.evidence),
                "fix": self.fix, "details": dict(self.details)}


def check(id: str, title: str, status: str, evidence: list[str] | tuple[str, ...] = (), fix: str | None = None,
          **details: Any) -> CheckResult:
    """Shorthand constructor used by the check functions."""
    return CheckResult(id, title, status, tuple(evidence), fix, details)


def skipped(id: str, title: str, why: str, **details: Any) -> CheckResult:
    return CheckResult(id, title, SKIPPED, (why,), None, details)


@dataclass(frozen=True)
class DoctorReport:
    """Every check plus the facts they were made from (for `--format json`)."""

    checks: tuple[CheckResult, ...]
    gpus: tuple[dict[str, Any], ...] = ()
    driver: dict[str, Any] = field(default_factory=dict)
    python: dict[str, Any] = field(default_factory=dict)
    host: dict[str, Any] = field(default_factory=dict)

    def count(self, status: str) -> int:
        return sum(1 for c in self.checks if c.status == status)

    @property
    def exit_code(self) -> int:
        """0 when nothing fails, 1 when something does."""
        return 1 if self.count(FAIL) else 0

    def summary(self) -> dict[str, int]:
        return {**{s: self.count(s) for s in STATUSES}, "exit_code": self.exit_code}

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": SCHEMA_VERSION,
            "summary": self.summary(),
            "checks": [c.to_dict() for c in self.checks],
            "gpus": list(self.gpus),
            "driver": dict(self.driver),
            "python": dict(self.python),
            "host": dict(self.host),
        }

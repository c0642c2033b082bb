"""Findings: the verdicts the engine hands to reports. `to_dict()` is the stable JSON schema."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpufix.evidence import LineRef


@dataclass(frozen=True)
class RenderedFix:
    kind: str
    title: str
    detail: str | None = None
    snippet: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "title": self.title, "detail": self.detail, "snippet": self.snippet}


@dataclass
class Finding:
    """One rule's verdict on the evidence, with the lines that show it and what to do."""

    code: str
    name: str
    title: str
    category: str
    severity: str
    confidence: str
    message: str
    explanation: str
    fields: dict[str, str]
    evidence: list[LineRef]
    evidence_count: int
    fixes: list[RenderedFix]
    experiments: list[dict[str, Any]]
    ranks: list[int] = field(default_factory=list)
    consequence_of: str | None = None
    references: list[str] = field(default_factory=list)
    priority: int = 50
    is_gpu: bool = True
    all_refs: list[LineRef] = field(default_factory=list, repr=False)

    @property
    def first_position(self) -> tuple[str, int]:
        ref = self.evidence[0] if self.evidence else None
        return (ref.source, ref.line) if ref else ("", 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "name": self.name,
            "title": self.title,
            "category": self.category,
            "gpu_related": self.is_gpu,
            "severity": self.severity,
            "confidence": self.confidence,
            "message": self.message,
            "explanation": self.explanation,
            "fields": dict(self.fields),
            "evidence": [ref.to_dict() for ref in self.evidence],
            "evidence_count": self.evidence_count,
            "ranks": list(self.ranks),
            "consequence_of": self.consequence_of,
            "fixes": [fix.to_dict() for fix in self.fixes],
            "experiments": list(self.experiments),
            "references": list(self.references),
        }

"""Findings: the verdicts the engine hands to reports. `to_dict()` is the stable JSON schema."""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs start-up time; annotations are strings (PEP 563)
if TYPE_CHECKING:
    from typing import Any, NamedTuple
else:
    from gpufix.tuples import NamedTuple

from gpufix.evidence import LineRef


class RenderedFix(NamedTuple):
    kind: str
    title: str
    detail: str | None = None
    snippet: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "title": self.title, "detail": self.detail, "snippet": self.snippet}


class Finding(NamedTuple):
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
    ranks: list[int]
    consequence_of: str | None
    references: list[str]
    priority: int
    is_gpu: bool
    all_refs: list[LineRef]  # every matched line, unredacted (never shown or stored); `evidence`: the first few, redacted

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

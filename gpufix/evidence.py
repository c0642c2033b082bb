"""Evidence: what was seen, as plain values. No printing, no rules, no I/O.

NamedTuples, not dataclasses: same immutability, a fraction of the start-up cost.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs start-up time; annotations are strings (PEP 563)
if TYPE_CHECKING:
    from typing import Any, NamedTuple
else:
    from gpufix.tuples import NamedTuple


class LineRef(NamedTuple):
    """One physical line of an input: where it is and what it says (prefix and colours removed)."""

    source: str
    line: int
    text: str
    rank: int | None = None

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"source": self.source, "line": self.line, "text": self.text}
        if self.rank is not None:
            out["rank"] = self.rank
        return out


class Hit(NamedTuple):
    """A pattern's match: the lines it spans and the values its named groups captured."""

    lines: tuple[LineRef, ...]
    groups: dict[str, str]

    @property
    def first(self) -> LineRef:
        return self.lines[0]


class ExceptionRecord(NamedTuple):
    """An exception seen in a traceback (or, from the probe, raised for real).

    `cause` is the index of the exception it was raised while handling, in the same evidence.
    """

    type: str
    message: str
    ref: LineRef
    cause: int | None = None

    @property
    def short_type(self) -> str:
        return self.type.rsplit(".", 1)[-1]


class Evidence:
    """Everything scanned from one diagnosis' inputs.

    `hits` maps a line-pattern index (see rules.RuleSet.line_patterns) to its first matches;
    `hit_counts` keeps the true number when the list was capped to bound memory.
    """

    def __init__(self, sources: list[str] | None = None) -> None:
        self.sources: list[str] = list(sources or [])
        self.hits: dict[int, list[Hit]] = {}
        self.hit_counts: dict[int, int] = {}
        self.exceptions: list[ExceptionRecord] = []
        self.exception_count = 0
        self.lines_read = 0
        self.bytes_read = 0
        self.notes: list[str] = []
        # measured series by name (gpufix.series.SERIES): telemetry, output rate, probe
        self.series: dict[str, list[Any]] = {}
        # facts about the run (rules.model.BUILTIN_FIELDS), offered to every finding's fields
        self.facts: dict[str, str] = {}
        # (source, first line number, text) of each input's last lines (logscan.TAIL_BYTES): what the word
        # model reads when no rule found a GPU failure; empty for a run record, whose verdict is the measurements'
        self.tails: list[tuple[str, int, str]] = []

    def with_rank(self, rank: int) -> Evidence:
        """The same evidence with `rank` on every line no rank prefix placed: the evidence of one
        rank's own file or record (per-rank logs, a Slurm task's record)."""
        def placed(ref: LineRef) -> LineRef:
            return ref if ref.rank is not None else ref._replace(rank=rank)

        out = Evidence()
        out.merge(self)
        out.hits = {index: [Hit(tuple(placed(r) for r in hit.lines), hit.groups) for hit in hits]
                    for index, hits in out.hits.items()}
        out.exceptions = [e._replace(ref=placed(e.ref)) for e in out.exceptions]
        return out

    def merge(self, other: Evidence) -> None:
        """Add another input's evidence (several files of one run are diagnosed together)."""
        offset = len(self.exceptions)
        self.sources.extend(other.sources)
        for index, hits in other.hits.items():
            self.hits.setdefault(index, []).extend(hits)
            self.hit_counts[index] = self.hit_counts.get(index, 0) + other.hit_counts.get(index, 0)
        for record in other.exceptions:
            cause = None if record.cause is None else record.cause + offset
            self.exceptions.append(ExceptionRecord(record.type, record.message, record.ref, cause))
        self.exception_count += other.exception_count
        self.lines_read += other.lines_read
        self.bytes_read += other.bytes_read
        self.notes.extend(other.notes)
        self.tails.extend(other.tails)
        for name, samples in other.series.items():
            self.series.setdefault(name, []).extend(samples)
        for key, value in other.facts.items():
            if key == "framework" and self.facts.get(key, value) != value:
                # inputs naming different frameworks name none together ("" reads as missing in guards), as one
                # log naming several does (logscan.framework_of); a later input cannot bring one back
                self.facts[key] = ""
            else:
                self.facts.setdefault(key, value)

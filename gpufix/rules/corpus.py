"""Score a rule pack on a labelled corpus of real failures, out of sample.

A corpus is a folder of batches, each `<batch>/labels.yaml` (id, label, source, ...) beside
`<batch>/cases/<id>.txt` (fixtures/corpus/README.md), or one such batch at the top (the shared
development corpus). Every case belongs to the development or the validation part by a fixed
hash of its source thread, so all cases of a thread land together and a case added later goes
where its hash says: rules are tuned on the development part and judged on the validation part.

A case's prediction is the category of the diagnosis's root cause; no finding, or a `not_gpu`
root, predicts `other`. `keyword_baseline` is what nineteen keywords in a fixed order would say:
the bar a rule pack has to clear.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import NamedTuple

OTHER = "other"
VALIDATION_SHARE = 50  # percent of the hash space


class Case(NamedTuple):
    id: str
    label: str
    source: str
    path: Path
    part: str  # "dev" or "val"


class Row(NamedTuple):
    case: Case
    predicted: str
    code: str  # the root cause's rule code, "-" for none
    baseline: str
    guessed: bool = False  # the root cause is the word model's (gpufix/wordmodel.py), no rule's


def part_of(source: str) -> str:
    """`val` or `dev`: the first 8 hex digits of sha256(source), mod 100, below VALIDATION_SHARE."""
    digest = hashlib.sha256(source.strip().lower().encode()).hexdigest()
    return "val" if int(digest[:8], 16) % 100 < VALIDATION_SHARE else "dev"


def load_corpus(folder: str | Path) -> list[Case]:
    """Every case of a corpus folder (batches below it, or a single batch at its top)."""
    import yaml

    root = Path(folder)
    label_files = [root / "labels.yaml"] if (root / "labels.yaml").is_file() else sorted(root.glob("*/labels.yaml"))
    cases = []
    for labels in label_files:
        for entry in yaml.safe_load(labels.read_text(encoding="utf-8")) or []:
            case_id = str(entry["id"])
            source = str(entry.get("source") or case_id)
            cases.append(Case(case_id, str(entry["label"]), source, labels.parent / "cases" / f"{case_id}.txt",
                              part_of(source)))
    return cases


# Nineteen keywords in a fixed order, first hit wins: what a reader who knows the usual messages
# would grep for. It is the bar: a rule pack that does no better than this adds nothing.
_KEYWORDS: tuple[tuple[str, str], ...] = (
    ("out of memory", "oom"), ("resource_exhausted", "oom"), ("oom when allocating", "oom"),
    ("xid", "hardware_xid"), ("ecc", "hardware_xid"), ("fallen off the bus", "hardware_xid"),
    ("illegal memory access", "illegal_memory_access"), ("device-side assert", "illegal_memory_access"),
    ("no kernel image", "arch_mismatch"), ("not compatible with the current pytorch", "arch_mismatch"),
    ("nccl", "nccl_hang"), ("timed out", "nccl_hang"),
    ("dataloader worker", "slow_loader"), ("shared memory", "slow_loader"),
    ("same device", "device_mismatch"), ("state_dict", "state_dict_prefix"), ("nan", "nan_loss"),
    ("not compiled with cuda", "cpu_fallback"), ("nvidia driver", "cpu_fallback"),
)


def keyword_baseline(text: str) -> str:
    """The category a fixed-order keyword search gives `text` (`other` when none occurs)."""
    lowered = text.lower()
    for keyword, category in _KEYWORDS:
        if keyword in lowered:
            return category
    return OTHER


def predicted(diagnosis: object) -> tuple[str, str]:
    """(category, rule code) a diagnosis names as root cause: `other` and "-" when it has none, `other` for a
    `not_gpu` root (the corpus's label for ordinary errors)."""
    root = diagnosis.root  # type: ignore[attr-defined]
    if root is None:
        return OTHER, "-"
    return (OTHER if root.category == "not_gpu" else root.category), root.code


def predict_text(text: str, ruleset: object) -> tuple[str, str]:
    """`predicted` for a pasted text (what `gpufix explain` reads from stdin)."""
    import io

    from gpufix.diagnosis import STDIN, diagnose_inputs

    return predicted(diagnose_inputs([STDIN], ruleset, stdin=io.BytesIO(text.encode("utf-8"))))  # type: ignore[arg-type]


def evaluate(cases: list[Case], ruleset: object) -> list[Row]:
    """Diagnose every case with `ruleset` (and the keyword baseline)."""
    from gpufix.diagnosis import diagnose_inputs

    rows = []
    for case in cases:
        diagnosis = diagnose_inputs([str(case.path)], ruleset)  # type: ignore[arg-type]
        category, code = predicted(diagnosis)
        text = case.path.read_bytes().decode("utf-8", "replace")
        guessed = diagnosis.root is not None and "word_probability" in diagnosis.root.fields
        rows.append(Row(case, category, code, keyword_baseline(text), guessed))
    return rows


class Score(NamedTuple):
    gpu_cases: int
    gpu_top1: float  # share of GPU cases whose root cause is the labelled category
    baseline_gpu_top1: float
    ordinary_cases: int
    ordinary_clean: float  # share of `other` cases given no GPU diagnosis
    baseline_ordinary_clean: float


def score(rows: list[Row]) -> Score:
    gpu = [r for r in rows if r.case.label != OTHER]
    ordinary = [r for r in rows if r.case.label == OTHER]

    def share(hits: int, total: int) -> float:
        return hits / total if total else float("nan")

    return Score(
        len(gpu), share(sum(r.predicted == r.case.label for r in gpu), len(gpu)),
        share(sum(r.baseline == r.case.label for r in gpu), len(gpu)),
        len(ordinary), share(sum(r.predicted == OTHER for r in ordinary), len(ordinary)),
        share(sum(r.baseline == OTHER for r in ordinary), len(ordinary)),
    )


def confusion(rows: list[Row], baseline: bool = False) -> dict[tuple[str, str], int]:
    """(label, predicted) -> cases."""
    return Counter((r.case.label, r.baseline if baseline else r.predicted) for r in rows)

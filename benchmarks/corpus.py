"""Per-category precision and recall of the built-in pack on the labelled corpus.

Reads ../shared/corpus (labels.yaml + cases/NNN.txt) when present. A case's prediction is the
category of the first (root-cause) finding; no finding, or a `not_gpu` root, predicts `other`.
Targets: >= 95% top-1 on the GPU categories, and no GPU diagnosis for the `other` cases.
Run: python benchmarks/corpus.py [CORPUS_DIR] [-v]
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import yaml

from gpufix.explain import explain
from gpufix.rules.loader import load_ruleset

DEFAULT = Path(__file__).resolve().parent.parent.parent / "shared" / "corpus"


def evaluate(corpus: Path) -> list[tuple[str, str, str, str]]:
    """(case id, label, predicted category, root code) for every labelled case."""
    labels = yaml.safe_load((corpus / "labels.yaml").read_text())
    pack = load_ruleset()
    rows = []
    for case in labels:
        path = corpus / "cases" / f"{case['id']}.txt"
        findings = explain([str(path)], pack).findings
        root = findings[0] if findings else None
        predicted = root.category if root and root.category != "not_gpu" else "other"
        rows.append((str(case["id"]), case["label"], predicted, root.code if root else "-"))
    return rows


def report(rows: list[tuple[str, str, str, str]], verbose: bool = False) -> float:
    labels = sorted({label for _, label, _, _ in rows} | {p for _, _, p, _ in rows})
    tp, fp, fn = Counter(), Counter(), Counter()
    for _, label, predicted, _ in rows:
        if label == predicted:
            tp[label] += 1
        else:
            fp[predicted] += 1
            fn[label] += 1
    print(f"{'category':<24}{'cases':>6}{'precision':>11}{'recall':>9}")
    for label in labels:
        cases = tp[label] + fn[label]
        precision = tp[label] / (tp[label] + fp[label]) if tp[label] + fp[label] else float("nan")
        recall = tp[label] / cases if cases else float("nan")
        print(f"{label:<24}{cases:>6}{precision:>11.2f}{recall:>9.2f}")
    gpu = [r for r in rows if r[1] != "other"]
    gpu_top1 = sum(r[1] == r[2] for r in gpu) / len(gpu) if gpu else float("nan")
    ordinary = [r for r in rows if r[1] == "other"]
    gpu_on_ordinary = sum(r[2] != "other" for r in ordinary)
    print(f"\nGPU categories top-1: {gpu_top1:.1%} of {len(gpu)} cases (target >= 95%)")
    print(f"ordinary errors given a GPU diagnosis: {gpu_on_ordinary} of {len(ordinary)} (target 0)")
    for case_id, label, predicted, code in rows:
        if verbose or label != predicted:
            print(f"  {'ok ' if label == predicted else 'MISS'} {case_id}: label {label}, got {predicted} ({code})")
    return gpu_top1


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "-v"]
    corpus = Path(args[0]) if args else DEFAULT
    if not (corpus / "labels.yaml").is_file():
        print(f"no corpus at {corpus} (expected labels.yaml and cases/)")
        sys.exit(0)
    report(evaluate(corpus), verbose="-v" in sys.argv)


if __name__ == "__main__":
    main()

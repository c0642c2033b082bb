"""How often the built-in rule pack names the right root cause on real users' failures.

Reads the real-world corpus in fixtures/corpus (README there: sources, labels, the split) and,
when it is there, the shared development corpus ../shared/corpus. For each part it prints top-1 per
category for gpufix and for a fixed-order keyword search side by side, the confusion matrix, the
share of ordinary errors kept clean (no GPU diagnosis), the GPU top-1 margin over keywords and what the word model
decided where no rule found a GPU failure; then
the same two scores on the batches sampled in search order (`rep*`), and, for each audit file the corpus
has, an expert's text-only reading of a random validation sample beside gpufix on the same cases.

Rules are tuned on the development part only: `-v` lists the development part's misses, never the
validation part's (`--show-validation-misses` exists for the final report, not for tuning).
Targets on the validation part: GPU top-1 >= 95%, ordinary errors clean >= 95%, GPU top-1 at least
15 points above the keyword baseline.

Run: python benchmarks/corpus.py [-v] [--dev-only] [--show-validation-misses] [CORPUS_DIR ...]
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

from gpufix.rules.corpus import OTHER, Row, confusion, evaluate, load_corpus, score
from gpufix.rules.loader import load_ruleset

HERE = Path(__file__).resolve().parent
REAL = HERE.parent / "fixtures" / "corpus"
SHARED = HERE.parent.parent / "shared" / "corpus"
REPRESENTATIVE = "rep"  # batch-name prefix of the batches sampled in search order (fixtures/corpus/README.md)
SHORT = {"oom": "oom", "cpu_fallback": "cpu", "arch_mismatch": "arch", "illegal_memory_access": "ima",
         "nccl_hang": "nccl", "slow_loader": "load", "device_mismatch": "dev", "state_dict_prefix": "ckpt",
         "nan_loss": "nan", "hardware_xid": "xid", "hang": "hang", "throughput": "perf", OTHER: "other"}


def per_category(rows: list[Row]) -> None:
    labels = sorted({r.case.label for r in rows}, key=lambda c: (c == OTHER, c))
    print(f"  {'category':<24}{'cases':>6}{'gpufix':>9}{'keywords':>10}")
    for label in labels:
        mine = [r for r in rows if r.case.label == label]
        hits = sum(r.predicted == label for r in mine) / len(mine)
        base = sum(r.baseline == label for r in mine) / len(mine)
        print(f"  {label:<24}{len(mine):>6}{hits:>9.0%}{base:>10.0%}")


def matrix(rows: list[Row], baseline: bool = False) -> None:
    counts = confusion(rows, baseline)
    labels = sorted({r.case.label for r in rows} | {p for _, p in counts}, key=lambda c: (c == OTHER, c))
    print("  label \\ predicted " + "".join(f"{SHORT.get(p, p[:5]):>6}" for p in labels))
    for label in labels:
        if not any(r.case.label == label for r in rows):
            continue
        cells = "".join(f"{counts.get((label, p), 0) or '.':>6}" for p in labels)
        print(f"  {SHORT.get(label, label):<18}{cells}")


def interval(share: float, cases: int, z: float = 1.96) -> str:
    """Wilson's 95% interval of a share measured on `cases` cases: how far apart two figures must be to differ
    (on about 1,700 GPU failures a point either way is within the noise of which threads were sampled)."""
    if not cases:
        return ""
    centre = (share + z * z / (2 * cases)) / (1 + z * z / cases)
    half = z * math.sqrt(share * (1 - share) / cases + z * z / (4 * cases * cases)) / (1 + z * z / cases)
    return f"(95% interval {centre - half:.1%}-{centre + half:.1%})"


def report(name: str, rows: list[Row], misses: bool) -> None:
    s = score(rows)
    print(f"\n== {name}: {len(rows)} cases ({s.gpu_cases} GPU failures, {s.ordinary_cases} ordinary errors)")
    per_category(rows)
    print("  confusion (rows: label, columns: gpufix's root cause):")
    matrix(rows)
    print(f"  GPU top-1            gpufix {s.gpu_top1:6.1%}   keywords {s.baseline_gpu_top1:6.1%}   "
          f"margin {100 * (s.gpu_top1 - s.baseline_gpu_top1):+.1f} points   {interval(s.gpu_top1, s.gpu_cases)}")
    print(f"  ordinary kept clean  gpufix {s.ordinary_clean:6.1%}   keywords {s.baseline_ordinary_clean:6.1%}"
          f"   (false GPU diagnoses: {round(s.ordinary_cases * (1 - s.ordinary_clean))} of {s.ordinary_cases})"
          f"   {interval(s.ordinary_clean, s.ordinary_cases)}")
    guessed = [r for r in rows if r.guessed]
    if guessed:
        right = sum(r.predicted == r.case.label for r in guessed)
        ordinary = sum(r.case.label == OTHER for r in guessed)
        print(f"  word model (no rule found a GPU failure): root cause of {len(guessed)} cases: {right} right, "
              f"{len(guessed) - right - ordinary} GPU failures in another category, {ordinary} ordinary errors")
    if misses:
        for r in rows:
            if r.predicted != r.case.label:
                print(f"    MISS {r.case.id:<16} label {r.case.label:<22} got {r.predicted:<22} ({r.code})  {r.case.source}")


def representative(rows: list[Row]) -> None:
    """The same scores on the batches sampled as the searches returned them (`rep*`, README: Sampling):
    the other batches were collected by category, hard cases and near misses on purpose."""
    for part, name in (("dev", "development"), ("val", "validation")):
        mine = [r for r in rows if r.case.part == part and r.case.id.startswith(REPRESENTATIVE)]
        if mine:
            s = score(mine)
            print(f"  representative batches only, {name} part, {len(mine)} cases: GPU top-1 gpufix {s.gpu_top1:.1%} "
                  f"keywords {s.baseline_gpu_top1:.1%}; ordinary kept clean gpufix {s.ordinary_clean:.1%} "
                  f"keywords {s.baseline_ordinary_clean:.1%}")


def reading(rows: list[Row], audit: Path) -> None:
    """How an expert does on a random validation sample from the pasted text alone (README: Audits):
    the ceiling a text-only diagnosis can reach with these thread-settled labels, beside gpufix's score."""
    import yaml

    reader = {str(e["id"]): e for e in yaml.safe_load(audit.read_text(encoding="utf-8")) or []}
    mine = [r for r in rows if r.case.id in reader]
    if not mine:
        return

    def shares(cases: list[Row], said: Callable[[Row], str]) -> str:
        gpu = [r for r in cases if r.case.label != OTHER]
        ordinary = [r for r in cases if r.case.label == OTHER]
        top1 = sum(said(r) == r.case.label for r in gpu) / max(1, len(gpu))
        clean = sum(said(r) == OTHER for r in ordinary) / max(1, len(ordinary))
        return f"GPU top-1 {top1:.1%}, ordinary kept clean {clean:.1%}"

    sure = [r for r in mine if reader[r.case.id]["sure"]]

    def read(r: Row) -> str:
        return str(reader[r.case.id]["reader"])

    # text-only-reading.yaml drew from the whole validation part, text-only-reading-<batches>.yaml from those batches
    drawn = audit.stem.removeprefix("text-only-reading").lstrip("-")
    of = f" of {drawn}" if drawn else ""
    print(f"  text-only reading, {len(mine)} random validation cases{of}: reader {shares(mine, read)};"
          f" gpufix {shares(mine, lambda r: r.predicted)}")
    print(f"    on the {len(sure)} the reader found settled by the text: reader {shares(sure, read)};"
          f" gpufix {shares(sure, lambda r: r.predicted)}")


def main(argv: list[str]) -> int:
    verbose = "-v" in argv
    show_val = "--show-validation-misses" in argv
    dev_only = "--dev-only" in argv  # for tuning: not even the validation part's totals
    folders = [Path(a) for a in argv if not a.startswith("-")] or [REAL]
    pack = load_ruleset()
    for folder in folders:
        cases = load_corpus(folder)
        started = time.perf_counter()
        rows = evaluate(cases, pack)
        took = time.perf_counter() - started
        print(f"# {folder}: {len(cases)} cases diagnosed in {took:.1f} s ({1000 * took / max(1, len(cases)):.0f} ms each)")
        report("development part (rules are tuned on it)", [r for r in rows if r.case.part == "dev"], verbose)
        if not dev_only:
            report("validation part (never tuned on)", [r for r in rows if r.case.part == "val"], show_val)
        representative(rows if not dev_only else [r for r in rows if r.case.part == "dev"])
        audits = [] if dev_only else sorted((folder / "audits").glob("text-only-reading*.yaml"),
                                            key=lambda a: (a.stem != "text-only-reading", a.name))  # the first first
        for audit in audits:
            reading(rows, audit)
    if not [a for a in argv if not a.startswith("-")] and (SHARED / "labels.yaml").is_file():
        rows = evaluate(load_corpus(SHARED), pack)
        report(f"shared development corpus {SHARED}", rows, True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

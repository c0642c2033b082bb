"""Train the word model (gpufix/wordmodel.py) and write it into the built-in rule pack.

    python -m gpufix.rules.wordmodel_train [--out rules/wordmodel.json] [--check]

Training data: the *development* part of the real-world corpus (fixtures/corpus; never a validation case)
and the wording inventories (fixtures/wordings, at half weight: single lines, not real logs). Model:
multinomial logistic regression over binary word and word-pair features, each excerpt's vector of unit
length, L2-regularised, fitted with L-BFGS on the full batch from zeros (deterministic on one machine).

The threshold is measured, not chosen: five-fold cross-validation on the development part, folds by
source thread, gives each development case a probability from a model that never saw its thread; the
threshold is the smallest probability at which at most FALSE_ALARM_SHARE of the development part's
ordinary errors that the rules keep clean would get a GPU guess. The cross-validated figures are
written beside the weights (`meta`). `--check` retrains and exits 1 when the shipped file differs
from what the corpus gives now (the test suite checks the cheaper digest instead).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from gpufix.rules.corpus import OTHER, Case, load_corpus
from gpufix.logscan import TAIL_BYTES
from gpufix.wordmodel import FORMAT, MODEL_FILE, features

ROOT = Path(__file__).resolve().parent.parent.parent
CORPUS = ROOT / "fixtures" / "corpus"
WORDINGS = ROOT / "fixtures" / "wordings"
OUT = ROOT / "rules" / MODEL_FILE

MIN_CASES = 2  # a feature seen in fewer training texts is noise
L2 = 2e-5  # cross-validated on the development part
INVENTORY_WEIGHT = 0.5
FOLDS = 5
FALSE_ALARM_SHARE = 0.005
KEEP_WEIGHT = 0.05  # smaller weights are dropped from the shipped file (they change about 1 decision in 1,000)


def case_text(case: Case) -> str:
    return case.path.read_bytes()[-TAIL_BYTES:].decode("utf-8", "replace")


def inventory() -> list[tuple[str, str]]:
    import yaml

    pairs = []
    for path in sorted(WORDINGS.glob("*.yaml")):
        for entry in yaml.safe_load(path.read_text(encoding="utf-8")) or []:
            pairs.append((str(entry["text"]), str(entry["category"])))
    return pairs


def training_digest(cases: list[Case], wordings: list[tuple[str, str]]) -> str:
    """What the model was trained on, as one sha256: each development case's id, label and text, each wording."""
    h = hashlib.sha256()
    for case in sorted(cases, key=lambda c: (c.path.parent.parent.name, c.id)):
        h.update(f"{case.path.parent.parent.name}/{case.id}\0{case.label}\0".encode())
        h.update(case.path.read_bytes())
    for text, category in wordings:
        h.update(f"\0{category}\0{text}".encode())
    return h.hexdigest()


def development(corpus: Path = CORPUS) -> list[Case]:
    return [c for c in load_corpus(corpus) if c.part == "dev"]


def _fold(case: Case) -> int:
    # a second slice of the same hash that split the corpus: all cases of a thread in one fold
    return int(hashlib.sha256(case.source.strip().lower().encode()).hexdigest()[8:16], 16) % FOLDS


def _matrix(rows: list[set[str]], vocab: dict[str, int]) -> Any:
    import torch

    r, c, values = [], [], []
    for i, found in enumerate(rows):
        cols = [vocab[f] for f in found if f in vocab]
        r += [i] * len(cols)
        c += cols
        # every feature of the text counts towards its length, known or not, so that dropping small weights
        # from the shipped file (KEEP_WEIGHT) leaves every other feature's share as it was
        values += [1 / math.sqrt(len(found))] * len(cols) if cols else []
    return torch.sparse_coo_tensor([r, c], values, (len(rows), len(vocab))).coalesce()


def fit(rows: list[set[str]], labels: list[int], weights: list[float], classes: int) -> tuple[dict[str, int], Any, Any]:
    """(vocabulary, weights [features x classes], bias) of the regularised logistic regression."""
    import torch

    seen = Counter(f for found in rows for f in found)
    vocab = {f: i for i, f in enumerate(sorted(f for f, n in seen.items() if n >= MIN_CASES))}
    x = _matrix(rows, vocab)
    y = torch.tensor(labels)
    w = torch.tensor(weights, dtype=torch.float64)
    coef = torch.zeros(len(vocab), classes, dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(classes, dtype=torch.float64, requires_grad=True)
    x = x.to(torch.float64)
    optimiser = torch.optim.LBFGS([coef, bias], max_iter=400, history_size=20, line_search_fn="strong_wolfe")

    def loss() -> Any:
        optimiser.zero_grad()
        logits = torch.sparse.mm(x, coef) + bias
        value = (torch.nn.functional.cross_entropy(logits, y, reduction="none") * w).sum() / w.sum()
        value = value + L2 * (coef ** 2).sum()
        value.backward()
        return value

    optimiser.step(loss)
    return vocab, coef.detach(), bias.detach()


def _probabilities(model: tuple[dict[str, int], Any, Any], rows: list[set[str]]) -> Any:
    import torch

    vocab, coef, bias = model
    return torch.softmax(torch.sparse.mm(_matrix(rows, vocab).to(torch.float64), coef) + bias, 1)


def _rule_clean(cases: list[Case]) -> list[bool]:
    """Per case: the rules find no GPU failure in it (where the word model would be asked)."""
    from gpufix.diagnosis import diagnose_inputs
    from gpufix.rules.loader import load_ruleset

    ruleset = load_ruleset(word_model=False)
    return [not any(f.is_gpu for f in diagnose_inputs([str(c.path)], ruleset).findings) for c in cases]


def train(corpus: Path = CORPUS, log: Any = print) -> dict[str, Any]:
    """The model file's content (see the module docstring)."""
    import torch

    torch.manual_seed(0)
    cases = development(corpus)
    wordings = inventory()
    categories = sorted({c.label for c in cases} | {cat for _t, cat in wordings if cat != "not_gpu"})
    index = {c: i for i, c in enumerate(categories)}
    rows = [features(case_text(c)) for c in cases]
    labels = [index[c.label] for c in cases]
    extra = [features(t) for t, cat in wordings if cat in index]
    extra_labels = [index[cat] for _t, cat in wordings if cat in index]
    other = index[OTHER]

    log(f"cross-validating on {len(cases)} development cases ({FOLDS} folds by source thread)")
    folds = [_fold(c) for c in cases]
    held_out = torch.zeros(len(cases), len(categories), dtype=torch.float64)
    for k in range(FOLDS):
        train_at = [i for i in range(len(cases)) if folds[i] != k]
        test_at = [i for i in range(len(cases)) if folds[i] == k]
        model = fit([rows[i] for i in train_at] + extra, [labels[i] for i in train_at] + extra_labels,
                    [1.0] * len(train_at) + [INVENTORY_WEIGHT] * len(extra), len(categories))
        held_out[test_at] = _probabilities(model, [rows[i] for i in test_at])
    guess = held_out.clone()
    guess[:, other] = 0
    confidence, guessed = guess.max(1)

    clean = _rule_clean(cases)
    quiet = sorted((confidence[i].item() for i, c in enumerate(cases) if c.label == OTHER and clean[i]), reverse=True)
    allowed = int(FALSE_ALARM_SHARE * len(quiet))
    threshold = round(quiet[allowed] + 1e-4, 4) if len(quiet) > allowed else 0.5
    fired = [i for i in range(len(cases)) if clean[i] and confidence[i].item() >= threshold]
    gpu = [i for i, c in enumerate(cases) if c.label != OTHER]
    cv = {
        "threshold": threshold,
        "ordinary_kept_clean_by_rules": len(quiet),
        "false_alarms": sum(1 for i in fired if cases[i].label == OTHER),
        "rule_misses_without_gpu_finding": sum(1 for i in gpu if clean[i]),
        "rescued": sum(1 for i in fired if cases[i].label != OTHER and guessed[i].item() == labels[i]),
        "wrong_category": sum(1 for i in fired if cases[i].label != OTHER and guessed[i].item() != labels[i]),
        "alone_gpu_top1": round(sum(held_out[i].argmax().item() == labels[i] for i in gpu) / len(gpu), 4),
        "alone_gpu_sure_and_right": round(sum(
            1 for i in gpu if confidence[i].item() >= threshold and guessed[i].item() == labels[i]) / len(gpu), 4),
    }
    log("cross-validated: " + ", ".join(f"{k} {v}" for k, v in cv.items()))

    vocab, coef, bias = fit(rows + extra, labels + extra_labels,
                            [1.0] * len(rows) + [INVENTORY_WEIGHT] * len(extra), len(categories))
    weights: dict[str, list[float]] = {}
    for feature, row in sorted(vocab.items()):
        pairs: list[float] = []
        for c, value in enumerate(coef[row].tolist()):
            if abs(value) >= KEEP_WEIGHT:
                pairs += [c, round(value, 3)]
        if pairs:
            weights[feature] = pairs
    log(f"{len(weights)} of {len(vocab)} features kept")
    return {
        "format": FORMAT,
        "categories": categories,
        "other": OTHER,
        "bias": [round(b, 4) for b in bias.tolist()],
        "threshold": threshold,
        "meta": {
            "trained_on": {"development_cases": len(cases), "wordings": len(extra),
                           "digest": training_digest(cases, wordings)},
            "l2": L2, "inventory_weight": INVENTORY_WEIGHT, "min_cases": MIN_CASES, "keep_weight": KEEP_WEIGHT,
            "false_alarm_share": FALSE_ALARM_SHARE, "cross_validation": cv,
        },
        "weights": weights,
    }


def dump(model: dict[str, Any]) -> str:
    # one feature per line: a retrained model's diff says which words moved
    head = {k: v for k, v in model.items() if k != "weights"}
    body = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in model["weights"].items())
    return json.dumps(head, indent=1)[:-2] + ',\n "weights": {\n' + body + "\n }\n}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--check", action="store_true", help="retrain and compare with the shipped file")
    args = parser.parse_args(argv)
    text = dump(train(log=lambda s: print(s, file=sys.stderr)))
    if args.check:
        same = args.out.is_file() and args.out.read_text(encoding="utf-8") == text
        print("the shipped word model is what the corpus gives" if same else f"{args.out} is stale: retrain")
        return 0 if same else 1
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

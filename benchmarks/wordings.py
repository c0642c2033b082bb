"""How many known framework and library wordings gpufix puts in the category their writers gave them.

Reads fixtures/wordings/*.yaml (README there: lists written from knowledge, not users' logs) and
diagnoses each text alone, as a one-line or short paste, with the rules alone (the word model learnt from these
lists, so it is left out). Prints the agreement per file and per
category, and with -v each disagreement (the writer's label, gpufix's, the rule, how sure the writer
was of the words).

Run: python benchmarks/wordings.py [-v]
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import yaml

from gpufix.rules.corpus import OTHER, predict_text
from gpufix.rules.loader import load_ruleset

FOLDER = Path(__file__).resolve().parent.parent / "fixtures" / "wordings"


def main(argv: list[str]) -> int:
    verbose = "-v" in argv
    # the rules' coverage: the word model (gpufix/wordmodel.py) was trained on these very wordings
    ruleset = load_ruleset(word_model=False)
    total, agree = Counter(), Counter()
    for path in sorted(FOLDER.glob("*.yaml")):
        entries = yaml.safe_load(path.read_text(encoding="utf-8")) or []
        hits = 0
        for entry in entries:
            text, want = str(entry["text"]), str(entry["category"])
            got, code = predict_text(text, ruleset)
            total[want] += 1
            if got == want:
                agree[want] += 1
                hits += 1
            elif verbose:
                print(f"    {path.stem:<18} want {want:<22} got {got:<22} {code:<7}"
                      f" [{entry.get('sure')}] {text[:140]!r}")
        print(f"  {path.stem:<22}{hits:>5} of {len(entries):<5}{hits / len(entries):>7.1%}")
    print(f"  {'category':<22}")
    for category in sorted(total, key=lambda c: (c == OTHER, c)):
        print(f"  {category:<22}{agree[category]:>5} of {total[category]:<5}{agree[category] / total[category]:>7.1%}")
    print(f"  {'all':<22}{sum(agree.values()):>5} of {sum(total.values()):<5}"
          f"{sum(agree.values()) / sum(total.values()):>7.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

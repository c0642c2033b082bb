"""Does a diagnosis survive the ways people paste a log? A check of generalisation that needs no new data.

Takes the development part's GPU failures that the rule pack diagnoses right (fixtures/corpus, README
there) and re-diagnoses each after one transformation a real paste goes through: every line behind a
logging or log-collector prefix, a torchrun rank prefix or a "> " quote; CRLF line ends; ANSI colours;
progress bars and a logger's farewell around it; a short paste folded into one line (an issue title);
only the last exception line (a title-only report); lines hard-wrapped at 100 columns by a terminal.
It prints, per transformation, how many cases keep their category. A drop names a rule that matches
the layout of the examples it came from rather than the program's wording.

Only the development part is read (rules are tuned on it; the validation part stays unseen).

Run: python benchmarks/robustness.py [-v]   (-v lists the cases each transformation loses)
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable
from pathlib import Path

from gpufix.diagnosis import STDIN, diagnose_inputs
from gpufix.rules.corpus import OTHER, load_corpus, predict_text
from gpufix.rules.loader import load_ruleset

CORPUS = Path(__file__).resolve().parent.parent / "fixtures" / "corpus"


def _each_line(prefix: Callable[[int], str]) -> Callable[[str], str]:
    return lambda text: "\n".join(prefix(i) + line for i, line in enumerate(text.split("\n")))


def _wrap(text: str, width: int = 100) -> str:
    out = []
    for line in text.split("\n"):
        while len(line) > width:
            out.append(line[:width])
            line = line[width:]
        out.append(line)
    return "\n".join(out)


def _last_exception_line(text: str, ruleset: object) -> str | None:
    exceptions = diagnose(text, ruleset).evidence.exceptions
    if not exceptions or text.count("\n") < 2:
        return None
    last = exceptions[-1]
    return f"{last.type}: {last.message}".split("\n")[0] + "\n"


TRANSFORMS: dict[str, Callable[[str], str | None]] = {
    "logging prefix": _each_line(lambda i: f"2024-03-0{1 + i % 9} 12:3{i % 10}:05,123 - INFO - "),
    "glog prefix": _each_line(lambda i: "E0302 12:30:05.123456 4242 train.cc:12] "),
    "rank prefix": _each_line(lambda i: "[rank1]: "),
    "quoted '> '": _each_line(lambda i: "> "),
    "CRLF": lambda t: t.replace("\n", "\r\n"),
    "ANSI colour": _each_line(lambda i: "\x1b[31m"),
    "noise around": lambda t: ("Epoch 1/10\n  3%|▎         | 12/400 [00:05<02:41,  2.40it/s, loss=0.693]\n" + t
                               + "\nwandb: Waiting for W&B process to finish... (failed 1).\n"),
    "one line": lambda t: " ".join(x.strip() for x in t.split("\n") if x.strip()) if t.count("\n") <= 3 else None,
    "wrapped at 100": _wrap,
}


def diagnose(text: str, ruleset: object):  # type: ignore[no-untyped-def]
    return diagnose_inputs([STDIN], ruleset, stdin=io.BytesIO(text.encode("utf-8")))  # type: ignore[arg-type]


def category(text: str, ruleset: object) -> str:
    return predict_text(text, ruleset)[0]


def main(argv: list[str]) -> int:
    verbose = "-v" in argv
    ruleset = load_ruleset()
    cases = []
    for case in load_corpus(CORPUS):
        if case.part != "dev" or case.label == OTHER:
            continue
        text = case.path.read_bytes().decode("utf-8", "replace")
        if category(text, ruleset) == case.label:
            cases.append((case, text))
    print(f"{len(cases)} development GPU failures diagnosed right; kept after each transformation:")
    transforms = dict(TRANSFORMS, **{"last exception line": lambda t: _last_exception_line(t, ruleset)})
    for name, transform in transforms.items():
        tried, lost = 0, []
        for case, text in cases:
            changed = transform(text)
            if changed is None:
                continue
            tried += 1
            got = category(changed, ruleset)
            if got != case.label:
                lost.append(f"{case.id} {case.label} -> {got}")
        kept = tried - len(lost)
        print(f"  {name:<22}{kept:>5} of {tried:<5}{kept / tried if tried else float('nan'):>7.1%}")
        if verbose:
            for line in lost:
                print(f"      lost {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

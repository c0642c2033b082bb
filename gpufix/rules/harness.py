"""Run each rule's own examples, as `gpufix rules test` and from pytest.

`match` examples must fire the rule, `no_match` near misses must not, and `known_misses` must
still miss (a strict xfail: when one starts matching, move it to `match`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufix.engine import evaluate
from gpufix.logscan import LogScanner
from gpufix.rules.model import Rule, RuleSet


@dataclass(frozen=True)
class ExampleResult:
    code: str
    kind: str  # match | no_match | known_misses
    index: int
    ok: bool
    text: str | dict[str, Any]

    @property
    def problem(self) -> str:
        what = {
            "match": "match example did not fire the rule",
            "no_match": "no_match example fired the rule",
            "known_misses": "known miss now matches: move it to `match`",
        }[self.kind]
        shown = self.text if isinstance(self.text, str) else "measurements: " + ", ".join(self.text.get("series", {}))
        first = shown.strip().splitlines()[0][:100] if shown.strip() else ""
        return f"{self.code} examples.{self.kind}[{self.index}]: {what}: {first!r}"


def fires(rule: Rule, ruleset: RuleSet, example: str | dict[str, Any]) -> bool:
    """Whether `rule` alone fires on an example (the other rules cannot hide or suppress it).

    An example is a log text, or measurements `{series: {...}, interval_s, log}` (see series.py).
    """
    alone = ruleset.subset([rule])
    text = example if isinstance(example, str) else example.get("log", "")
    evidence = LogScanner.for_rules(alone).scan_bytes(text.encode("utf-8"), f"<{rule.code} example>")
    if isinstance(example, dict):
        from gpufix.series import example_series

        evidence.series.update(example_series(example["series"], float(example.get("interval_s", 1.0))))
    return any(f.code == rule.code for f in evaluate(evidence, alone)[0])


def run_examples(ruleset: RuleSet, rules: list[Rule] | None = None) -> list[ExampleResult]:
    results = []
    for rule in rules if rules is not None else ruleset.rules:
        for kind, texts, want in (
            ("match", rule.examples.match, True),
            ("no_match", rule.examples.no_match, False),
            ("known_misses", rule.examples.known_misses, False),
        ):
            for index, text in enumerate(texts):
                results.append(ExampleResult(rule.code, kind, index, fires(rule, ruleset, text) == want, text))
    return results

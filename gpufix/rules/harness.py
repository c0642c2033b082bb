"""Run each rule's own examples, as `gpufix rules test` and from pytest.

`match` examples must fire the rule, `no_match` near misses must not, and `known_misses` must
still miss (a strict xfail: when one starts matching, move it to `match`).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufix.engine import diagnose
from gpufix.logscan import LogScanner
from gpufix.rules.model import Rule, RuleSet


@dataclass(frozen=True)
class ExampleResult:
    code: str
    kind: str  # match | no_match | known_misses
    index: int
    ok: bool
    text: str

    @property
    def problem(self) -> str:
        what = {
            "match": "match example did not fire the rule",
            "no_match": "no_match example fired the rule",
            "known_misses": "known miss now matches: move it to `match`",
        }[self.kind]
        first = self.text.strip().splitlines()[0][:100] if self.text.strip() else ""
        return f"{self.code} examples.{self.kind}[{self.index}]: {what}: {first!r}"


def fires(rule: Rule, ruleset: RuleSet, text: str) -> bool:
    """Whether `rule` alone fires on `text` (the other rules cannot hide or suppress it)."""
    alone = ruleset.subset([rule])
    evidence = LogScanner.for_rules(alone).scan_bytes(text.encode("utf-8"), f"<{rule.code} example>")
    return any(f.code == rule.code for f in diagnose(evidence, alone))


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

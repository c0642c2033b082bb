"""The lean rule cache loads as a LazyRuleSet: rules are built when read, and a diagnosis reads
only those that can match. It must diagnose exactly as the fully built pack does."""

from __future__ import annotations

from pathlib import Path

from gpufix.diagnosis import diagnose, evidence_from_text
from gpufix.logscan import LogScanner
from gpufix.rules.corpus import load_corpus
from gpufix.rules.loader import load_ruleset
from gpufix.rules.model import LazyRuleSet, RuleSet

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "corpus"
QUICKSTART = Path(__file__).resolve().parents[2] / "fixtures" / "quickstart" / "oom-traceback.txt"


def _both() -> tuple[RuleSet, RuleSet]:
    load_ruleset()  # writes the caches when this session has none yet
    lazy, full = load_ruleset(), load_ruleset(full=True)
    assert isinstance(lazy, LazyRuleSet) and not isinstance(full, LazyRuleSet)
    return lazy, full


def test_lazy_and_built_packs_give_the_same_diagnoses_on_the_corpus() -> None:
    lazy, full = _both()
    assert lazy.line_patterns == full.line_patterns
    assert lazy.line_literals() == full.line_literals()
    cases = load_corpus(CORPUS)[::4]  # a quarter of ~2900 real logs, every batch represented
    lazy_scan, full_scan = LogScanner.for_rules(lazy), LogScanner.for_rules(full)
    differ = []
    for case in cases:
        a = diagnose(evidence_from_text([str(case.path)], lazy_scan), lazy)
        b = diagnose(evidence_from_text([str(case.path)], full_scan), full)
        if [(f.code, f.message, f.confidence) for f in a.findings] != [(f.code, f.message, f.confidence) for f in b.findings] \
                or a.notes != b.notes:
            differ.append(case.id)
    assert len(cases) > 500 and not differ, differ


def test_a_traceback_builds_only_the_rules_that_can_match() -> None:
    lazy, full = _both()
    assert isinstance(lazy, LazyRuleSet)
    diagnosis = diagnose(evidence_from_text([str(QUICKSTART)], LogScanner.for_rules(lazy)), lazy)
    assert diagnosis.findings and diagnosis.findings[0].category == "oom"
    built = sum(rule is not None for rule in lazy._built)
    # rules with exception or series matchers are always read; a line-pattern rule only when one of its lines occurred
    assert built < len(full.rules) // 2, built
    # everything stays reachable: by code, in order, and as the whole list
    assert set(lazy.by_code) == {rule.code for rule in full.rules}
    assert [rule.code for rule in lazy.rules] == [rule.code for rule in full.rules]
    assert lazy.get("mem001").code == "MEM001" and lazy.get("mem001").with_details().fixes == full.get("MEM001").fixes


def test_what_a_rule_needs_is_a_necessary_condition_never_a_guess() -> None:
    from gpufix.evidence import ExceptionRecord, LineRef
    from gpufix.rules.literals import required_literals
    from gpufix.rules.model import Rule, needs, pattern_key, series_key

    base = {"code": "USR001", "name": "x", "title": "t", "category": "oom", "severity": "error",
            "confidence": "low", "status": "preview", "message": ["m"], "explanation": "e", "fixes": []}

    def rule(code: str, match: dict) -> Rule:  # type: ignore[type-arg]
        return Rule.from_dict({**base, "code": code, "match": match})

    rules = [
        # a group of exclusions alone holds on text without any of the rule's matchers: always evaluated
        rule("USR001", {"any": [{"none": [{"line": "XX"}]}, {"line": "AA"}]}),
        # every `all` child must hold: one of them is enough to require
        rule("USR002", {"all": [{"line": "AA"}, {"line": "BB"}]}),
        # one of the `any` children must hold: the union of what each needs; exclusions add nothing
        rule("USR003", {"any": [{"line": "AA"}, {"all": [{"line": "BB"}, {"line": "CC"}]}], "none": [{"line": "DD"}]}),
        # a line or an exception whose type and message have the patterns' literals
        rule("USR004", {"any": [{"line": "AA"}, {"exception": "KeyError", "message": "no such layer"}]}),
        # a series condition needs its series to have samples: a pasted log (no telemetry) skips the rule, and a
        # series with a few samples still gets the rule evaluated (its "not evaluated" note must not be lost)
        rule("USR005", {"all": [{"series": "gpu.memory_used_mib", "agg": "max", "window": "all", "op": "<",
                                 "value": 600, "per": "none", "min_samples": 30}]}),
    ]
    pack = RuleSet(rules)
    for key in ("KeyError", "no such layer"):
        pack.literals[pattern_key(key, False)] = required_literals(key, False)
    index = pack._line_index
    aa, bb = index[("AA", False)], index[("BB", False)]
    pair = (pattern_key("KeyError", False), pattern_key("no such layer", False))
    assert [needs(r, index) for r in rules] == [
        None, (frozenset([aa]), ()), (frozenset([aa, bb]), ()), (frozenset([aa]), (pair,)),
        (frozenset([series_key("gpu.memory_used_mib")]), ())]

    def record(type_: str, message: str) -> ExceptionRecord:
        return ExceptionRecord(type_, message, LineRef("log", 1, f"{type_}: {message}"))

    def codes(lines: set[int | str], exceptions: list[ExceptionRecord]) -> list[str]:
        return [r.code for r in pack.candidates(lines, exceptions)]

    assert codes(set(), []) == ["USR001"]
    assert codes({series_key("gpu.memory_used_mib")}, []) == ["USR001", "USR005"]
    assert codes({bb}, []) == ["USR001", "USR003"]
    assert codes(set(), [record("KeyError", "'fc.weight'")]) == ["USR001"]
    assert codes(set(), [record("KeyError", "no such layer: fc")]) == ["USR001", "USR004"]

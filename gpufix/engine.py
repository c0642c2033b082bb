"""The engine: a pure function from evidence and rules to ordered findings.

    evaluate(evidence, ruleset) -> ([root causes..., consequences...], notes of rules not evaluated)

A rule fires when its `match` group holds over the evidence. Its named groups, derived values
and lookups fill the message and fixes; fixes whose `when:` guard fails are left out. Then
`suppresses` removes less specific findings, `consequence_of` links effects to their cause, and
findings are ordered: root causes by priority then position, consequences after them.
"""

from __future__ import annotations

from gpufix import conditions
from gpufix.evidence import Evidence, ExceptionRecord, LineRef
from gpufix.findings import Finding, RenderedFix
from gpufix.redact import redact_text
from gpufix.regex import compile_pattern, decode_groups, may_match
from gpufix.rules.model import Group, Leaf, Rule, RuleSet, pattern_key, series_key

MAX_EVIDENCE_SHOWN = 8


class _Result:
    """What a matcher group found: its lines, captured groups and match counts."""

    __slots__ = ("matched", "refs", "groups", "count", "overflow", "unevaluated")

    def __init__(self, matched: bool, count: int = 0, overflow: int = 0) -> None:
        self.matched = matched
        self.refs: list[LineRef] = []
        self.groups: list[dict[str, str]] = []
        self.count = count
        self.overflow = overflow  # matches counted but not kept (per-pattern cap in the scanner)
        self.unevaluated: list[str] = []  # series conditions with too few samples to judge


def _series_leaf(leaf: Leaf, evidence: Evidence, bound: dict[str, str]) -> _Result:
    samples = evidence.series.get(leaf.series.series, [])
    if not samples:  # a pasted traceback has no measurements: nothing to judge, and no import to pay
        return _Result(False)
    from gpufix.series import evaluate

    outcome = evaluate(leaf.series, samples, prefer=bound.get(leaf.series.per))
    result = _Result(outcome.status == "matched", count=len(outcome.evidence))
    if outcome.status == "not_evaluated" and samples:
        # A series with some samples, too few to judge, is worth saying; a series the input
        # does not have at all (a pasted traceback has no telemetry) is not.
        result.unevaluated.append(outcome.reason)
    result.refs.extend(LineRef(source, line, text) for source, line, text in outcome.evidence)
    if outcome.fields:
        result.groups.append(outcome.fields)
    return result


def _may_match(ruleset: RuleSet, pattern: str, ignore_case: bool, text: str) -> bool:
    """False when the pattern's required literals rule `text` out (it cannot match)."""
    return may_match(ruleset.literals.get(pattern_key(pattern, ignore_case)), text)


def _leaf(leaf: Leaf, evidence: Evidence, ruleset: RuleSet, exceptions: list[ExceptionRecord],
          bound: dict[str, str]) -> _Result:
    if leaf.series is not None:
        return _series_leaf(leaf, evidence, bound)
    if leaf.vocabulary is not None:  # another rule's words: any of its positive matchers, whatever else it needs
        other = ruleset.by_code.get(leaf.vocabulary)
        out = _Result(False)
        for item in other.match.positive_leaves() if other is not None else ():
            found = _leaf(item, evidence, ruleset, exceptions, bound)
            if found.matched and item.series is None:
                out.matched = True
                out.refs += found.refs
                out.groups += found.groups
                out.count += found.count
        return out
    if leaf.line is not None:
        index = ruleset.line_index(leaf)
        hits = evidence.hits.get(index, [])
        total = evidence.hit_counts.get(index, len(hits))
        result = _Result(bool(hits), count=total, overflow=total - len(hits))
        for hit in hits:
            result.refs.extend(hit.lines)
            result.groups.append(hit.groups)
        return result
    # Compile only what could match: a required literal of the pattern must be in some record
    # (dozens of exception matchers, one or two exceptions in a paste: most compile for nothing).
    exceptions = [r for r in exceptions
                  if (leaf.exception is None or _may_match(ruleset, leaf.exception, leaf.ignore_case, r.type))
                  and (leaf.message is None or _may_match(ruleset, leaf.message, leaf.ignore_case, r.message))]
    if not exceptions:
        return _Result(False)
    type_re = compile_pattern(leaf.exception, leaf.ignore_case) if leaf.exception else None
    message_re = compile_pattern(leaf.message, leaf.ignore_case) if leaf.message else None
    result = _Result(False)
    for record in exceptions:
        groups: dict[str, str] = {}
        if type_re is not None:
            match = type_re.fullmatch(record.type.encode()) or type_re.fullmatch(record.short_type.encode())
            if not match:
                continue
            groups.update(decode_groups(match))
        if message_re is not None:
            match = message_re.search(record.message.encode("utf-8", "replace"))
            if not match:
                continue
            groups.update(decode_groups(match))
        result.matched = True
        result.count += 1
        result.refs.append(record.ref)
        result.groups.append(groups)
    return result


def _group(group: Group, evidence: Evidence, ruleset: RuleSet, exceptions: list[ExceptionRecord],
           bound: dict[str, str] | None = None) -> _Result:
    """Match a group. `bound` holds the fields matched so far (the first value of each), so a
    series condition judged per GPU or rank takes its numbers from the one already named."""
    out = _Result(True)

    def run(node: Leaf | Group) -> _Result:
        if isinstance(node, Leaf) and node.series is None:
            return _leaf(node, evidence, ruleset, exceptions, {})  # only series leaves look at it
        now = dict(bound or {})
        for groups in out.groups:
            for key, value in groups.items():
                now.setdefault(key, value)
        if isinstance(node, Group):
            return _group(node, evidence, ruleset, exceptions, now)
        return _leaf(node, evidence, ruleset, exceptions, now)

    for node in group.all:
        result = run(node)
        if not result.matched:
            failed = _Result(False)
            failed.unevaluated = result.unevaluated
            return failed
        out.refs += result.refs
        out.groups += result.groups
        out.count += result.count
        out.overflow += result.overflow
    if group.any:
        matched_any = False
        for node in group.any:
            result = run(node)
            out.unevaluated += result.unevaluated
            if result.matched:
                matched_any = True
                out.refs += result.refs
                out.groups += result.groups
                out.count += result.count
                out.overflow += result.overflow
        if not matched_any:
            failed = _Result(False)
            failed.unevaluated = out.unevaluated
            return failed
    for node in group.none:
        if run(node).matched:
            return _Result(False)
    return out


def _fields(rule: Rule, result: _Result, refs: list[LineRef], facts: dict[str, str]) -> dict[str, str]:
    fields: dict[str, str] = {}
    for groups in result.groups:
        for key, value in groups.items():
            fields.setdefault(key, value.strip())
    for key, value in facts.items():
        fields.setdefault(key, value)
    for name, expression in rule.derive.items():
        value = conditions.evaluate(expression, fields)
        if value is not None and name not in fields:  # a printed value beats a computed one
            fields[name] = value
    for lookup in rule.lookups:
        row = lookup.table.get(fields.get(lookup.field, "")) or lookup.default
        if row:
            for key, value in row.items():
                fields.setdefault(key, conditions.fill(value, fields) or value)
    ranks = sorted({ref.rank for ref in refs if ref.rank is not None})
    fields["count"] = str(len(refs) + result.overflow)  # lines, not pattern hits: one line may match twice
    if ranks:
        fields["ranks"] = ", ".join(map(str, ranks))
        if len(ranks) == 1:  # every quoted line is one rank's: a message can name it ("Rank 1 stopped on ...")
            fields["rank"] = str(ranks[0])
    if refs:
        fields["first_line"] = str(refs[0].line)
        fields["source"] = refs[0].source
    return fields


def _finding(rule: Rule, result: _Result, order: dict[str, int], facts: dict[str, str]) -> Finding:
    rule = rule.with_details()
    unique: dict[tuple[str, int], LineRef] = {}
    for ref in sorted(result.refs, key=lambda r: (order.get(r.source, 0), r.line)):
        unique.setdefault((ref.source, ref.line), ref)
    refs = list(unique.values())
    # Secrets the job printed stop here: everything shown or stored (messages, fixes, evidence, reports, the
    # post-mortem index) is built from the redacted fields and evidence; `all_refs` stays raw for internal use.
    fields = {key: redact_text(value) for key, value in _fields(rule, result, refs, facts).items()}
    shown = [ref._replace(text=redact_text(ref.text)) for ref in refs[:MAX_EVIDENCE_SHOWN]]
    message = next((m for m in (conditions.fill(t, fields) for t in rule.messages) if m), rule.title)
    fixes = []
    for fix in rule.fixes:
        if not _guards_hold(fix.when, fields):
            continue
        title = conditions.fill(fix.title, fields)
        if title is None:
            continue
        detail = conditions.fill(fix.detail, fields) if fix.detail else None
        snippet = conditions.fill(fix.snippet, fields) if fix.snippet else None
        fixes.append(RenderedFix(fix.kind, title, detail, snippet))
    return Finding(
        code=rule.code,
        name=rule.name,
        title=rule.title,
        category=rule.category,
        severity=rule.severity,
        confidence=rule.confidence,
        message=message,
        explanation=rule.explanation,
        fields=fields,
        evidence=shown,
        evidence_count=len(refs) + result.overflow,
        fixes=fixes,
        experiments=[{"name": e.name, "params": dict(e.params)} for e in rule.experiments if _guards_hold(e.when, fields)],
        ranks=sorted({r.rank for r in refs if r.rank is not None}),
        consequence_of=None,
        references=list(rule.references),
        priority=rule.priority,
        is_gpu=rule.is_gpu,
        all_refs=refs,
    )


def _guards_hold(guards: tuple[str, ...], fields: dict[str, str]) -> bool:
    """A rule's `require`, a fix's or an experiment's `when`: every guard holds on the finding's fields."""
    return all(conditions.holds(guard, fields) for guard in guards)


MAX_GUARDED_HITS = 64  # hits whose values are tried against a rule's `require` guards


def _guarded_finding(rule: Rule, result: _Result, order: dict[str, int], facts: dict[str, str]) -> Finding | None:
    """The finding when its `require` guards hold. A finding's fields come from its first hit; when
    the guards fail there, each further hit's values are tried first in turn (one line of a timing
    log where the data wait dominates is enough, wherever it stands), so a rule reads every line
    it matched, not only the first."""
    finding = _finding(rule, result, order, facts)
    if _guards_hold(rule.require, finding.fields):
        return finding
    for index in range(1, min(len(result.groups), MAX_GUARDED_HITS)):
        tried = _Result(True, result.count, result.overflow)
        tried.refs = result.refs
        tried.groups = [result.groups[index], *result.groups[:index], *result.groups[index + 1:]]
        finding = _finding(rule, tried, order, facts)
        if _guards_hold(rule.require, finding.fields):
            return finding
    return None


def evaluate(evidence: Evidence, ruleset: RuleSet) -> tuple[list[Finding], list[str]]:
    """All findings for the evidence, root causes first, and a note for each rule whose series
    conditions had too few samples: "not evaluated", never "healthy". (gpufix.diagnosis.diagnose
    wraps this in a Diagnosis.)"""
    notes: list[str] = []
    order = {source: i for i, source in enumerate(evidence.sources)}
    findings: dict[str, Finding] = {}
    # Only the rules that can match: one of their lines occurred, or an exception record has the literals
    # one of their exception matchers requires (RuleSet.candidates).
    hit_lines: set[int | str] = {index for index, hits in evidence.hits.items() if hits}
    hit_lines.update(series_key(name) for name, samples in evidence.series.items() if samples)
    for rule in ruleset.candidates(hit_lines, evidence.exceptions):
        if rule.fallback or rule.status == "deprecated":
            continue
        result = _group(rule.match, evidence, ruleset, evidence.exceptions)
        if result.matched:
            finding = _guarded_finding(rule, result, order, evidence.facts)
            if finding is not None:
                findings[rule.code] = finding
        elif result.unevaluated:
            notes.append(f"{rule.code} {rule.name} not evaluated: {'; '.join(result.unevaluated)}")
    covered = {(ref.source, ref.line) for f in findings.values() for ref in f.all_refs}
    uncovered = [e for e in evidence.exceptions if (e.ref.source, e.ref.line) not in covered]
    for rule in ruleset.candidates(hit_lines, uncovered) if uncovered else ():
        if rule.fallback:
            result = _group(rule.match, evidence, ruleset, uncovered)
            if result.matched:
                findings[rule.code] = _finding(rule, result, order, evidence.facts)
    for code in list(findings):
        rule = ruleset.by_code[code]
        for victim in rule.suppresses:
            findings.pop(victim, None) if victim != code else None
    # A family rule only speaks for its category when no specific rule of that category did.
    specific = {f.category for code, f in findings.items() if not ruleset.by_code[code].family}
    for code in [c for c, f in findings.items() if ruleset.by_code[c].family and f.category in specific]:
        del findings[code]
    if ruleset.word_model_dir and evidence.tails and not any(f.is_gpu for f in findings.values()):
        guessed = _word_model_finding(evidence, ruleset, ruleset.word_model_dir, order, notes)
        if guessed is not None:
            findings[guessed.code] = guessed
    return _order(list(findings.values()), ruleset, order), notes


def _word_model_finding(evidence: Evidence, ruleset: RuleSet, model_dir: str, order: dict[str, int],
                        notes: list[str]) -> Finding | None:
    """The family finding the word model reads in the inputs' last lines when no rule found a GPU failure
    (gpufix/wordmodel.py): low confidence, the lines that weigh most towards it as evidence, the family's fixes.
    An unreadable model file is said in `notes`."""
    from gpufix.logscan import EVIDENCE_TEXT_MAX
    from gpufix.wordmodel import model_in

    model = model_in(model_dir)
    if isinstance(model, str):
        notes.append(model)
        return None
    guess = model.guess(evidence.tails) if model is not None else None
    rule = ruleset.family_of(guess.category) if guess is not None else None
    if guess is None or rule is None:
        return None
    result = _Result(True, count=len(guess.lines))
    result.refs = [LineRef(source, line, text[:EVIDENCE_TEXT_MAX]) for source, line, text in guess.lines]
    result.groups = [{"word_probability": f"{guess.probability:.0%}"}]
    finding = _finding(rule, result, order, evidence.facts)
    message = (f"No rule knows this exact wording, but the words of these lines read as {rule.category} failures do "
               f"({guess.probability:.0%} by the word model learnt from real users' logs)")
    return finding._replace(confidence="low", message=message)


def _order(findings: list[Finding], ruleset: RuleSet, order: dict[str, int]) -> list[Finding]:
    def position(f: Finding) -> tuple[int, int]:
        source, line = f.first_position
        return order.get(source, 0), line

    def tier(f: Finding) -> int:
        # A specific rule first, then a family rule (a category's broad vocabulary, no specific
        # wording recognised), then the fallback (an exception nothing else explains).
        rule = ruleset.by_code[f.code]
        return 2 if rule.fallback else 1 if rule.family else 0

    def concern(f: Finding) -> int:
        # What stopped the run (an error) before what only slowed or degraded it (a warning: a straggler,
        # a starved loader, throttling), whatever their priorities; both stay roots of their own.
        return 1 if f.severity in ("warning", "info") else 0

    ranked = sorted(findings, key=lambda f: (tier(f), concern(f), -f.priority, position(f)))
    causes: dict[str, str] = {}
    for finding in ranked:
        refs = ruleset.by_code[finding.code].consequence_of
        for cause in ranked:
            if cause is finding or causes.get(cause.code) == finding.code:
                continue
            # An info finding says how the run ended (an interruption), never why something else happened: a
            # hang that gpufix or a user ended with a signal stays the hang.
            if cause.severity == "info" and finding.severity != "info":
                continue
            # A family's guess demotes a specific GPU finding only where that rule names the family's
            # code; an ordinary error yields to it by category too ("not a GPU problem" only when
            # nothing GPU-related is in the text).
            if tier(cause) == 1 and tier(finding) != 1 and finding.category != "not_gpu" and cause.code not in refs:
                continue
            if cause.code in refs or f"category:{cause.category}" in refs:
                causes[finding.code] = cause.code
                break
    ranked = [f._replace(consequence_of=causes.get(f.code)) for f in ranked]
    roots = [f for f in ranked if f.consequence_of is None]
    # The effects after the roots, each after its cause (depth first, in rank order): "Consequence of GEN000" is
    # read after GEN000, not before it.
    children: dict[str, list[Finding]] = {}
    for f in ranked:
        if f.consequence_of is not None:
            children.setdefault(f.consequence_of, []).append(f)
    effects: list[Finding] = []

    def walk(code: str) -> None:
        for effect in children.pop(code, ()):
            effects.append(effect)
            walk(effect.code)

    for root in roots:
        walk(root.code)
    effects += [f for kids in children.values() for f in kids]  # a chain with no root (causes in a cycle)
    return roots + effects

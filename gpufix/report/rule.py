"""A rule's documentation, as `gpufix rules show CODE` prints it (ruff's `rule` command)."""

from __future__ import annotations

from gpufix.experiments import EXPERIMENTS
from gpufix.rules.model import CATEGORIES, Group, Leaf, Rule


def _matchers(group: Group, indent: str = "  ") -> list[str]:
    out = []
    for key in ("all", "any", "none"):
        nodes = getattr(group, key)
        if not nodes:
            continue
        out.append(f"{indent}{key}:")
        for node in nodes:
            if isinstance(node, Leaf) and node.series is not None:
                from gpufix.series import describe

                out.append(f"{indent}  - " + describe(node.series))
            elif isinstance(node, Leaf):
                parts = [f"{k} /{v}/" for k, v in (("line", node.line), ("exception", node.exception), ("message", node.message)) if v]
                out.append(f"{indent}  - " + ", ".join(parts) + (" (ignore case)" if node.ignore_case else ""))
            else:
                out += _matchers(node, indent + "    ")
    return out


def render_rule(rule: Rule, color: bool = False) -> str:
    def h(text: str) -> str:
        return f"[bold]{text}[/]" if color else text

    def p(text: str) -> str:
        if not color:
            return text
        from rich.markup import escape

        return escape(text)

    out = [h(f"{rule.code} {rule.name}: {rule.title}"), ""]
    out.append(p(f"category {rule.category} ({CATEGORIES[rule.category]}); severity {rule.severity}; "
                 f"confidence {rule.confidence}; status {rule.status}; priority {rule.priority}"))
    out.append(p(f"defined in {rule.source}:{rule.line}"))
    out += ["", h("What it detects"), *(p("  " + m) for m in rule.messages[:1]), "", h("Why it happens")]
    out += [p("  " + line) for line in rule.explanation.splitlines()]
    out += ["", h("How it matches"), *map(p, _matchers(rule.match))]
    if rule.consequence_of:
        out.append(p(f"  reported as a consequence when these are present: {', '.join(rule.consequence_of)}"))
    if rule.suppresses:
        out.append(p(f"  hides the less specific: {', '.join(rule.suppresses)}"))
    out += ["", h("How to fix, in order")]
    for i, fix in enumerate(rule.fixes, 1):
        guard = f"  (when {' and '.join(fix.when)})" if fix.when else ""
        out.append(p(f"  {i}. [{fix.kind}] {fix.title}{guard}"))
        if fix.detail:
            out.append(p(f"     {fix.detail}"))
        if fix.snippet:
            out.append(p(f"     {fix.snippet}"))
    if rule.experiments:
        out += ["", h("How to confirm")]
        out += [p(f"  {e.name}: {EXPERIMENTS.get(e.name, '')}") for e in rule.experiments]
    out += ["", h("False positives"), *(p(f"  - {fp}") for fp in rule.falsepositives)]
    if rule.references:
        out += ["", h("References"), *(p(f"  {ref}") for ref in rule.references)]
    out += ["", h("Examples")]
    for kind, texts in (("match", rule.examples.match), ("no_match", rule.examples.no_match), ("known miss", rule.examples.known_misses)):
        for text in texts:
            if not isinstance(text, str):  # measurements: name the series
                text = "measurements of " + ", ".join(text.get("series", {}))
            first = text.strip().splitlines()[0] if text.strip() else ""
            out.append(p(f"  {kind}: {first[:110]}"))
    return "\n".join(out) + "\n"

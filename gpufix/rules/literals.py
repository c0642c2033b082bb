"""Required literals of a regex: groups of strings (factors) each of which has a member in every match.

Computed once when rules are validated (it needs Python's regex parser) and cached with them.
`gpufix explain` on a pasted traceback then checks a few hundred `literal in text` instead of
compiling every pattern into an RE2 set, which costs more than the whole rest of its start-up.
"""

from __future__ import annotations

import re

TYPE_CHECKING = False  # typing costs start-up time; annotations are strings (PEP 563)
if TYPE_CHECKING:
    from typing import Any

try:  # the parser moved in Python 3.11
    from re import _parser as sre_parse  # type: ignore[attr-defined]
    from re import _constants as sre_constants  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

MIN_LITERAL = 3  # shorter literals would pass nearly every text; treat as "no literal"
_C = sre_constants


def _best(options: list[list[str]]) -> list[str] | None:
    """Among alternative requirements, the one whose shortest literal is longest."""
    usable = [o for o in options if o and min(map(len, o)) >= MIN_LITERAL]
    if not usable:
        return None
    return max(usable, key=lambda o: (min(map(len, o)), -len(o)))


def _required(items: Any) -> list[str] | None:
    return _best(_options(items))


def _options(items: Any) -> list[list[str]]:
    """The sequence's requirements, each a list of alternatives one of which every match holds: all of
    them are required at once (they are parts of one concatenation)."""
    options: list[list[str]] = []
    run: list[str] = []
    for op, arg in list(items) + [(None, None)]:
        if op is _C.LITERAL:
            run.append(chr(arg))
            continue
        if run:
            options.append(["".join(run)])
            run = []
        if op is _C.SUBPATTERN:
            if arg[1] & re.IGNORECASE:  # a scoped (?i:...) group: its literals are not exact
                continue
            sub = _required(arg[-1])
            if sub:
                options.append(sub)
        elif op is _C.BRANCH:
            alternatives: list[str] = []
            for branch in arg[1]:
                sub = _required(branch)
                if not sub:
                    alternatives = []
                    break
                alternatives += sub
            if alternatives:
                options.append(alternatives)
        elif op in (_C.MAX_REPEAT, _C.MIN_REPEAT) and arg[0] >= 1:
            sub = _required(arg[2])
            if sub:
                options.append(sub)
    return options


MAX_FACTORS = 4  # requirements checked per pattern: the most selective few are enough to rule most patterns out


def required_literals(pattern: str, ignore_case: bool = False) -> tuple[bool, list[list[str]]] | None:
    """(folded, factors): every match holds one literal of each factor (a list of alternatives), the
    most selective factor first; when `folded`, they are lowercase and must be looked for in
    lowercased text. Several factors rule out more patterns than one: on a CUDA OOM traceback, ~90
    patterns hold "allocate" or "memory", but only half of them also hold their other words.

    None when no useful literal can be proven; the caller must then always try the pattern.
    """
    try:
        parsed = sre_parse.parse(pattern)
    except (re.error, RecursionError, OverflowError):
        return None
    if parsed.state.flags & re.IGNORECASE:
        ignore_case = True
    usable = [o for o in _options(parsed) if o and min(map(len, o)) >= MIN_LITERAL]
    if not usable:
        return None
    best = _best(usable)
    rest = sorted((o for o in usable if o is not best), key=lambda o: (-min(map(len, o)), len(o)))
    factors = [best, *rest][:MAX_FACTORS]
    if ignore_case:
        if not all(lit.isascii() for factor in factors for lit in factor):
            return None  # bytes.lower() only folds ASCII
        factors = [[lit.lower() for lit in factor] for factor in factors]
    return ignore_case, [sorted(set(factor)) for factor in factors]

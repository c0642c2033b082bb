"""Required literals of a regex: groups of strings (factors) each of which has a member in every match.

Computed once when rules are validated (it needs Python's regex parser) and cached with them.
`gpufix explain` on a pasted traceback then checks a few hundred `literal in text` instead of
compiling every pattern into an RE2 set, which costs more than the whole rest of its start-up.
"""

from __future__ import annotations

import re

TYPE_CHECKING = False  # typing costs start-up time; annotations are strings (PEP 563)
if TYPE_CHECKING:
    from typing import Any, Union

    # A literal is a string, or a tuple of strings that must all occur (one alternative of a `|` that needs several words).
    Lit = Union[str, tuple[str, ...]]

try:  # the parser moved in Python 3.11
    from re import _parser as sre_parse  # type: ignore[attr-defined]
    from re import _constants as sre_constants  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

MIN_LITERAL = 3  # shorter literals would pass nearly every text; treat as "no literal"
_C = sre_constants


def _size(literal: Lit) -> int:
    """How selective a literal is: its length, or for a conjunction the length of all its parts."""
    return len(literal) if isinstance(literal, str) else sum(map(len, literal))


def _usable(options: list[list[Lit]]) -> list[list[Lit]]:
    return [o for o in options if o and min(map(_size, o)) >= MIN_LITERAL]


def _best(options: list[list[Lit]]) -> list[Lit] | None:
    """Among alternative requirements, the one whose shortest literal is longest."""
    usable = _usable(options)
    if not usable:
        return None
    return max(usable, key=lambda o: (min(map(_size, o)), -len(o)))


def _required(items: Any) -> list[Lit] | None:
    return _best(_options(items))


MAX_CONJUNCTS = 8  # alternatives a branch's two requirements may multiply into before one requirement is kept


def _branch(items: Any) -> list[Lit] | None:
    """What one alternative of a `|` requires: its most selective requirement, and with it the next one as a
    conjunction (a tuple, every part required): `\\bcuda\\b.{0,30}requested` needs both words, not just "cuda"."""
    usable = sorted(_usable(_options(items)), key=lambda o: (-min(map(_size, o)), len(o)))
    if len(usable) < 2 or len(usable[0]) * len(usable[1]) > MAX_CONJUNCTS:
        return usable[0] if usable else None
    return [_parts(a) + _parts(b) for a in usable[0] for b in usable[1]]


def _parts(literal: Lit) -> tuple[str, ...]:
    return (literal,) if isinstance(literal, str) else literal


def _options(items: Any) -> list[list[Lit]]:
    """The sequence's requirements, each a list of alternatives one of which every match holds: all of
    them are required at once (they are parts of one concatenation)."""
    options: list[list[Lit]] = []
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
            alternatives: list[Lit] = []
            for branch in arg[1]:
                sub = _branch(branch)
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
    """(folded, factors): every match holds one literal of each factor (a list of alternatives, each a string or a
    tuple of strings that occur together), the
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
    usable = _usable(_options(parsed))
    if not usable:
        return None
    best = _best(usable)
    rest = sorted((o for o in usable if o is not best), key=lambda o: (-min(map(_size, o)), len(o)))
    factors = [best, *rest][:MAX_FACTORS]
    if ignore_case:
        if not all(part.isascii() for factor in factors for lit in factor for part in _parts(lit)):
            return None  # bytes.lower() only folds ASCII
        factors = [[_lower(lit) for lit in factor] for factor in factors]
    # plain strings first, then conjunctions: marshal keeps both, and sorting never compares the two kinds
    return ignore_case, [sorted(set(factor), key=lambda lit: (not isinstance(lit, str), lit)) for factor in factors]


def _lower(literal: Lit) -> Lit:
    return literal.lower() if isinstance(literal, str) else tuple(part.lower() for part in literal)

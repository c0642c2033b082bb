"""Required literals of a regex: strings of which at least one occurs in every match.

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
    return _best(options)


def required_literals(pattern: str, ignore_case: bool = False) -> tuple[bool, list[str]] | None:
    """(folded, literals): one of the literals occurs in every match; when `folded`, they are
    lowercase and must be looked for in lowercased text.

    None when no useful literal can be proven; the caller must then always try the pattern.
    """
    try:
        parsed = sre_parse.parse(pattern)
    except (re.error, RecursionError, OverflowError):
        return None
    if parsed.state.flags & re.IGNORECASE:
        ignore_case = True
    found = _required(parsed)
    if found is None:
        return None
    if ignore_case:
        if not all(lit.isascii() for lit in found):
            return None  # bytes.lower() only folds ASCII
        found = [lit.lower() for lit in found]
    return ignore_case, sorted(set(found))

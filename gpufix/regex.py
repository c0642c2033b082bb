"""One place that compiles rule regexes, with RE2 (linear time, no catastrophic backtracking).

Patterns are matched on bytes in Latin-1 mode so that invalid UTF-8 in a log can never stop a
match or raise; ASCII and UTF-8 literals in patterns still match byte for byte.
"""

from __future__ import annotations

import functools

TYPE_CHECKING = False  # typing costs start-up time; annotations are strings (PEP 563)
if TYPE_CHECKING:
    from typing import Any

import re2

_OPTIONS = re2.Options()
_OPTIONS.encoding = re2.Options.Encoding.LATIN1
_OPTIONS.log_errors = False  # RE2 would otherwise write parse errors to our stderr
# The combined set of every rule's line patterns: RE2's default 8 MiB budget is too small for the
# DFA of several hundred patterns (its Compile() then fails); memory is taken as needed, not up front.
SET_MAX_MEM = 64 << 20
_SET_OPTIONS = re2.Options()
_SET_OPTIONS.encoding = re2.Options.Encoding.LATIN1
_SET_OPTIONS.log_errors = False
_SET_OPTIONS.max_mem = SET_MAX_MEM

Regex = object  # re2._Regexp: the binding ships no type stubs (Any to a type checker)
if TYPE_CHECKING:
    Regex = Any  # type: ignore[misc]


def _flags(pattern: str, ignore_case: bool) -> bytes:
    prefix = "(?mi)" if ignore_case else "(?m)"
    return (prefix + pattern).encode("utf-8")


@functools.lru_cache(maxsize=4096)
def compile_pattern(pattern: str, ignore_case: bool = False) -> Regex:
    """Compile a rule pattern for matching bytes; raises ValueError with RE2's reason."""
    try:
        return re2.compile(_flags(pattern, ignore_case), _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise ValueError(str(reason)) from None


def pattern_error(pattern: str) -> str | None:
    """Why `pattern` is not acceptable as a rule regex, or None when it is.

    RE2 rejects lookaround, backreferences and possessive/atomic groups; a leading `^` is
    rejected too because log lines carry rank and timestamp prefixes.
    """
    try:
        compile_pattern(pattern)
    except ValueError as exc:
        return f"regex does not compile under RE2 (the engine gpufix uses): {exc}"
    if pattern.startswith("^"):
        return (
            "regex starts with '^': log lines carry rank/timestamp prefixes "
            "([rank3]:, [E516 07:03:29 ...]), so patterns are searched anywhere in a line"
        )
    return None


def group_names(pattern: str) -> list[str]:
    """Named groups of a pattern, in order."""
    return [name.decode() if isinstance(name, bytes) else name for name in compile_pattern(pattern).groupindex]


class PatternSet:
    """Many patterns searched in one pass: `present(data)` says which occur anywhere.

    Two ways to find them: one RE2 set over the data (grep speed on big inputs, but compiling a
    few hundred patterns into it costs ~13 ms), or, on small inputs when each pattern's required
    literals are known, `literal in data` checks that leave only a handful of candidates to search.
    """

    # Below this, literal checks beat building the set: each input byte is searched once per
    # pattern (~350 patterns), which matches the set's ~13 ms compile at about 64 KiB.
    SMALL_INPUT = 64 << 10

    def __init__(self, patterns: list[tuple[str, bool]], literals: list[Any] | None = None) -> None:
        self.patterns = patterns
        # per pattern: None (no literal known) or (folded, [bytes literals]); see rules/literals.py
        self.literals = None
        if literals is not None:
            self.literals = [None if lit is None else (lit[0], [s.encode("utf-8") for s in lit[1]]) for lit in literals]
        self._set: Any = None

    def _compiled_set(self) -> Any:
        """The combined set, or False when RE2 cannot build it within SET_MAX_MEM (then every
        pattern is searched on its own: slower on big inputs, never a silent miss)."""
        if self._set is None:
            one = re2.Set.SearchSet(_SET_OPTIONS)
            for pattern, ignore_case in self.patterns:
                one.Add(_flags(pattern, ignore_case))
            try:
                one.Compile()
                self._set = one
            except re2.error:
                self._set = False
        return self._set

    def present(self, data: bytes) -> list[int]:
        """Indices of the patterns that match somewhere in `data`."""
        if not self.patterns:
            return []
        if self.literals is None or self._set is not None or len(data) > self.SMALL_INPUT:
            combined = self._compiled_set()
            if combined is False:
                return [i for i in range(len(self.patterns)) if self.regex(i).search(data)]
            return sorted(combined.Match(data) or ())
        lowered: bytes | None = None
        found = []
        for index, required in enumerate(self.literals):
            if required is not None:
                folded, alternatives = required
                if folded and lowered is None:
                    lowered = data.lower()
                haystack = lowered if folded else data
                if not any(lit in haystack for lit in alternatives):
                    continue
            if self.regex(index).search(data):
                found.append(index)
        return found

    def regex(self, index: int) -> Regex:
        pattern, ignore_case = self.patterns[index]
        return compile_pattern(pattern, ignore_case)


def decode_groups(match: Any) -> dict[str, str]:
    """A match's named groups as text (None groups dropped)."""
    out: dict[str, str] = {}
    for key, value in match.groupdict().items():
        if value is None:
            continue
        name = key.decode() if isinstance(key, bytes) else key
        out[name] = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return out

"""One place that compiles rule regexes, with RE2 (linear time, no catastrophic backtracking).

Patterns are matched on bytes in Latin-1 mode so that invalid UTF-8 in a log can never stop a
match or raise; ASCII and UTF-8 literals in patterns still match byte for byte.

RE2's memory is bounded: the combined set of every line pattern to SET_MAX_MEM, each regex to
RE2's default 8 MiB. A user's pattern must also fit the bounds of `budget_error` (its compiled
size, and a DFA that does not keep growing with the text), and a user's line patterns together
USER_SET_MAX_MEM (`set_budget_error`); the loader refuses a rule that does not, with its reason.
"""

from __future__ import annotations

import functools
import re

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


_GROUP_NAME = re.compile(r"(?<!\\)\(\?P<(\w+)>")  # a named group, not an escaped parenthesis


def pattern_error(pattern: str) -> str | None:
    """Why `pattern` is not acceptable as a rule regex, or None when it is.

    RE2 rejects lookaround, backreferences and possessive/atomic groups; a leading `^` is
    rejected too because log lines carry rank and timestamp prefixes, and a group name used twice
    because RE2 fills it only at its first place.
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
    names = _GROUP_NAME.findall(pattern)
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        return (
            f"regex names group {', '.join(repr(n) for n in twice)} more than once: RE2 fills a name only "
            "at its first place, so the field stays empty when another alternative matched; write one "
            "`line:` item per alternative instead"
        )
    return None


def group_names(pattern: str) -> list[str]:
    """Named groups of a pattern, in order."""
    return [name.decode() if isinstance(name, bytes) else name for name in compile_pattern(pattern).groupindex]


def may_match(required: Any, text: str, lowered: str | None = None) -> bool:
    """False when `text` lacks every literal of one of the pattern's required factors
    (`(folded, [[alternatives], ...])`, see rules/literals.py): then the pattern cannot match it and
    need not be compiled. `lowered` is the text with ASCII lowered, when at hand."""
    if not required:
        return True
    folded, factors = required
    haystack = (lowered if lowered is not None else text.lower()) if folded else text
    # a literal is a string, or a tuple whose parts must all be there (one alternative that needs several words)
    return all(any(literal in haystack if literal.__class__ is not tuple else all(part in haystack for part in literal)
                   for literal in factor) for factor in factors)


def _key_size(literal: Any) -> int:
    return len(literal) if literal.__class__ is not tuple else max(map(len, literal))


def key_index(literals: list[Any]) -> tuple[dict[str, list[int]], dict[str, list[int]], list[int]]:
    """For `PatternSet.present`: one factor of each pattern's required literals (its most selective) as
    literal -> the patterns that need it, case-sensitive and folded apart, and the patterns with none.

    A pattern can match only where a literal of each factor occurs, so only the patterns listed under a
    literal present in the text need their full `may_match`: a few hundred `in` checks instead of one
    Python call per pattern. (For a tuple literal, whose parts must all occur, its longest part is the key.)
    """
    case: dict[str, list[int]] = {}
    folded: dict[str, list[int]] = {}
    always: list[int] = []
    for index, required in enumerate(literals):
        if not required or not required[1]:
            always.append(index)
            continue
        fold, factors = required
        factor = max(factors, key=lambda f: (min(map(_key_size, f), default=0), -len(f)))
        table = folded if fold else case
        for literal in factor:
            key = literal if literal.__class__ is not tuple else max(literal, key=len)
            table.setdefault(key, []).append(index)
    return case, folded, always


class PatternSet:
    """Many patterns searched in one pass: `present(data)` says which occur anywhere.

    Two ways to find them: one RE2 set over the data (grep speed on big inputs, but compiling
    ~1400 patterns into it costs ~54 ms), or, on small inputs when each pattern's required
    literals are known, `literal in data` checks (`key_index`) that leave only a handful of
    candidates to search.
    """

    # Below this, literal checks beat building the set: each input byte is searched once per key literal
    # (~1300) and by more candidates as it grows, which passes the set's ~54 ms compile at 40-48 KiB
    # (benchmarks/scan_paths.py). Set lower, since a real scan also compiles each candidate once.
    SMALL_INPUT = 32 << 10

    def __init__(self, patterns: list[tuple[str, bool]], literals: list[Any] | None = None,
                 keys: Any = None) -> None:
        self.patterns = patterns
        # per pattern: None (no literal known) or (folded, [[str alternatives] per factor]); see rules/literals.py.
        # They stay text: `present` decodes the (small) input once instead of encoding ~4000 literals per process.
        self.literals = literals
        self._keys = keys  # key_index(literals), precomputed by the rule cache or built on first use
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
        if self._keys is None:
            self._keys = key_index(self.literals)
        case, folded, always = self._keys
        # surrogateescape keeps every byte: a literal occurs in the text exactly where its UTF-8 occurs in the data
        # (invalid bytes become lone surrogates, which no literal holds). Folding lowers ASCII only, as bytes.lower().
        text = data.decode("utf-8", "surrogateescape")
        lowered = data.lower().decode("utf-8", "surrogateescape")
        candidates = set(always)
        for literal, indices in case.items():
            if literal in text:
                candidates.update(indices)
        for literal, indices in folded.items():
            if literal in lowered:
                candidates.update(indices)
        found = []
        for index in sorted(candidates):
            required = self.literals[index]
            if (required is None or may_match(required, text, lowered)) and self.regex(index).search(data):
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



# -- bounds on users' patterns ------------------------------------------------------------------
#
# RE2 searches in linear time, but its DFA is built as the text goes, one state per combination
# of pattern positions the text leads to, in a cache of bounded size. A pattern such as
# `(a|b)*a(a|b){20}` has 2^21 combinations: on text of its own letters nearly every byte makes a
# new state, the full cache is thrown away and refilled again and again, and the search crawls
# (explain 24x slower; 1000x on a/b text), every other rule of the combined set with it. The
# built-in pack is checked by the tests; a user's rule file when it is loaded: a pattern that does
# not fit the bounds below is refused, its rule with it (`gpufix rules check` says `path:line:`,
# `explain` a note), and the rest of the pack is used.
USER_PATTERN_MAX_MEM = 2 << 20  # RE2 memory to compile one user pattern (the pack's largest: 0.1 MiB)
USER_SET_MAX_MEM = 16 << 20  # ... all of a user's line patterns together, as one set
USER_PATTERN_DFA_BYTES = 8 << 20  # the DFA states one user pattern may build over its probe text
USER_PATTERN_DFA_GROWTH = 256 << 10  # ... of which first built in the probe's second half
DFA_PROBE_BYTES = 16 << 10  # the probe: the pattern's own byte classes in a fixed random order
_MAX_POSITIONS = 50_000  # a pattern with more (counted repetitions expanded) is bounded by its compile budget
_MAX_WORK = 20_000_000  # positions gathered over a probe: a second or so, whatever the pattern
_STATE_BYTES = 16 + 40  # RE2's DFA state header and its cache's overhead per state
_ALL = (1 << 256) - 1


def _mask(codes: Any) -> int:
    out = 0
    for code in codes:
        out |= 1 << code
    return out


_UPPER, _LOWER = _mask(range(65, 91)), _mask(range(97, 123))
_DIGIT = _mask(range(48, 58))
_WORD = _DIGIT | _UPPER | _LOWER | 1 << 95  # RE2's \w, \d and \s are ASCII
_SPACE = _mask((9, 10, 12, 13, 32))
_POSIX = {"alpha": "A-Za-z", "digit": "0-9", "alnum": "0-9A-Za-z", "upper": "A-Z", "lower": "a-z",
          "space": "\\t\\n\\v\\f\\r ", "xdigit": "0-9A-Fa-f", "word": "0-9A-Za-z_", "blank": "\\t ",
          "punct": "!-/:-@\\[-`{-~", "cntrl": "\\x00-\\x1f\\x7f", "print": " -~", "graph": "!-~"}


class _TooLarge(Exception):
    pass


def _sre() -> tuple[Any, Any]:
    """Python's regex parser and its constants (RE2's syntax and Python's agree on what rules use)."""
    try:
        from re import _constants, _parser  # type: ignore[attr-defined]
    except ImportError:  # Python 3.10
        import sre_constants as _constants  # type: ignore[no-redef]
        import sre_parse as _parser  # type: ignore[no-redef]
    return _parser, _constants


class _Positions:
    """The position (Glushkov) automaton of a pattern: one position per byte class it matches,
    counted repetitions expanded as RE2 expands them, anchors and word boundaries dropped (they
    take no byte, and dropping them can only add states)."""

    def __init__(self, constants: Any) -> None:
        self.c = constants
        self.classes: list[int] = []  # per position: the bytes it takes, as a 256-bit mask
        self.follow: list[set[int]] = []

    def _new(self, mask: int) -> int:
        if len(self.classes) >= _MAX_POSITIONS:
            raise _TooLarge
        self.classes.append(mask)
        self.follow.append(set())
        return len(self.classes) - 1

    def _then(self, a: tuple[bool, set[int], set[int]], b: tuple[bool, set[int], set[int]]) -> tuple[bool, set[int], set[int]]:
        """The concatenation of two parts, each (nullable, first positions, last positions)."""
        for p in a[2]:
            self.follow[p] |= b[1]
        return (a[0] and b[0], a[1] | b[1] if a[0] else a[1], a[2] | b[2] if b[0] else b[2])

    def sequence(self, items: Any, fold: bool, dotall: bool) -> tuple[bool, set[int], set[int]]:
        c = self.c
        out: tuple[bool, set[int], set[int]] = (True, set(), set())
        for op, av in items:
            if op in (c.AT, c.ASSERT, c.ASSERT_NOT):
                continue
            if op in (c.LITERAL, c.NOT_LITERAL, c.ANY, c.IN):
                if op == c.LITERAL and av > 255:  # UTF-8 to RE2 in Latin-1 mode: one position a byte
                    masks = [1 << b for b in chr(av).encode("utf-8")]
                else:
                    masks = [self._class(op, av, fold, dotall)]
                ids = [self._new(m) for m in masks]
                for a, b in zip(ids, ids[1:]):
                    self.follow[a].add(b)
                part: tuple[bool, set[int], set[int]] = (False, {ids[0]}, {ids[-1]})
            elif op == c.BRANCH:
                part = (False, set(), set())
                for alternative in av[1]:
                    n, f, la = self.sequence(alternative, fold, dotall)
                    part = (part[0] or n, part[1] | f, part[2] | la)
            elif op == c.SUBPATTERN:
                _group, add, remove, body = av
                part = self.sequence(body, (fold or bool(add & c.SRE_FLAG_IGNORECASE)) and not remove & c.SRE_FLAG_IGNORECASE,
                                     (dotall or bool(add & c.SRE_FLAG_DOTALL)) and not remove & c.SRE_FLAG_DOTALL)
            elif op in (c.MAX_REPEAT, c.MIN_REPEAT):
                part = self._repeat(av[0], av[1], av[2], fold, dotall)
            else:
                raise _TooLarge  # what RE2 refuses anyway (backreferences, atomic groups)
            out = self._then(out, part)
        return out

    def _repeat(self, low: int, high: int, body: Any, fold: bool, dotall: bool) -> tuple[bool, set[int], set[int]]:
        """body{low,high}: `low` copies (the last looping when unbounded), then `high - low`
        optional copies nested, (B(B(B)?)?)?, so each follows only the one before it."""
        out: tuple[bool, set[int], set[int]] = (True, set(), set())
        if high == self.c.MAXREPEAT:
            for number in range(max(low, 1)):
                copy = self.sequence(body, fold, dotall)
                if number == max(low, 1) - 1:
                    for p in copy[2]:
                        self.follow[p] |= copy[1]
                    copy = (copy[0] or low == 0, copy[1], copy[2])
                out = self._then(out, copy)
            return out
        for _ in range(min(low, 1000)):
            out = self._then(out, self.sequence(body, fold, dotall))
        nullable, first, last = out
        after, entry = set(last), nullable
        optional_last: set[int] = set()
        for _ in range(min(high, 1000) - min(low, 1000)):
            n, f, la = self.sequence(body, fold, dotall)
            for p in after:
                self.follow[p] |= f
            if entry:
                first = first | f
            entry = entry and n
            optional_last |= la
            after = la | after if n else set(la)
        return nullable, first, last | optional_last

    def _class(self, op: Any, av: Any, fold: bool, dotall: bool) -> int:
        c = self.c
        if op == c.LITERAL:
            mask = 1 << av
        elif op == c.NOT_LITERAL:
            mask = _ALL & ~(1 << av) if av < 256 else _ALL
        elif op == c.ANY:
            return _ALL if dotall else _ALL & ~(1 << 10)
        else:
            mask, negate = 0, False
            for kind, value in av:
                if kind == c.NEGATE:
                    negate = True
                elif kind == c.LITERAL:
                    mask |= _mask(chr(value).encode("utf-8")) if value > 255 else 1 << value
                elif kind == c.RANGE:
                    mask |= _mask(range(value[0], min(value[1], 255) + 1))
                elif kind == c.CATEGORY:
                    name = str(value)
                    base = _DIGIT if "DIGIT" in name else _WORD if "WORD" in name else _SPACE
                    mask |= _ALL & ~base if "NOT" in name else base
            if fold:
                mask |= (mask & _UPPER) << 32 | (mask & _LOWER) >> 32
            return _ALL & ~mask if negate else mask
        if fold:
            mask |= (mask & _UPPER) << 32 | (mask & _LOWER) >> 32
        return mask


def dfa_growth(pattern: str, ignore_case: bool = False, limit: int = USER_PATTERN_DFA_BYTES) -> tuple[int, int] | None:
    """How RE2's DFA for `pattern` (searched anywhere, as rules are) grows over a text made of
    the pattern's own characters: (bytes of all the states it builds over DFA_PROBE_BYTES, bytes
    of those first built in the second half). A tame pattern builds its states early and then
    reuses them; one whose states are combinations (a counted repetition after a common
    character) keeps building new ones as long as the text goes on. The worse of two probes (see
    below); counting stops past `limit`. None when it cannot be measured: Python's parser cannot
    read the pattern (RE2-only syntax such as `\\pN`) or it has more than _MAX_POSITIONS positions
    (a list of thousands of words); RE2's compile budget is then its only bound."""
    import re
    import warnings

    parser, constants = _sre()
    # Captures do not change the DFA: groups become plain ones (RE2 takes (?<name>...) and a name
    # used twice, Python does not).
    text = re.sub(r"\(\?P?<[A-Za-z_]\w*>", "(?:", pattern)
    for name, ranges in _POSIX.items():
        text = text.replace(f"[:{name}:]", ranges)
    positions = _Positions(constants)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parsed = parser.parse(text, 0)
        flags = parsed.state.flags  # a leading (?i) or (?s) applies to the whole pattern
        _nullable, first, last = positions.sequence(list(parsed), ignore_case or bool(flags & re.IGNORECASE),
                                                    bool(flags & re.DOTALL))
    except (_TooLarge, re.error, ValueError, TypeError, OverflowError, RecursionError):
        return None
    # The byte classes RE2 would make (bytes every position treats alike). Two probes draw from
    # them: every class some position takes (a text of other bytes only resets the search), and
    # those less the classes only a match's last positions take: a text that starts matches
    # and never ends one, which keeps the most of them alive.
    classes = sorted(set(positions.classes))
    signatures: dict[tuple[bool, ...], int] = {}
    for byte in range(256):
        signatures.setdefault(tuple(bool(mask >> byte & 1) for mask in classes), byte)
    taken = [byte for signature, byte in signatures.items() if any(signature)]
    inner = [byte for byte in taken
             if any(mask >> byte & 1 for q, mask in enumerate(positions.classes) if q not in last)]
    per_state = _STATE_BYTES + 8 * (len(signatures) + 1)
    built = late = 0
    for alphabet in (taken, inner):
        if alphabet:
            one_built, one_late = _probe(positions, frozenset(first), alphabet, per_state, limit)
            built, late = max(built, one_built), max(late, one_late)
    return built, late


def _probe(positions: _Positions, first: frozenset[int], alphabet: list[int], per_state: int,
           limit: int) -> tuple[int, int]:
    """Run the DFA over DFA_PROBE_BYTES drawn from `alphabet`: (bytes of all its states, bytes
    of the states first built in the second half), stopping once the first passes `limit`."""
    import random

    takes = [frozenset(q for q, mask in enumerate(positions.classes) if mask >> b & 1) for b in alphabet]
    states: dict[frozenset[int], int] = {}
    reach: list[frozenset[int]] = []  # per state: the positions its next byte may take
    moves: list[list[int]] = []  # per state, per symbol: the next state, -1 until first needed
    used = late = work = 0
    half = DFA_PROBE_BYTES // 2

    def state_of(members: frozenset[int], at: int) -> int:
        nonlocal used, late, work
        found = states.get(members)
        if found is None:
            found = states[members] = len(reach)
            out = set(first)
            for p in members:
                out |= positions.follow[p]
            work += len(out)
            reach.append(frozenset(out))
            moves.append([-1] * len(alphabet))
            cost = per_state + 4 * len(members)
            used += cost
            late += cost if at >= half else 0
        return found

    current = state_of(frozenset(), 0)
    text = random.Random(0x5EED).choices(range(len(alphabet)), k=DFA_PROBE_BYTES)
    for at, symbol in enumerate(text):
        nxt = moves[current][symbol]
        if nxt < 0:
            nxt = moves[current][symbol] = state_of(reach[current] & takes[symbol], at)
            if used > limit or work > _MAX_WORK:
                break
        current = nxt
    return used, late


def budget_error(pattern: str, ignore_case: bool = False) -> str | None:
    """Why a user's pattern does not fit RE2's memory bounds for user rules (a phrase that follows
    the pattern: "needs more than ..."), or None."""
    try:
        compile_pattern(pattern, ignore_case)
    except ValueError:
        return None  # not RE2 at all: the schema says why (pattern_error)
    options = re2.Options()
    options.encoding = re2.Options.Encoding.LATIN1
    options.log_errors = False
    options.max_mem = USER_PATTERN_MAX_MEM
    try:
        re2.compile(_flags(pattern, ignore_case), options)
    except re2.error:
        return (f"needs more than {USER_PATTERN_MAX_MEM >> 20} MiB of RE2 memory to compile "
                "(long alternations or counted repetitions)")
    growth = dfa_growth(pattern, ignore_case, limit=USER_PATTERN_DFA_BYTES)
    if growth is None:
        return None
    built, late = growth
    if built > USER_PATTERN_DFA_BYTES:
        return f"needs more than {USER_PATTERN_DFA_BYTES >> 20} MiB of RE2 memory for its DFA"
    if late > USER_PATTERN_DFA_GROWTH:
        return (f"makes RE2's DFA grow with the text ({late >> 10} KiB of new states per "
                f"{DFA_PROBE_BYTES >> 11} KiB of its own characters, bound {USER_PATTERN_DFA_GROWTH >> 10} KiB): "
                "a counted repetition after a common character, as in (a|b)*a(a|b){20}, needs a state for "
                "every mix of them, and every rule slows down")
    return None


def set_budget_error(patterns: list[tuple[str, bool]]) -> int | None:
    """The index of the first pattern from which `patterns`, compiled as one RE2 set, no longer
    fit USER_SET_MAX_MEM (then it and those after it are refused); None when they all fit."""

    def fits(count: int) -> bool:
        options = re2.Options()
        options.encoding = re2.Options.Encoding.LATIN1
        options.log_errors = False
        options.max_mem = USER_SET_MAX_MEM
        one = re2.Set.SearchSet(options)
        try:
            for pattern, ignore_case in patterns[:count]:
                one.Add(_flags(pattern, ignore_case))
            one.Compile()
        except re2.error:
            return False
        return True

    if not patterns or fits(len(patterns)):
        return None
    low, high = 0, len(patterns)  # fits(low), not fits(high)
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return high - 1

"""The fast scanner's engine (API: `gpufix.fastscan`): `LogScanner`'s results, several times faster.

`scan_file(path, ruleset)` returns exactly what
`LogScanner.for_rules(ruleset).scan_stream(open(path, "rb"), path)` returns (same hits, line
numbers, texts, ranks, groups, counts, exceptions and causes, notes, lines_read, bytes_read), but:

* The file is cut into the very blocks `LogScanner` would read (1 MiB reads, each block ending at
  the last newline, the line-less rest carried into the next, a line longer than a block scanned
  in pieces). The cut points are found by reading back a few KiB from each MiB boundary, so the
  plan costs milliseconds and any range of blocks can be scanned on its own, in another process.
  Keeping `LogScanner`'s blocks keeps its semantics where they matter: a match (a wrapped line
  joined by `\\s+`, a pattern ending in `$`) can span lines within a block, never across blocks.
* Each block gets one linear-time pass: one RE2 set holding every line pattern plus the exception
  regex, over the block's normalised bytes (ANSI codes stripped, CRLF and lone CR turned into LF,
  exactly as `LogScanner` normalises; a block with no ESC and no CR is used as is). A block where
  nothing matches (nearly every block of a big log) costs that pass, a newline count and a 1 MiB
  pread. A block where something matches is attributed as `LogScanner` does it, but only for the
  patterns the set reported, and the exception regex only when the set reported it.
* Memory stays bounded: one block at a time is read (pread, not a map: see `LogFile`), scanned
  and dropped; what is kept is capped as in `LogScanner` (50 hits a pattern, 1000 exceptions).

`scan_files(paths, ruleset, jobs)` scans files in parallel processes (as many as the CPUs this
process may run on) and splits a big file into ranges of whole blocks, merged in order: line
numbers shifted by the newline counts of earlier ranges, per-pattern hit lists re-capped, the
exception cap applied across ranges, an exception chained to one in an earlier range pointed there.
The result is identical to the serial scan.
"""

from __future__ import annotations

import math
import os
import re
from typing import TYPE_CHECKING, Any

import re2

from gpufix.evidence import Evidence, ExceptionRecord, Hit, LineRef
from gpufix.logscan import (
    _ANSI,
    _EXCEPTION,
    BLOCK_BYTES,
    MAX_EXCEPTIONS_KEPT,
    MAX_HITS_KEPT,
    TAIL_BYTES,
    LogScanner,
    _Block,
    framework_of,
    frameworks_in,
    keep_tail,
    scan_exceptions,
    unquote,
)
from gpufix.record.layout import data_ranges
from gpufix.regex import _SET_OPTIONS, PatternSet, _flags, decode_groups

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from gpufix.rules.model import RuleSet

RFIND_STEP = 64 << 10
SPLIT_MIN_PART = 16 << 20  # never split a file into ranges smaller than this
_PREV = -1  # an exception's cause: the last exception kept before this range (None if none)

# Python's `re` strips ANSI codes identically to RE2 (same leftmost-first semantics; checked by
# the tests) and ~10x faster: RE2's Python `sub` loops over the matches in Python.
_ANSI_PY = re.compile(_ANSI.pattern.removeprefix(b"(?m)"))
_CRLF = re.compile(b"\r\n")

# (start, end, kind): raw byte range of one block; kind 0 plain, 1 a piece of a giant line,
# 2 the end of a file whose last line has no newline, with the plain block before it (LogScanner appends a newline).
Block = tuple[int, int, int]
PLAIN, GIANT, TAIL = 0, 1, 2


def plan_blocks(file: LogFile) -> list[Block]:
    """The blocks `LogScanner.scan_stream` would cut the file into, as raw byte ranges: of each of its data
    ranges (a long run's output.log has its middle punched out, record/writer.py), as `KeptOutput` reads it."""
    blocks: list[Block] = []
    for start, end in file.ranges:
        blocks += _plan_range(file, start, end)
    return blocks


def _plan_range(file: LogFile, start: int, size: int) -> list[Block]:
    blocks: list[Block] = []
    read = start  # bytes read so far; `start`: start of the carried bytes, the previous cut
    while read < size:
        read = min(read + BLOCK_BYTES, size)
        newline = file.last_newline(start, read)
        if newline >= 0:
            blocks.append((start, newline + 1, PLAIN))
            start = newline + 1
        elif read - start >= BLOCK_BYTES:  # one line longer than a block: scanned in pieces
            blocks.append((start, read, GIANT))
            start = read
        # else: no newline yet, at the end of the file: carried
    if start < size:  # the line-less end joins a plain block before it, as LogScanner scans it
        if blocks and blocks[-1][2] == PLAIN:
            start = blocks.pop()[0]
        blocks.append((start, size, TAIL))
    return blocks


def normalise(raw: bytes) -> tuple[bytes, bytes]:
    """(text for line numbering, text for matching), as `logscan._Block` makes them."""
    data = _ANSI_PY.sub(b"", raw) if b"\x1b" in raw else raw
    cr = b"\r" in data
    if cr and _CRLF.search(data):  # 3x faster than replace()'s own search when there is none
        data = data.replace(b"\r\n", b"\n")
    data = unquote(data)
    return data, (data.replace(b"\r", b"\n") if cr else data)


class Partial:
    """What one range of blocks yielded, with line numbers counted from the range's start."""

    __slots__ = ("hits", "hit_counts", "exceptions", "exception_count", "newlines", "giant_line", "frameworks")

    def __init__(self) -> None:
        self.hits: dict[int, list[Hit]] = {}
        self.hit_counts: dict[int, int] = {}
        self.exceptions: list[ExceptionRecord] = []  # cause: local index, _PREV or None
        self.exception_count = 0
        self.newlines = 0
        self.giant_line: int | None = None  # first giant block's line (relative), if any
        self.frameworks: set[str] = set()  # logscan.frameworks_in of every raw block, as LogScanner reads them

    def __getstate__(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        for name, value in zip(self.__slots__, state):
            setattr(self, name, value)


class FastScanner:
    """One rule pack's patterns, compiled once: a combined RE2 set and `LogScanner`'s own set."""

    # literals: per pattern None or (folded, [[str] per factor]) as `RuleSet.line_literals()` gives them

    def __init__(self, patterns: list[tuple[str, bool]], literals: list[Any] | None = None) -> None:
        self.patterns = patterns
        self.logscanner = LogScanner(patterns, literals)
        self.pattern_set: PatternSet = self.logscanner.pattern_set
        self._set = re2.Set.SearchSet(_SET_OPTIONS)  # the same budget as LogScanner's set
        for pattern, ignore_case in patterns:
            self._set.Add(_flags(pattern, ignore_case))
        self._exc_index = self._set.Add(_EXCEPTION.pattern)
        self._set.Compile()

    @classmethod
    def for_rules(cls, ruleset: RuleSet) -> FastScanner:
        key = tuple(ruleset.line_patterns)
        scanner = _SCANNERS.get(key)
        if scanner is None:
            scanner = _SCANNERS[key] = cls(ruleset.line_patterns, ruleset.line_literals())
        return scanner

    # -- one range of blocks ------------------------------------------------------------------

    def scan_blocks(self, file: LogFile, blocks: Sequence[Block], source: str) -> Partial:
        part = Partial()
        line = 1
        for start, end, kind in blocks:
            raw = file.read(start, end)
            part.frameworks |= frameworks_in(raw)
            if kind == TAIL:
                raw += b"\n"
            elif kind == GIANT and part.giant_line is None:
                part.giant_line = line
            numbering, data = normalise(raw)
            found = self._set.Match(data)
            if found:
                self._attribute(_make_block(numbering, data, line, source), found, part)
            line += raw.count(b"\n")
        part.newlines = line - 1
        return part

    def _attribute(self, block: _Block, found: list[int], part: Partial) -> None:
        """`LogScanner._scan_block` on a block where the set found something."""
        data = block.data
        if len(data) > PatternSet.SMALL_INPUT or self.pattern_set.literals is None:
            present = sorted(i for i in found if i != self._exc_index)  # what LogScanner's set says
        else:
            present = self.pattern_set.present(data)  # LogScanner's small-input path, as is
        for index in present:
            regex = self.pattern_set.regex(index)
            kept = part.hits.setdefault(index, [])
            count = part.hit_counts.get(index, 0)
            for match in regex.finditer(data):
                count += 1
                if len(kept) < MAX_HITS_KEPT:
                    kept.append(Hit(block.span_refs(match.start(), match.end()), decode_groups(match)))
            part.hit_counts[index] = count
        if self._exc_index in found:
            self._exceptions(block, part)

    @staticmethod
    def _exceptions(block: _Block, part: Partial) -> None:
        """LogScanner's exception scan, with a chain to before the range left as `_PREV`."""
        scan_exceptions(block, part, cause_before=_PREV)


_SCANNERS: dict[tuple[tuple[str, bool], ...], FastScanner] = {}


def _make_block(numbering: bytes, data: bytes, first_line: int, source: str) -> _Block:
    """A `logscan._Block` from already normalised text (its constructor would normalise again)."""
    block = _Block.__new__(_Block)
    block._numbering = numbering
    block.data = data
    block.first_line = first_line
    block.source = source
    return block


# -- merging ranges ---------------------------------------------------------------------------


def _shift(ref: LineRef, offset: int) -> LineRef:
    return ref._replace(line=ref.line + offset) if offset else ref


def merge(parts: Iterable[Partial], source: str, size: int) -> Evidence:
    """One file's evidence from its ranges' partial results, in file order."""
    parts = list(parts)
    evidence = Evidence(sources=[source])
    evidence.bytes_read = size
    offset = 0
    for part in parts:
        for index, hits in part.hits.items():
            kept = evidence.hits.setdefault(index, [])
            for hit in hits[: max(0, MAX_HITS_KEPT - len(kept))]:
                kept.append(Hit(tuple(_shift(ref, offset) for ref in hit.lines), hit.groups) if offset else hit)
            evidence.hit_counts[index] = evidence.hit_counts.get(index, 0) + part.hit_counts[index]
        before = len(evidence.exceptions)
        for record in part.exceptions:
            if len(evidence.exceptions) >= MAX_EXCEPTIONS_KEPT:
                break
            cause = record.cause
            if cause == _PREV:
                cause = before - 1 if before else None
            elif cause is not None:
                cause += before
            evidence.exceptions.append(ExceptionRecord(record.type, record.message, _shift(record.ref, offset), cause))
        evidence.exception_count += part.exception_count
        if part.giant_line is not None and not evidence.notes:
            evidence.notes.append(
                f"{source}:{part.giant_line + offset}: line longer than {BLOCK_BYTES >> 20} MiB; scanned in pieces"
            )
        offset += part.newlines
    evidence.lines_read = offset
    framework = framework_of(set().union(*(part.frameworks for part in parts)))
    if framework:
        evidence.facts["framework"] = framework
    return evidence


# -- public API -------------------------------------------------------------------------------


class LogFile:
    """A log opened for block reads at any offset (os.pread: no shared file position).

    Not mmap: every block is copied out anyway (normalised, its newlines counted), a 1 MiB
    pread is faster than copying out of a map, and touching a map maps whole page-cache folios
    (0.5-2 MiB a touch here), so a map's resident size grows with the file unless released.
    """

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        try:
            self.size = os.fstat(self.fd).st_size
            self.ranges = data_ranges(self.fd, self.size)
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except BaseException:
            os.close(self.fd)
            raise

    def read(self, start: int, end: int) -> bytes:
        data = os.pread(self.fd, end - start, start)
        while len(data) < end - start:  # short read (a file being truncated stops it)
            more = os.pread(self.fd, end - start - len(data), start + len(data))
            if not more:
                break
            data += more
        return data

    def last_newline(self, start: int, end: int) -> int:
        """Offset of the last newline in [start, end), or -1; reads back from the end in steps."""
        while end > start:
            lo = max(start, end - RFIND_STEP)
            found = self.read(lo, end).rfind(b"\n")
            if found >= 0:
                return lo + found
            end = lo
        return -1

    def __enter__(self) -> LogFile:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def split_ranges(blocks: list[Block], size: int, part_bytes: int) -> list[list[Block]]:
    """Consecutive runs of blocks of about `part_bytes` each (at least one block per run)."""
    if size <= part_bytes or len(blocks) < 2:
        return [blocks]
    count = min(len(blocks), math.ceil(size / part_bytes))
    ranges: list[list[Block]] = []
    current: list[Block] = []
    target = size / count
    for block in blocks:
        current.append(block)
        if block[1] >= target * (len(ranges) + 1) and len(ranges) < count - 1:
            ranges.append(current)
            current = []
    if current:
        ranges.append(current)
    return ranges


def scan_file(path: str, ruleset: RuleSet) -> Evidence:
    """Scan one file in this process; the same Evidence as `LogScanner.scan_stream` gives."""
    scanner = FastScanner.for_rules(ruleset)
    with LogFile(path) as mapped:
        part = scanner.scan_blocks(mapped, plan_blocks(mapped), path)
        evidence = merge([part], path, mapped.size)
        keep_file_tail(evidence, mapped, path)
    return evidence


def keep_file_tail(evidence: Evidence, file: LogFile, source: str) -> None:
    """The last lines of what was scanned (evidence.bytes_read), for the word model, as LogScanner.scan_stream
    keeps them (logscan.keep_tail)."""
    start = max(0, evidence.bytes_read - TAIL_BYTES)
    keep_tail(evidence, source, file.read(start, evidence.bytes_read), whole=start == 0)

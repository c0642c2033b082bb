"""Scan a log or pasted traceback, as bytes, for the rule pack's line patterns and exceptions.

One pass per 1 MiB block: an RE2 set says which patterns occur in the block at all, then only
those are searched to find their lines. Memory stays bounded whatever the input: blocks are
processed and dropped, a line longer than a block is scanned in pieces, and only the first
`MAX_HITS_KEPT` matches of each pattern are kept (the rest are counted).

Messy logs are normalised on the block before matching: ANSI colour codes removed, CRLF turned
into LF, carriage-return progress updates split into segments (line numbers still count only
real newlines, so they agree with an editor). Rank prefixes (`[rank3]:`, `[default0]:`, Slurm's
`3: `) are read for the evidence, and Ray's worker prefixes (`(RayTrainWorker pid=2871, ip=...)`)
taken off, as are the timestamp, level and logger fields of logging formats and log collectors and the
"> " of a quoted paste; patterns are searched anywhere in a line, so they do not care. Exceptions are read
at the start of a line, after such prefixes, and from a notebook traceback's header line when the paste
lacks the exception's own line. A pattern may span a terminal-wrapped line by using `\\s+` between words.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

TYPE_CHECKING = False  # typing costs start-up time; annotations are strings (PEP 563)
if TYPE_CHECKING:
    from typing import Any, BinaryIO

from gpufix.evidence import Evidence, ExceptionRecord, Hit, LineRef
from gpufix.regex import PatternSet, compile_pattern, decode_groups

if TYPE_CHECKING:
    from gpufix.rules.model import RuleSet

BLOCK_BYTES = 1 << 20
MAX_HITS_KEPT = 50
MAX_EXCEPTIONS_KEPT = 1000
EVIDENCE_TEXT_MAX = 400
MESSAGE_CONTINUATION_LINES = 4
# Each input's end kept for the word model (gpufix/wordmodel.py), where a failure states itself. The corpus's
# cases it was trained on are excerpts of a few KiB; a long log's healthy start would only dilute its words.
TAIL_BYTES = 16 * 1024

_ANSI = compile_pattern(
    r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b\n]*(?:\x07|\x1b\\)|\x1b[()][A-Za-z0-9]|\x1b[=>78]"
)
# A log pasted as a Markdown or e-mail quote ("> RuntimeError: ...", "> > ..."): the markers come off so that a message
# wrapped over quoted lines still matches. Python's REPL prompt (">>> ") is not a quote.
_QUOTE = re.compile(rb"(?m)^(?:>(?!>) ?)+")


def unquote(data: bytes) -> bytes:
    """`data` without the quote markers at its lines' starts (lines end at a newline; a lone CR is not one here)."""
    return _QUOTE.sub(b"", data) if data[:1] == b">" or b"\n>" in data else data


_RANK_PREFIX_RE = (
    r"(?:[\w.-]+: )?"  # pdsh/DeepSpeed host label
    r"(?:\[(?:rank|default)(?P<rank>\d+)\]:|(?P<slurm>\d{1,5}): |\[\d+,(?P<mpi>\d+)\]<std(?:out|err)>:"
    # Ray's worker prefix, no rank in it: "(RayTrainWorker pid=2871, ip=10.0.0.2)", "(pid=2871)", "(raylet)"
    r"|\((?:[A-Za-z_][\w.:-]* )?pid=\d+(?:, [a-z_]+=[^)\n]*)*\)|\(raylet(?:, ip=[\w.:-]+)?\))"
)
# What a log collector or a logging call puts before a program's own line: a timestamp (ISO, bracketed or
# not; Kubernetes' RFC 3339) with the level, logger and location fields logging formats add ("2024-03-01
# 12:30:05,123 - root - ERROR - ", "[2024-03-01 12:30:05,123] [ERROR] [train.py:12:main] ", loguru's
# "... | ERROR    | train:main:12 - "); Python's default "ERROR:root:"; glog's "E0302 12:30:05.123456 4242
# file.cc:12] "; and the "> " of a quoted paste. An exception logged under such a prefix is still read.
_LEVEL = r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)"
_LOG_PREFIX_RE = (
    r"(?:\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?(?:[ \t]*[-|:])?[ \t]+"
    # (unbounded `+`, not {1,80}: RE2 copies a counted repetition into its program, and inside {0,4} that made
    # this and _EXCEPTION cost 3 ms to compile, a tenth of explain's start-up; RE2 never backtracks either way)
    r"(?:\[[^\]\n]+\](?:[ \t]*[-|])?[ \t]+|" + _LEVEL + r"\b[ \t]*(?:[-|:][ \t]+)?|[\w.:<>-]+[ \t]+[-|][ \t]+){0,4}"
    r"|" + _LEVEL + r":[\w.<>-]*:"
    r"|[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+[ \t]+\d+[ \t]+[\w./-]+:\d+\][ \t]"
    r"|(?:>[ \t])+)"
)
_PREFIX_RE = r"(?:" + _LOG_PREFIX_RE + r"[ \t]*)?(?:" + _RANK_PREFIX_RE + r")?"
_PREFIX = compile_pattern("^(?:" + _LOG_PREFIX_RE + r"[ \t]*)?(?:" + _RANK_PREFIX_RE + r"[ \t]?)?")
_EXCEPTION = compile_pattern(
    r"^" + _PREFIX_RE + r"[ \t]*"
    # A bare `Exception: msg` counts (raise Exception(...)); a bare `Error:` is too common in logs.
    r"(?:(?P<type>(?:[A-Za-z_][A-Za-z0-9_]*\.)*(?:[A-Za-z_][A-Za-z0-9_]*(?:Error|Exception|Exit|Interrupt|Fault)|Exception))"
    # Ray names the exception a remote task raised in parentheses, "ray.exceptions.RayTaskError(DistBackendError): ray::...":
    # that inner type is the failure, and it is recorded as the exception's type
    r"(?:\((?P<inner>(?:[A-Za-z_][A-Za-z0-9_]*\.)*[A-Za-z_][A-Za-z0-9_]*(?:Error|Exception|Exit|Interrupt|Fault))\))?"
    r"(?:[ \t]*$|:(?P<message>[^\n]*)$)"
    r"|(?P<chain>During handling of the above exception|The above exception was the direct cause)"
    # IPython/Jupyter put the type in the traceback's header, "OutOfMemoryError      Traceback (most recent
    # call last)": a paste from a notebook is often cut before the "OutOfMemoryError: ..." line at its end
    r"|(?P<ipython>(?:[A-Za-z_][A-Za-z0-9_]*\.)*[A-Za-z_][A-Za-z0-9_]*(?:Error|Exception|Exit|Interrupt|Fault))"
    r"[ \t]{2,}Traceback \(most recent call last\)[ \t]*$)"
)
# Lines that end an exception message's continuation.
_MESSAGE_STOP = compile_pattern(
    r"^\s*(?:Traceback \(most recent call last\)|File \"|During handling|The above exception|"
    r"(?:[A-Za-z_][\w.]*)?(?:Error|Exception|Warning):|\[[A-Z]\d|frame #|Exception raised from)"
)


def split_prefix(line: bytes) -> tuple[bytes, int | None]:
    """Remove a rank/host prefix from one line; return the rest and the rank it named."""
    match = _PREFIX.match(line)
    if not match or not match.end():
        return line, None
    rank = match.group(b"rank") or match.group(b"slurm") or match.group(b"mpi")
    return line[match.end():], int(rank) if rank else None


def _clip(text: str, start: int) -> str:
    if len(text) <= EVIDENCE_TEXT_MAX:
        return text
    lo = max(0, min(start - 80, len(text) - EVIDENCE_TEXT_MAX))
    clipped = text[lo:lo + EVIDENCE_TEXT_MAX]
    return ("…" if lo else "") + clipped + ("…" if lo + EVIDENCE_TEXT_MAX < len(text) else "")


class _Block:
    """One normalised block and the mapping from its positions back to input line numbers."""

    def __init__(self, raw: bytes, first_line: int, source: str) -> None:
        data = _ANSI.sub(b"", raw) if b"\x1b" in raw else raw
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
        data = unquote(data)
        # Line numbers count real newlines: keep the text before lone CRs become line breaks
        # (same length, so positions agree).
        self._numbering = data
        self.data = data.replace(b"\r", b"\n") if b"\r" in data else data
        self.first_line = first_line
        self.source = source

    def line_number(self, pos: int) -> int:
        return self.first_line + self._numbering.count(b"\n", 0, pos)

    def line_bounds(self, pos: int) -> tuple[int, int]:
        start = self.data.rfind(b"\n", 0, pos) + 1
        end = self.data.find(b"\n", pos)
        return start, (len(self.data) if end < 0 else end)

    def line_ref(self, pos: int) -> LineRef:
        start, end = self.line_bounds(pos)
        body, rank = split_prefix(self.data[start:end])
        offset = max(0, pos - start - (end - start - len(body)))
        text = body.decode("utf-8", "replace").rstrip()
        return LineRef(self.source, self.line_number(pos), _clip(text, offset), rank)

    def span_refs(self, start: int, end: int) -> tuple[LineRef, ...]:
        """The physical lines a match covers (several when it spans a wrapped line)."""
        refs = [self.line_ref(start)]
        pos = self.data.find(b"\n", start, max(start, end - 1))
        while pos >= 0 and len(refs) < 4:
            refs.append(self.line_ref(pos + 1))
            pos = self.data.find(b"\n", pos + 1, max(pos + 1, end - 1))
        return tuple(refs)


# Which framework printed a log, for fix advice that fits it (a TensorFlow log is not told to check `torch`): the words
# its module paths and messages carry, in module form where the bare word is also prose ("ajax", a Pong agent's
# "paddle"). A log that names none of them, or several, gets no `framework` fact.
FRAMEWORK_MARKERS = (("pytorch", (b"torch",)), ("tensorflow", (b"tensorflow",)), ("jax", (b"jaxlib", b"jax.", b"/jax/")),
                     ("paddle", (b"paddle/", b"paddlepaddle", b"import paddle", b"paddle.fluid", b"paddle.base",
                                 b"paddle.nn", b"paddle.io", b"paddle.utils", b"paddle.distributed", b"paddle.framework")),
                     ("mxnet", (b"mxnet",)),
                     # Julia's and Rust's GPU stacks (their errors carry CUDA's words, and torch's snippets would mislead)
                     ("julia", (b".julia/packages/", b".julia\\packages\\", b"CUDA.jl", b"ERROR: LoadError:", b"CuArray{")),
                     # (the crates by name: a bare .cargo path also shows when Python's tokenizers panics)
                     ("rust", (b"candle_core", b"candle-core", b"cudarc", b"tch::", b"TchError", b"burn-core", b"burn-tensor")))


def frameworks_in(data: bytes) -> set[str]:
    """The frameworks whose markers occur in `data`."""
    return {name for name, markers in FRAMEWORK_MARKERS if any(marker in data for marker in markers)}


def framework_of(seen: set[str]) -> str | None:
    """The one framework a log's markers named, else None (none, or a mix such as Keras on torch)."""
    return next(iter(seen)) if len(seen) == 1 else None


def keep_tail(evidence: Evidence, source: str, window: bytes, whole: bool) -> None:
    """Record an input's end for the word model: `window` is its last TAIL_BYTES (`whole` when that is all
    of it), kept from the first line that starts inside it (the last line alone when it is longer)."""
    if not whole:
        cut = window.find(b"\n") + 1
        if 0 < cut < len(window):
            window = window[cut:]
    window = _ANSI.sub(b"", window)  # colour codes are no words (they hold no newline: numbering stays)
    if not window.strip():
        return
    newlines = window.count(b"\n")
    first = evidence.lines_read - newlines + (1 if window.endswith(b"\n") else 0)
    evidence.tails.append((source, max(first, 1), window.decode("utf-8", "replace")))


class LogScanner:
    """Scans inputs for one pattern list; reusable across files."""

    def __init__(self, patterns: list[tuple[str, bool]], literals: list[Any] | None = None, keys: Any = None) -> None:
        self.pattern_set = PatternSet(patterns, literals, keys)

    @classmethod
    def for_rules(cls, ruleset: RuleSet) -> LogScanner:
        """A scanner for a rule pack's line patterns (with their literals, when known)."""
        return cls(ruleset.line_patterns, ruleset.line_literals(), ruleset.line_keys())

    def scan_stream(self, stream: BinaryIO, source: str) -> Evidence:
        """Scan a binary stream to its end; the stream is read in blocks, never whole."""
        evidence = Evidence(sources=[source])
        line = 1
        carry = b""
        giant_line_noted = False
        frameworks: set[str] = set()
        window = b""  # the input's last TAIL_BYTES, for the word model
        # A block is scanned once the next read shows whether the input goes on: a last line without a newline
        # joins the block before it, so a message wrapped onto that line still matches (the fast scanner's
        # plan_blocks cuts the same way).
        pending, pending_line, pending_plain = b"", 1, False

        def flush(block: bytes, first_line: int) -> None:
            if block:
                self._scan_block(_Block(block, first_line, source), evidence)
                frameworks.update(frameworks_in(block))

        while True:
            chunk = stream.read(BLOCK_BYTES)
            if not chunk:
                break
            evidence.bytes_read += len(chunk)
            window = (window + chunk[-TAIL_BYTES:])[-TAIL_BYTES:]
            data = carry + chunk
            cut = data.rfind(b"\n") + 1
            if cut == 0 and len(data) < BLOCK_BYTES:
                carry = data
                continue
            plain = cut > 0
            if cut == 0:  # one line longer than a block: scan it in pieces
                cut = len(data)
                if not giant_line_noted:
                    evidence.notes.append(
                        f"{source}:{line}: line longer than {BLOCK_BYTES >> 20} MiB; scanned in pieces"
                    )
                    giant_line_noted = True
            block, carry = data[:cut], data[cut:]
            flush(pending, pending_line)
            pending, pending_line, pending_plain = block, line, plain
            line += block.count(b"\n")
        if carry:  # the line-less end: with the plain block before it, else on its own; a newline closes it
            if not (pending and pending_plain):
                flush(pending, pending_line)
                pending, pending_line = b"", line
            pending += carry + b"\n"
            line += 1
        flush(pending, pending_line)
        evidence.lines_read = line - 1
        keep_tail(evidence, source, window, whole=evidence.bytes_read <= TAIL_BYTES)
        framework = framework_of(frameworks)
        if framework:
            evidence.facts["framework"] = framework
        return evidence

    def scan_bytes(self, data: bytes, source: str = "<text>") -> Evidence:
        """Scan an in-memory text (tests, rule examples)."""
        import io

        return self.scan_stream(io.BytesIO(data), source)

    def _scan_block(self, block: _Block, evidence: Evidence) -> None:
        data = block.data
        for index in self.pattern_set.present(data):
            regex = self.pattern_set.regex(index)
            kept = evidence.hits.setdefault(index, [])
            count = evidence.hit_counts.get(index, 0)
            for match in regex.finditer(data):
                count += 1
                if len(kept) < MAX_HITS_KEPT:
                    kept.append(Hit(block.span_refs(match.start(), match.end()), decode_groups(match)))
            evidence.hit_counts[index] = count
        self._scan_exceptions(block, evidence)

    def _scan_exceptions(self, block: _Block, evidence: Evidence) -> None:
        scan_exceptions(block, evidence)

    @staticmethod
    def _continuation(data: bytes, pos: int, blank_first: int = 0) -> Iterable[str]:
        """Lines that continue an exception's message (PyTorch's hints, wrapped driver text); up to
        `blank_first` blank lines before them are passed over (a message that starts with newlines)."""
        for _ in range(MESSAGE_CONTINUATION_LINES + blank_first):
            if pos >= len(data):
                return
            start = pos + 1
            end = data.find(b"\n", start)
            end = len(data) if end < 0 else end
            body, _rank = split_prefix(data[start:end])
            if not body.strip() and blank_first:
                blank_first -= 1
                pos = end
                continue
            blank_first = 0
            if not body.strip() or _MESSAGE_STOP.match(body):
                return
            yield body.strip()[:2000].decode("utf-8", "replace")
            pos = end


def _spawn_report(type_name: str, message: str) -> bool:
    """torch.multiprocessing.spawn's re-raise of a process's failure in the parent: "Exception: " (torch
    1.x) or "torch.multiprocessing.spawn.ProcessRaisedException: ", then "-- Process 2 terminated with the
    following error:" and that process's own traceback."""
    return (message.startswith("-- Process ") and "terminated with the following error" in message[:80]
            and type_name.rsplit(".", 1)[-1] in ("Exception", "ProcessRaisedException"))


def _drop_answered_headers(into: Any, headers: list[int]) -> None:
    """Remove IPython header records whose exception's own `Type: message` line follows (the same
    exception twice), renumbering the causes of the records after them."""
    records = into.exceptions
    drop = {i for i in headers if any(r.type == records[i].type and r.message for r in records[i + 1:])}
    if not drop:
        return
    new_index = {old: old - sum(1 for d in drop if d < old) for old in range(len(records)) if old not in drop}

    def renumbered(record: ExceptionRecord) -> ExceptionRecord:
        if record.cause is None or record.cause < 0:  # none, or before this range (the fast scanner's mark)
            return record
        return record._replace(cause=new_index.get(record.cause))

    records[:] = [renumbered(r) for i, r in enumerate(records) if i not in drop]
    into.exception_count -= len(drop)


def scan_exceptions(block: _Block, into: Any, cause_before: int | None = None) -> None:
    """Add a block's exceptions to `into` (anything with `exceptions` and `exception_count`).

    A "During handling of the above exception" marker makes the next exception's cause the one
    before it; when there is none yet in `into`, `cause_before` (the fast scanner marks a chain
    that reaches back into an earlier range of the file this way).
    """
    data = block.data
    chained = False
    headers: set[int] = set()  # IPython header records, dropped when their exception's own line follows
    for match in _EXCEPTION.finditer(data):
        if match.group(b"chain"):
            chained = True
            continue
        header = match.group(b"ipython")
        if header:
            into.exception_count += 1
            if len(into.exceptions) < MAX_EXCEPTIONS_KEPT:
                headers.add(len(into.exceptions))
                into.exceptions.append(ExceptionRecord(header.decode("ascii", "replace"), "",
                                                       block.line_ref(match.start()), None))
            continue
        into.exception_count += 1
        if len(into.exceptions) >= MAX_EXCEPTIONS_KEPT:
            continue
        message = (match.group(b"message") or b"").strip().decode("utf-8", "replace")
        # "Exception: " and nothing after the colon: a message that starts with newlines, as
        # torch.multiprocessing.spawn's "\n\n-- Process 2 terminated with the following error:"
        opens_later = not message and data[match.start():match.end()].rstrip().endswith(b":")
        message = "\n".join([message, *LogScanner._continuation(data, match.end(), 2 if opens_later else 0)]).strip()
        previous = next((i for i in range(len(into.exceptions) - 1, -1, -1) if i not in headers), None)
        cause = (previous if previous is not None else cause_before) if chained else None
        chained = False
        type_name = (match.group(b"inner") or match.group(b"type")).decode("ascii", "replace")
        if _spawn_report(type_name, message):
            continue  # mp.spawn's report of another process's exception, which follows it (unless the paste is cut)
        into.exceptions.append(ExceptionRecord(type_name, message, block.line_ref(match.start()), cause))
    if headers:
        _drop_answered_headers(into, sorted(headers))

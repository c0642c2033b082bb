"""`gpufix explain`: diagnose pasted tracebacks and log files, offline, without torch or NVML."""

from __future__ import annotations

import os
import stat
import sys

TYPE_CHECKING = False  # typing costs start-up time; annotations are strings (PEP 563)
if TYPE_CHECKING:
    from typing import BinaryIO

    from gpufix.record.reader import Record

from gpufix.engine import diagnose
from gpufix.errors import InputError
from gpufix.evidence import Evidence, ExceptionRecord, Hit, LineRef
from gpufix.findings import Finding
from gpufix.logscan import LogScanner
from gpufix.record.layout import OUTPUT_LOG
from gpufix.record.reader import is_record
from gpufix.rules.model import RuleSet

STDIN = "-"
BINARY_SNIFF_BYTES = 65536
BINARY_CONTROL_RATIO = 0.30


class Diagnosis:
    """What `explain` concluded: findings (root cause first) and the evidence behind them."""

    def __init__(self, findings: list[Finding], evidence: Evidence, notes: list[str] | None = None) -> None:
        self.findings = findings
        self.evidence = evidence
        self.notes = list(notes or [])

    @property
    def root(self) -> Finding | None:
        return self.findings[0] if self.findings else None

    @property
    def gpu_related(self) -> bool:
        return any(f.is_gpu for f in self.findings)

    def to_dict(self) -> dict[str, object]:
        root = self.root
        return {
            "findings": [f.to_dict() for f in self.findings],
            "summary": {
                "root_cause": root.code if root else None,
                "category": root.category if root else None,
                "gpu_related": self.gpu_related,
                "finding_count": len(self.findings),
            },
            "inputs": {
                "sources": list(self.evidence.sources),
                "lines": self.evidence.lines_read,
                "bytes": self.evidence.bytes_read,
            },
            "notes": list(self.notes),
        }


def _looks_binary(head: bytes) -> bool:
    if not head:
        return False
    # Logs may hold a few NULs or invalid UTF-8 bytes; binary files are full of both.
    # Backspace and form feed are text here: Keras progress bars are a third backspaces.
    control = sum(1 for b in head if b < 32 and b not in (8, 9, 10, 11, 12, 13, 27)) + head.count(b"\x7f")
    undecodable = head.decode("utf-8", "replace").count("\ufffd")
    return (control + undecodable) / len(head) > BINARY_CONTROL_RATIO


class _Sniffed:
    """A binary stream whose first bytes were read to sniff for binary data, then replayed."""

    def __init__(self, stream: BinaryIO, head: bytes) -> None:
        self.stream, self.head = stream, head

    def read(self, size: int = -1) -> bytes:
        if self.head:
            out, self.head = self.head[:size] if size >= 0 else self.head, self.head[size:] if size >= 0 else b""
            return out
        return self.stream.read(size)


def _scan(scanner: LogScanner, stream: BinaryIO, source: str, sniff: bool = True) -> Evidence:
    """Scan one input. `sniff`: refuse one that looks binary (a user passing the wrong file); a
    run record's output is the job's text with whatever binary it printed, and is always scanned."""
    try:
        head = stream.read(BINARY_SNIFF_BYTES)
    except OSError as exc:
        raise InputError(f"cannot read {source}: {exc.strerror or exc}") from None
    if sniff and _looks_binary(head):
        raise InputError(
            f"{source} looks like binary data, not a log or traceback",
            hint="pass the text log (for a run record, the log file inside it)",
        )
    try:
        return scanner.scan_stream(_Sniffed(stream, head), source)  # type: ignore[arg-type]
    except OSError as exc:
        raise InputError(f"cannot read {source}: {exc.strerror or exc}") from None


def _record_output(path: str) -> str:
    """A `gpufix run` record folder (meta.json + output.log) stands for its output.log."""
    return os.path.join(path, OUTPUT_LOG) if is_record(path) else path


def add_record_evidence(evidence: Evidence, record_dir: str, scanner: LogScanner) -> None:
    """Everything of a record beyond its output.log: stack dumps (a hang: text for the same
    rules, rules/hangs) and the measurements (`add_record_measurements`)."""
    from gpufix.record.reader import Record

    record = Record(record_dir)
    for dump in record.stack_dumps:
        try:
            with _open(dump) as stream:
                evidence.merge(_scan(scanner, stream, dump))
        except InputError as exc:  # one unreadable dump must not hide the rest of the record
            evidence.notes.append(f"{exc} (skipped)")
    add_record_measurements(evidence, record, scanner)


def add_record_measurements(evidence: Evidence, record: Record, scanner: LogScanner) -> None:
    """A record's measurements for rules: telemetry.jsonl (series of the job's GPUs, Xid events
    as kernel-style lines), the output rate (output.idx) and the probe's series, facts and
    structured exceptions (docs/probe.md)."""
    _add_meta_facts(evidence, record.meta)
    try:
        if record.telemetry.lines:
            from gpufix.telemetry.series import telemetry_evidence

            measured = telemetry_evidence(record.telemetry)
            _add_series(evidence, measured.series)
            if measured.xid_lines:
                evidence.merge(_scan_at_lines(scanner, measured.xid_lines, record.telemetry.path))
        _add_series(evidence, _output_rate(record))
        if record.has_probe:
            _add_probe(evidence, record, scanner)
    except OSError as exc:
        evidence.notes.append(f"{record.path}: cannot read its measurements ({exc.strerror or exc})")


def _scan_at_lines(scanner: LogScanner, lines: list[tuple[int, str]], source: str) -> Evidence:
    """Scan made-up lines as if they stood at the given line numbers of `source` (quoted there)."""
    found = scanner.scan_bytes("\n".join(text for _n, text in lines).encode() + b"\n", source)
    where = [n for n, _text in lines]

    def moved(ref: LineRef) -> LineRef:
        return ref._replace(line=where[ref.line - 1]) if 0 < ref.line <= len(where) else ref

    found.hits = {index: [Hit(tuple(moved(r) for r in hit.lines), hit.groups) for hit in hits]
                  for index, hits in found.hits.items()}
    return found


def _add_meta_facts(evidence: Evidence, meta: dict[str, object]) -> None:
    """The job's environment as facts rules can guard on (e.g. an allocator setting already made)."""
    environment = meta.get("environment") or {}
    if not isinstance(environment, dict):
        return
    for variable, fact in (("PYTORCH_CUDA_ALLOC_CONF", "pytorch_cuda_alloc_conf"), ("CUDA_VISIBLE_DEVICES", "cuda_visible_devices")):
        if isinstance(environment.get(variable), str):
            evidence.facts.setdefault(fact, environment[variable])


def _add_series(evidence: Evidence, series: dict[str, list]) -> None:  # type: ignore[type-arg]
    for name, samples in series.items():
        evidence.series.setdefault(name, []).extend(samples)


def _output_rate(record: Record) -> dict[str, list]:  # type: ignore[type-arg]
    """Bytes the job wrote per second of its run, from the record's output index, and the share
    of each second it was held up by its output (gpufix waiting on a slow reader: result.json)."""
    from gpufix.record.layout import RESULT
    from gpufix.series import Sample

    per_second: dict[int, int] = {}
    for chunk in record.chunks():
        per_second[int(chunk.time_s)] = per_second.get(int(chunk.time_s), 0) + chunk.length
    if not per_second:
        return {}
    last = max(per_second)
    out = {"output.bytes_per_s": [Sample(float(t), float(per_second.get(t, 0)), None, record.output_index, 0)
                                  for t in range(last + 1)]}
    blocked = _output_blocked(record.result)
    if blocked:
        out["output.blocked_frac"] = [Sample(float(t), min(1.0, blocked.get(t, 0.0)), None, record.file(RESULT), 0)
                                      for t in range(max(last, max(blocked)) + 1)]
    return out


def _output_blocked(result: dict[str, object]) -> dict[int, float]:
    try:
        raw = result.get("output_blocked_s") or {}
        return {int(second): float(waited) for second, waited in raw.items()}  # type: ignore[attr-defined]
    except (ValueError, AttributeError, TypeError):
        return {}


def _add_probe(evidence: Evidence, record: Record, scanner: LogScanner) -> None:
    from gpufix.probe.read import nonfinite_lines, read_probe_exceptions, read_probe_series
    from gpufix.series import Sample

    probe_dir = record.probe_dir
    _add_series(evidence, read_probe_series(probe_dir))
    for path, lines in nonfinite_lines(probe_dir).items():
        evidence.merge(_scan_at_lines(scanner, lines, path))
    facts = record.probe_facts
    if facts.get("found"):
        if facts.get("torch"):
            evidence.facts.setdefault("torch_version", str(facts["torch"]))
            evidence.facts.setdefault("torch_cuda_build", str(facts.get("cuda_build") or "none"))
        _add_loader_facts(evidence, facts.get("loaders") or [], facts)
        _add_run_facts(evidence, facts, probe_dir)
        has_cuda = bool(facts.get("cuda_build")) if facts.get("torch") else None
        for name, value in (("probe.gpu_visible", facts.get("device_count")),
                            ("probe.cuda_ever_allocated", facts.get("cuda_ever_allocated")),
                            ("probe.steps", facts.get("steps")),
                            ("probe.torch_has_cuda", has_cuda)):
            if isinstance(value, (bool, int, float)):
                evidence.series.setdefault(name, []).append(Sample(0.0, float(value), None, probe_dir, 0))
    # Structured exceptions, unless the output already shows the same one: a rule matching the
    # exception should see it once, and the fallback must not call the copy unexplained.
    seen = {(e.short_type, e.message.split("\n", 1)[0].strip()) for e in evidence.exceptions}
    placed: dict[int, int] = {}  # index in the probe's list -> index in the evidence
    for index, record in enumerate(read_probe_exceptions(probe_dir)):
        key = (record.short_type, record.message.split("\n", 1)[0].strip())
        if key in seen:
            continue
        seen.add(key)
        placed[index] = len(evidence.exceptions)
        cause = placed.get(record.cause) if record.cause is not None else None
        evidence.exceptions.append(ExceptionRecord(record.type, record.message, record.ref, cause))


_LOADER_SETTINGS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor", "batch_size")


def _add_run_facts(evidence: Evidence, facts: dict[str, object], probe_dir: str) -> None:
    """What the probe measured of the run as a whole, so fixes fit it: the precision it trained
    in, whether it used a GPU at all, whether it iterated a DataLoader, and each process's total
    data wait (`probe.data_wait_total_s`: a slow-loader finding needs enough wait to win back)."""
    from gpufix.series import Sample

    if facts.get("precision"):
        evidence.facts.setdefault("precision", str(facts["precision"]))
    if facts.get("steps"):
        if facts.get("cuda_ever_allocated") is not None:
            evidence.facts.setdefault("gpu_used", "yes" if facts["cuda_ever_allocated"] else "no")
        evidence.facts.setdefault("loader_used", "yes" if facts.get("loaders") else "no")
    for process in facts.get("processes") or ():  # type: ignore[attr-defined]
        total = process.get("data_wait_total_s")
        if isinstance(total, (int, float)) and process.get("steps"):
            rank = process.get("rank")
            group = str(rank) if isinstance(rank, int) else "0"
            evidence.series.setdefault("probe.data_wait_total_s", []).append(
                Sample(0.0, float(total), group, str(process.get("file") or probe_dir), int(process.get("last_line") or 0)))


def _add_loader_facts(evidence: Evidence, loaders: list[dict[str, object]], facts: dict[str, object]) -> None:
    """The training loader's settings as facts, so a finding names them and a fix already in
    place (pin_memory=True) is not advised again. The first loader iterated is taken as the
    training one (validation loaders come later in nearly every loop). `workers_suggested` is a
    worker count within the CPUs usable by each training process (one left for the main loop)."""
    if not loaders:
        return
    loader = loaders[0]
    settings = ", ".join(f"{key}={loader.get(key)}" for key in _LOADER_SETTINGS if key in loader)
    if settings:
        evidence.facts.setdefault("loader_settings", settings)
    if isinstance(loader.get("pin_memory"), bool):
        evidence.facts.setdefault("loader_pin_memory", str(loader["pin_memory"]))
    if isinstance(loader.get("cpus_usable"), int):
        evidence.facts.setdefault("cpus_usable", str(loader["cpus_usable"]))
        ranks = facts.get("ranks") or [0]
        per_process = loader["cpus_usable"] // max(1, len(ranks))  # type: ignore[arg-type]
        evidence.facts.setdefault("workers_suggested", str(max(1, min(8, per_process - 1))))


def _open(path: str) -> BinaryIO:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file", hint="pass a log file, or pipe a traceback: gpufix explain < err.txt") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{path} is a directory, not a log file", hint=f"pass the log files inside it, e.g. gpufix explain {path}/*.log")
    try:
        return open(path, "rb")
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None


def explain_record_output(record_dir: str, output: bytes, ruleset: RuleSet, note: str) -> Diagnosis:
    """Diagnose a record whose output.log is incomplete from the output itself (what `gpufix run`
    kept in memory), with the record's measurements; its lines are quoted as output.log's."""
    scanner = LogScanner.for_rules(ruleset)
    evidence = scanner.scan_bytes(output, os.path.join(record_dir, OUTPUT_LOG))
    add_record_evidence(evidence, record_dir, scanner)
    notes = list(ruleset.notes) + evidence.notes + [note]
    return Diagnosis(diagnose(evidence, ruleset, notes), evidence, notes)


def explain(paths: list[str], ruleset: RuleSet, stdin: BinaryIO | None = None) -> Diagnosis:
    """Scan each input (`-` is stdin) and diagnose them together, as one failure."""
    scanner = LogScanner.for_rules(ruleset)
    evidence = Evidence()
    for path in paths or [STDIN]:
        if path == STDIN:
            stream = stdin if stdin is not None else sys.stdin.buffer
            evidence.merge(_scan(scanner, stream, "<stdin>"))
        else:
            log = _record_output(path)
            with _open(log) as stream:
                evidence.merge(_scan(scanner, stream, log, sniff=log == path))
            if log != path:
                add_record_evidence(evidence, path, scanner)
    if evidence.bytes_read == 0 and not evidence.series:
        raise InputError(
            "the input is empty: nothing to explain",
            hint="paste a traceback into `gpufix explain` (end with Ctrl-D) or pass a log file",
        )
    notes = list(ruleset.notes) + evidence.notes
    return Diagnosis(diagnose(evidence, ruleset, notes), evidence, notes)

"""The diagnosis service: evidence in, findings out, for every command.

    evidence_from_text(paths, scanner)      log files and stdin (`gpufix explain`, post-mortem logs)
    evidence_from_record(path, scanner)     a run record: output, stack dumps, measurements
    diagnose(evidence, ruleset)             -> Diagnosis: typed findings (root cause first) and notes
    diagnose_inputs(paths, ruleset)         the two together, for anything a user can pass

`gpufix explain`, run, attach, status, the hang watchdog and post-mortem all come here; none
of it imports torch, NVML, click or rich.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing costs start-up time; annotations are strings (PEP 563)
if TYPE_CHECKING:
    from typing import BinaryIO

    from gpufix.rules.model import RuleSet

from gpufix.diagnosis.inputs import open_input, scan
from gpufix.engine import evaluate
from gpufix.errors import InputError
from gpufix.evidence import Evidence
from gpufix.findings import Finding
from gpufix.logscan import LogScanner

STDIN = "-"


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
        """The root cause is a GPU failure (its consequences may be GPU-flavoured either way: an ordinary
        error on one rank makes the others lose their NCCL peers)."""
        return bool(self.root and self.root.is_gpu)

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


def diagnose(evidence: Evidence, ruleset: RuleSet) -> Diagnosis:
    """The findings for `evidence`, root causes first, with the notes of the rule pack, of
    reading the inputs and of rules that had too few measurements to judge."""
    findings, unevaluated = evaluate(evidence, ruleset)
    return Diagnosis(findings, evidence, [*ruleset.notes, *evidence.notes, *unevaluated])


def evidence_from_record(record_dir: str, scanner: LogScanner, output: bytes | None = None) -> Evidence:
    """A run record's evidence: its output.log (or `output`, what `gpufix run` kept in memory when
    the log is incomplete, quoted as output.log's lines), stack dumps and measurements."""
    from gpufix.diagnosis.record import add_record_evidence  # not on a pasted traceback's path
    from gpufix.record.layout import OUTPUT_LOG, KeptOutput

    log = os.path.join(record_dir, OUTPUT_LOG)
    if output is not None:
        evidence = scanner.scan_bytes(output, log)
    else:
        try:
            kept = KeptOutput(log)
        except OSError:
            kept = open_input(log)  # says what is wrong with the path, as an InputError
        with kept as stream:  # the job's text with whatever binary it printed: no sniffing
            evidence = scan(scanner, stream, log, sniff=False)  # type: ignore[arg-type]
        if getattr(kept, "omitted", 0):
            evidence.notes.append(f"{log}: {kept.omitted} bytes from the middle of the output were not kept (the record "
                                  "keeps a long run's first and last part); line numbers after the gap leave out the lines in it")
    add_record_evidence(evidence, record_dir, scanner)
    # A run's verdict rests on its rules and what was measured; the word model's guess reads pasted logs only
    # (on a healthy run's output it would guess from words what the probe and telemetry measured)
    evidence.tails.clear()
    return evidence


def evidence_from_group(group_dir: str, scanner: LogScanner) -> Evidence:
    """The evidence of every task's record of a Slurm step (gpufix.record.group), as one run whose
    ranks are the tasks: a line no rank prefix places is its task's."""
    from gpufix.record.group import group_parts

    evidence = Evidence()
    for rank, part in group_parts(group_dir):
        part_evidence = evidence_from_record(part, scanner)
        if rank is not None:
            part_evidence = part_evidence.with_rank(rank)
            _place_series(part_evidence, rank, _task_node(part))
        evidence.merge(part_evidence)
    return evidence


def _task_node(record_dir: str) -> str | None:
    from gpufix.record.reader import Record

    slurm = Record(record_dir).meta.get("slurm")
    node = slurm.get("node") or slurm.get("nodeid") if isinstance(slurm, dict) else None
    return None if node is None else str(node)


def _place_series(evidence: Evidence, rank: int, node: str | None) -> None:
    """One task's GPUs named by its node ("node-3:0") among the step's, since every node has a GPU 0.
    (Per-rank series need nothing: the probe takes SLURM_PROCID as a task's rank.)"""
    from gpufix.signals import GPU, SIGNALS

    per_gpu = {signal.name for signal in SIGNALS if signal.per == GPU}
    where = node if node is not None else f"task{rank}"
    for name in per_gpu & evidence.series.keys():
        evidence.series[name] = [s._replace(group=f"{where}:{s.group}") if s.group is not None else s
                                 for s in evidence.series[name]]


def evidence_from_text(paths: list[str], scanner: LogScanner, stdin: BinaryIO | None = None) -> Evidence:
    """Scan each input (`-` is stdin; a run record folder stands for the record) as one failure."""
    evidence = Evidence()
    if paths and paths != [STDIN]:
        from gpufix.record.group import is_group
        from gpufix.record.reader import is_record  # a pasted traceback (stdin) is never a record
    for path in paths or [STDIN]:
        if path == STDIN:
            stream = stdin if stdin is not None else sys.stdin.buffer
            evidence.merge(scan(scanner, stream, "<stdin>"))
        elif is_record(path):
            evidence.merge(evidence_from_record(path, scanner))
        elif is_group(path):
            evidence.merge(evidence_from_group(path, scanner))
        else:
            with open_input(path) as stream:
                evidence.merge(scan(scanner, stream, path))
    return evidence


def diagnose_inputs(paths: list[str], ruleset: RuleSet, stdin: BinaryIO | None = None) -> Diagnosis:
    """Diagnose log files, stdin and run records together, as one failure (`gpufix explain`)."""
    evidence = evidence_from_text(paths, LogScanner.for_rules(ruleset), stdin)
    if evidence.bytes_read == 0 and not evidence.series:
        raise InputError(
            "the input is empty: nothing to explain",
            hint="paste a traceback into `gpufix explain` (end with Ctrl-D) or pass a log file",
        )
    return diagnose(evidence, ruleset)


def diagnose_record(record_dir: str, ruleset: RuleSet, output: bytes | None = None, note: str | None = None) -> Diagnosis:
    """Diagnose a run record (see `evidence_from_record`); `note` says why `output` was used."""
    evidence = evidence_from_record(record_dir, LogScanner.for_rules(ruleset), output)
    if note:
        evidence.notes.append(note)
    return diagnose(evidence, ruleset)

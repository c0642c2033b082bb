"""Evidence from a run record: its output, the stack dumps of a hang, and the measurements
(telemetry, the output rate, the probe's series, facts and exceptions), read through
`gpufix.record.reader.Record`."""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs start-up time; annotations are strings (PEP 563)
if TYPE_CHECKING:
    from gpufix.logscan import LogScanner
    from gpufix.record.reader import Record

from gpufix.diagnosis.inputs import open_input, scan
from gpufix.errors import InputError
from gpufix.evidence import Evidence, ExceptionRecord, Hit, LineRef


def add_record_evidence(evidence: Evidence, record_dir: str, scanner: LogScanner) -> None:
    """Everything of a record beyond its output.log: stack dumps (a hang: text for the same
    rules, rules/hangs), the flight-recorder reading (rules/distributed), what faulthandler wrote when
    a process crashed (its Python stacks: the job's stderr has only the signal) and the measurements
    (`add_record_measurements`)."""
    from gpufix.record.reader import Record

    record = Record(record_dir)
    for dump in [*record.stack_dumps, *filter(None, [record.flight_report]), *record.rank_errors, *record.fault_logs]:
        try:
            with open_input(dump) as stream:
                evidence.merge(scan(scanner, stream, dump))
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
        _add_exit_line(evidence, record, scanner)
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


def _add_exit_line(evidence: Evidence, record: Record, scanner: LogScanner) -> None:
    """A SIGKILL that gpufix did not send (not forwarded, not --on-hang kill) as a line rules can read: the job's
    output says nothing of it (the kernel's out-of-memory killer, a scheduler's limit or a `kill -9` leave no
    message), and the peak host memory of the job's processes that gpufix sampled goes with it."""
    from gpufix.record.layout import RESULT

    result = record.result
    if result.get("signal") != "SIGKILL" or "SIGKILL" in (result.get("forwarded_signals") or []):
        return
    if any(isinstance(h, dict) and h.get("killed") for h in result.get("hangs") or []):
        return
    rss = [s.value for s in evidence.series.get("host.rss_mib", [])]
    held = f"; its processes held {max(rss):.0f} MiB of host memory at gpufix's last samples" if rss else ""
    line = f"# gpufix-exit: the job was killed by SIGKILL (exit status 137), a signal gpufix did not send{held}"
    evidence.merge(_scan_at_lines(scanner, [(1, line)], record.file(RESULT)))


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
    from gpufix.probe.read import collective_lines, nonfinite_lines, read_probe_exceptions, read_probe_series
    from gpufix.series import Sample

    probe_dir = record.probe_dir
    _add_series(evidence, read_probe_series(probe_dir))
    for path, lines in [*nonfinite_lines(probe_dir).items(), *collective_lines(probe_dir).items()]:
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
    if isinstance(facts.get("open_files_limit"), int):
        evidence.facts.setdefault("open_files_limit", str(facts["open_files_limit"]))
    if facts.get("cuda_available") is False:  # no CUDA device at all: whatever ran, before a step or not, ran on the CPU
        evidence.facts.setdefault("gpu_used", "no")
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
    if isinstance(loader.get("num_workers"), int):
        evidence.facts.setdefault("loader_workers", str(loader["num_workers"]))
        if loader["num_workers"] > 0:  # half as many worker processes, for advice to use fewer (0: load in-process)
            evidence.facts.setdefault("workers_fewer", str(loader["num_workers"] // 2))
    if isinstance(loader.get("cpus_usable"), int):
        evidence.facts.setdefault("cpus_usable", str(loader["cpus_usable"]))
        ranks = facts.get("ranks") or [0]
        per_process = loader["cpus_usable"] // max(1, len(ranks))  # type: ignore[arg-type]
        evidence.facts.setdefault("workers_suggested", str(max(1, min(8, per_process - 1))))
        # a loader that waits on storage, the network or sleeps rather than the CPU gains from more workers than CPUs
        evidence.facts.setdefault("workers_suggested_io", str(max(2, min(8, 2 * per_process))))

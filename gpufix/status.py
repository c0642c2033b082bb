"""`gpufix status`: a run record at a glance (no click, no rich).

`status(record_dir)` reads a running or finished record (docs/run-record.md, docs/probe.md) and
returns a plain dict: the run (name, command, state, exit status, elapsed), the probe's step rate
and data-wait fraction per rank, per-GPU summaries of the catalogue's status rows (gpufix.signals:
utilisation, memory, temperature and power; last, min, max, and ~40 values over time for a
sparkline), and the current findings of `explain`. `render_text` turns that dict into the text
report; `sparkline` draws the values.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import statistics
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from gpufix import signals
from gpufix.errors import GpufixError, InputError
from gpufix.record.group import GROUP_META, group_parts, is_group
from gpufix.record.layout import OUTPUT_INDEX, OUTPUT_LOG, PROBE, TELEMETRY
from gpufix.record.meta import supervisor_alive
from gpufix.record.reader import Record, RecordTelemetry, is_record, line_kind

BLOCKS = "▁▂▃▄▅▆▇█"
POINTS = 40  # values kept per series for its sparkline
RECENT_S = 60.0  # the "recent" window for step rate and data wait, seconds before the last step record

# The rows per GPU, from the catalogue (gpufix.signals: `status=` is a row's place). Each is
# summarised under its field's name in the status document, but for two older names.
GPU_ROWS = signals.shown("status")
_KEYS = {"gpu.util_gpu_pct": "util_pct", "gpu.memory_used_mib": "memory_mib"}


def _key(signal: signals.Signal) -> str:
    return _KEYS.get(signal.name, signal.field)


def _fixed_scale(signal: signals.Signal) -> tuple[float | None, float | str | None]:
    """A sparkline's scale: a percentage 0..100, a field with a limit 0..the limit's value (a
    field name), else None (the values' own min..max)."""
    if signal.unit == "%":
        return 0.0, 100.0
    return (0.0, signal.limit) if signal.limit else (None, None)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def sparkline(values: Sequence[float | None], width: int = POINTS, lo: float | None = None,
              hi: float | None = None) -> str:
    """Values as block characters `▁..█`, at most `width` of them (longer input is averaged in
    `width` consecutive chunks). None (a gap) is a space. The scale is `lo`..`hi` when given,
    else the values' own min..max; values that are all equal are drawn mid-height."""
    if width <= 0 or not values:
        return ""
    points: list[float | None] = [_number(v) for v in values]
    if len(points) > width:
        chunks: list[float | None] = []
        for i in range(width):
            part = [v for v in points[i * len(points) // width:(i + 1) * len(points) // width] if v is not None]
            chunks.append(sum(part) / len(part) if part else None)
        points = chunks
    present = [v for v in points if v is not None]
    if not present:
        return " " * len(points)
    low = min(present) if lo is None else lo
    high = max(present) if hi is None else hi
    out = []
    for v in points:
        if v is None:
            out.append(" ")
        elif high <= low:
            out.append(BLOCKS[len(BLOCKS) // 2 - 1] if lo is None and hi is None else (BLOCKS[-1] if v >= high else BLOCKS[0]))
        else:
            frac = min(1.0, max(0.0, (v - low) / (high - low)))
            out.append(BLOCKS[min(len(BLOCKS) - 1, int(frac * len(BLOCKS)))])
    return "".join(out)


def downsample(points: Sequence[tuple[float, float]], n: int = POINTS) -> list[float | None]:
    """(t, value) pairs in time order as at most `n` values: the samples themselves when there
    are no more than `n`, else the mean of each of `n` equal stretches of time (None: no sample)."""
    if len(points) <= n:
        return [round(v, 3) for _, v in points]
    t0, t1 = points[0][0], points[-1][0]
    span = (t1 - t0) or 1.0
    sums, counts = [0.0] * n, [0] * n
    for t, v in points:
        i = min(n - 1, int((t - t0) / span * n))
        sums[i] += v
        counts[i] += 1
    return [round(s / c, 3) if c else None for s, c in zip(sums, counts)]


def _summary(points: list[tuple[float, float]]) -> dict[str, Any] | None:
    if not points:
        return None
    values = [v for _, v in points]
    return {"last": values[-1], "min": min(values), "max": max(values), "mean": round(sum(values) / len(values), 3),
            "samples": len(values), "values": downsample(points)}


# ---------------------------------------------------------------------------------------------
# Finding a record


def _start_key(path: Path) -> tuple[str, float]:
    start = str(Record(path).meta.get("start_utc") or "")
    try:
        mtime = path.stat().st_mtime
    except OSError:
        mtime = 0.0
    return (start, mtime)


def _group_key(path: Path) -> tuple[str, float]:
    return max((_start_key(Path(part)) for _rank, part in group_parts(path)), default=("", 0.0))


def newest_record(parent: str | Path) -> Path | None:
    """The record (or Slurm step of task records) under `parent` that started last (meta.json
    `start_utc`, then mtime)."""
    folder = Path(parent)
    if not folder.is_dir():
        return None
    records = [(p, _start_key(p) if is_record(p) else _group_key(p)) for p in folder.iterdir()
               if p.is_dir() and (is_record(p) or is_group(p))]
    return max(records, key=lambda r: r[1])[0] if records else None


def find_record(record: str | None, parent: str) -> Path:
    """RECORD itself, the newest record inside it when it is a folder of records, or the newest
    under `parent`. Raises InputError (exit 2) when there is none."""
    if record:
        path = Path(record)
        if not path.exists():
            raise InputError(f"{record}: no such record", hint="pass a folder made by `gpufix run`, e.g. gpufix-runs/<run>")
        if is_record(path) or is_group(path):
            return path
        inner = newest_record(path) if path.is_dir() else None
        # neither a record nor a folder of them: Record.open raises, saying which file is missing
        return inner if inner is not None else Path(Record.open(record).path)
    found = newest_record(parent)
    if found is None:
        raise InputError(f"no run record under {parent}",
                         hint="start one with `gpufix run python train.py`, or pass RECORD / --record-dir DIR")
    return found


# ---------------------------------------------------------------------------------------------
# Reading it


def _unix(stamp: Any) -> float | None:
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _last_write(record: Path) -> float | None:
    times = []
    for path in (record / OUTPUT_LOG, record / TELEMETRY, record / OUTPUT_INDEX, *record.glob(f"{PROBE}/*.jsonl")):
        try:
            times.append(path.stat().st_mtime)
        except OSError:
            continue
    return max(times) if times else None


def _run_info(record: Path, meta: dict[str, Any], result: dict[str, Any], now: float) -> dict[str, Any]:
    start = _unix(meta.get("start_utc"))
    end = _unix(result.get("end_utc") or meta.get("end_utc"))
    if result or meta.get("status") == "finished":
        state = "finished"
    else:
        state = "running"
        # gpufix died before the job ended (kill -9, a crashed node): the record stops there.
        if supervisor_alive(meta) is False:
            state = "interrupted"
    if isinstance(result.get("duration_s"), (int, float)):
        elapsed = float(result["duration_s"])
    elif start is not None:
        if state == "finished" and end is not None:
            until = end
        elif state == "interrupted":
            until = _last_write(record) or now  # the record stops when gpufix did
        else:
            until = now
        elapsed = until - start
    else:
        elapsed = None
    command = meta.get("command")
    return {
        "record": str(record),
        "name": meta.get("name") or record.name,
        "command": shlex.join(str(c) for c in command) if isinstance(command, list) else None,
        "host": meta.get("host"),
        "mode": meta.get("mode", "run"),
        "state": state,
        "exit_status": result.get("exit_status") if state == "finished" else None,
        "signal": result.get("signal") if state == "finished" else None,
        "start_utc": meta.get("start_utc"),
        "end_utc": result.get("end_utc") or meta.get("end_utc"),
        "elapsed_s": round(elapsed, 3) if elapsed is not None else None,
    }


def _gpus(telemetry: RecordTelemetry) -> tuple[list[dict[str, Any]], list[str]]:
    """Per-GPU summaries and telemetry notes from telemetry.jsonl: every GPU's, the job's marked."""
    limits = tuple(s.limit for s in GPU_ROWS if s.limit)  # their last value scales the rows
    read = tuple(dict.fromkeys((*(s.field for s in GPU_ROWS), *limits)))
    per_gpu: dict[str, dict[str, list[tuple[float, float]]]] = {}
    last_of: dict[str, dict[str, float]] = {}
    notes: list[str] = []
    names: dict[str, str] = {}
    xids: dict[str, list[dict[str, Any]]] = {}
    for _line, t, obj in telemetry.lines:
        kind = line_kind(obj)
        if kind == "xid":
            xids.setdefault(str(obj.get("gpu")), []).append({"t": t, "xid": obj["xid"]})
        elif kind == "gpus":
            names.update((str(g.get("gpu")), str(g["name"])) for g in obj["gpus"] if isinstance(g, dict) and g.get("name"))
        elif kind == "sample":
            gpu = str(obj["gpu"])
            fields = per_gpu.setdefault(gpu, {})
            for field in read:
                value = _number(obj.get(field))
                if value is not None:
                    fields.setdefault(field, []).append((t, value))
                    last_of.setdefault(gpu, {})[field] = value
        elif kind == "note":
            notes.append(obj["note"])
    job = {str(g) for g in telemetry.job_gpus or ()}  # empty: the record does not say
    out = []
    for gpu in sorted(per_gpu, key=lambda g: (not g.isdigit(), int(g) if g.isdigit() else 0, g)):
        fields = per_gpu[gpu]
        entry: dict[str, Any] = {"gpu": int(gpu) if gpu.isdigit() else gpu, "name": names.get(gpu),
                                 "job": (gpu in job) if job else None}
        for signal in GPU_ROWS:
            entry[_key(signal)] = _summary(sorted(fields.get(signal.field, [])))
        for limit in limits:
            entry[limit] = last_of.get(gpu, {}).get(limit)
        entry["xids"] = xids.get(gpu, [])
        out.append(entry)
    return out, notes


def _training(probe_dir: str) -> list[dict[str, Any]]:
    """Per rank: steps, recent step rate and data-wait fraction, and their values over time."""
    if not os.path.isdir(probe_dir):
        return []
    from gpufix.probe.read import iter_records, probe_files

    ranks: dict[str, list[dict[str, Any]]] = {}
    for path in probe_files(probe_dir):
        if not path.name.startswith("probe-"):
            continue
        rank: Any = None
        for _number_, record in iter_records(path):
            kind = record["kind"]
            if kind == "start":
                rank = record.get("rank")
            elif kind == "distributed" and isinstance(record.get("rank"), int):
                rank = record["rank"]
            elif kind == "step" and _number(record.get("t")) is not None:
                ranks.setdefault(str(rank) if isinstance(rank, int) else "0", []).append(record)
    out = []
    for rank in sorted(ranks, key=lambda r: int(r) if r.isdigit() else 0):
        steps = sorted(ranks[rank], key=lambda r: r["t"])
        last = steps[-1]
        recent = [r for r in steps if r["t"] >= last["t"] - RECENT_S]
        rates = [(r["t"], 1.0 / st) for r in steps if (st := _number(r.get("step_time_s"))) and st > 0]
        fracs = [(r["t"], min(1.0, max(0.0, w / st))) for r in steps
                 if (st := _number(r.get("step_time_s"))) and st > 0 and (w := _number(r.get("data_wait_s"))) is not None]
        rate = None
        first_step, last_step = _number(recent[0].get("step")), _number(last.get("step"))
        if len(recent) >= 2 and first_step is not None and last_step is not None and last["t"] > recent[0]["t"]:
            # The steps counted after the first recent record, over the time since it.
            rate = (last_step - first_step) / (last["t"] - recent[0]["t"])
        else:  # one record: its own mean step time
            st = _number(last.get("step_time_s"))
            rate = 1.0 / st if st else None
        recent_fracs = [f for t, f in fracs if t >= last["t"] - RECENT_S]
        out.append({
            "rank": int(rank) if rank.isdigit() else rank,
            "steps": int(last_step) if last_step is not None else len(steps),
            "last_step_t": last["t"],
            "steps_per_s": round(rate, 3) if rate is not None else None,
            "step_time_s": _summary([(t, v) for t, v in ((r["t"], _number(r.get("step_time_s"))) for r in steps)
                                     if v is not None]),
            "steps_per_s_values": downsample(rates),
            "data_wait_frac": round(statistics.median(recent_fracs), 4) if recent_fracs else None,
            "data_wait_values": downsample(fracs),
            "num_workers": last.get("num_workers"),
        })
    return out


def _findings(record: Record, ruleset: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """Codes, titles and messages of what the diagnosis finds in the record now."""
    from gpufix.diagnosis import diagnose_inputs
    from gpufix.rules.loader import load_ruleset

    try:
        diagnosis = diagnose_inputs([record.path], ruleset if ruleset is not None else load_ruleset())
    except InputError:
        return [], []  # nothing written or measured yet
    except GpufixError as exc:
        kept = [f for f in record.result.get("findings") or [] if isinstance(f, dict)]
        return ([{k: f.get(k) for k in ("code", "title", "message", "severity", "category")} for f in kept],
                [f"cannot diagnose the record now ({exc.message}); findings from result.json"])
    return ([{"code": f.code, "title": f.title, "message": f.message, "severity": f.severity, "category": f.category}
             for f in diagnosis.findings], [])


def status(record_dir: str | Path, ruleset: Any = None, now: float | None = None) -> dict[str, Any]:
    """Everything `gpufix status` shows about one record, as plain data (see the module doc); for
    the folder of a Slurm step's task records, each task's under `tasks` and the step's as `run`."""
    if is_group(record_dir):
        return _group_status(Path(record_dir), ruleset, now)
    record = Record.open(Path(record_dir))  # NotARecordError (exit 2) when it is none
    run = _run_info(Path(record.path), record.meta, record.result, time.time() if now is None else now)
    gpus, notes = _gpus(record.telemetry)
    findings, finding_notes = _findings(record, ruleset)
    return {"run": run, "training": _training(record.probe_dir), "gpus": gpus, "telemetry_notes": notes,
            "findings": findings, "notes": finding_notes}


def _group_status(group: Path, ruleset: Any, now: float | None) -> dict[str, Any]:
    tasks = [{"rank": rank, **status(part, ruleset, now)} for rank, part in group_parts(group)]
    states = [t["run"]["state"] for t in tasks]
    failed = [t["rank"] for t in tasks if t["run"]["state"] == "finished" and t["run"]["exit_status"] not in (0, None)]
    state = "running" if "running" in states else "interrupted" if "interrupted" in states else "finished"
    try:
        meta = json.loads((group / GROUP_META).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        meta = {}
    run = {"record": str(group), "name": group.name, "state": state, "tasks": len(tasks),
           "expected_tasks": meta.get("ntasks"), "failed_tasks": failed,
           "exit_status": (max((t["run"]["exit_status"] or 0 for t in tasks), default=0) if state == "finished" else None)}
    return {"run": run, "slurm": meta, "tasks": tasks}


def render_group_text(doc: dict[str, Any]) -> str:
    """A Slurm step's tasks: one line each, then each task's own report."""
    run = doc["run"]
    slurm = doc.get("slurm") or {}
    step = f"slurm step {slurm.get('job_id', '?')}.{slurm.get('step_id', '?')}"
    expected = f" of {run['expected_tasks']}" if run.get("expected_tasks") else ""
    failed = f", failed: task {', '.join(map(str, run['failed_tasks']))}" if run["failed_tasks"] else ""
    lines = [f"{run['name']}  ({step}: {run['tasks']}{expected} tasks, {run['state']}{failed})"]
    for task in doc["tasks"]:
        t = task["run"]
        exit_part = f"exit {t['exit_status']}" if t.get("exit_status") is not None else t["state"]
        root = task["findings"][0]["code"] if task["findings"] else "-"
        lines.append(f"  task {task['rank']}  {exit_part:<10} {root:<8} {t['record']}")
    for task in doc["tasks"]:
        lines += ["", f"== task {task['rank']} ==", render_text(task).rstrip("\n")]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Text


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def _fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _scale(gpu: dict[str, Any], lo: float | None, hi: float | str | None) -> tuple[float | None, float | None]:
    if isinstance(hi, str):
        hi = gpu.get(hi)
        if hi is None:
            return None, None
    return lo, hi


def _row_texts(signal: signals.Signal, s: dict[str, Any], limit: float | None) -> tuple[str, str]:
    """A GPU row's numbers: the last value (of its limit, where known) and the range. Memory is
    shown in GiB, and its peak; a percentage without a space."""
    if signal.unit == "MiB":
        of = f"/{limit / 1024:.0f} GiB" if limit else " GiB"
        return f"{s['last'] / 1024:.1f}{of}", f"max {s['max'] / 1024:.1f} GiB"
    unit = signal.unit if signal.unit == "%" else f" {signal.unit}"
    of = f"/{limit:.0f}{unit}" if limit else unit
    return f"{s['last']:.0f}{of}", f"{s['min']:.0f}-{s['max']:.0f}{unit}"


def render_text(doc: dict[str, Any]) -> str:
    """The status report as plain text (sparklines from the downsampled values)."""
    if "tasks" in doc:
        return render_group_text(doc)
    run = doc["run"]
    state = run["state"]
    if state == "finished":
        exit_part = f"exit {run['exit_status']}" if run.get("exit_status") is not None else "exit ?"
        if run.get("signal"):
            exit_part += f", {run['signal']}"
        head = f"finished, {exit_part}, took {_duration(run['elapsed_s'])}"
    elif state == "interrupted":
        head = f"interrupted: gpufix stopped recording {_duration(run['elapsed_s'])} after the start"
    else:
        head = f"running for {_duration(run['elapsed_s'])}"
    lines = [f"{run['name']}  ({head})", f"  record   {run['record']}"]
    if run.get("command"):
        lines.append(f"  command  {run['command']}")
    if run.get("start_utc"):
        lines.append(f"  started  {run['start_utc']}" + (f" on {run['host']}" if run.get("host") else ""))

    lines += ["", "Training (probe)"]
    if not doc["training"]:
        lines.append("  no step measured yet (no probe records: --no-probe, no torch, or before the first step)")
    for rank in doc["training"]:
        rate = rank["steps_per_s"]
        wait = rank["data_wait_frac"]
        lines.append(f"  rank {rank['rank']}  step {rank['steps']}")
        lines.append(f"    step rate  {_fmt(rate, 2) + ' steps/s':<16}  {sparkline(rank['steps_per_s_values'], lo=0.0)}")
        if wait is None:
            lines.append("    data wait  -                 (no DataLoader measured)")
        else:
            workers = f", num_workers={rank['num_workers']}" if rank.get("num_workers") is not None else ""
            lines.append(f"    data wait  {f'{wait * 100:.0f}% of steps':<16}  "
                         f"{sparkline(rank['data_wait_values'], lo=0.0, hi=1.0)}  (median, recent{workers})")

    lines += ["", "GPUs"]
    if not doc["gpus"]:
        notes = doc["telemetry_notes"]
        lines.append(f"  {notes[0]}" if notes else "  no GPU telemetry")
    for gpu in doc["gpus"]:
        whose = {True: "", False: "  (not this job's)", None: ""}[gpu.get("job")]
        lines.append(f"  GPU {gpu['gpu']}" + (f"  {gpu['name']}" if gpu.get("name") else "") + whose)
        for signal in GPU_ROWS:
            summary = gpu[_key(signal)]
            if summary is None:
                lines.append(f"    {signal.label:<7} {'-':>14}")
                continue
            lo, hi = _scale(gpu, *_fixed_scale(signal))
            now_text, range_text = _row_texts(signal, summary, gpu.get(signal.limit) if signal.limit else None)
            lines.append(f"    {signal.label:<7} {now_text:>14}  {sparkline(summary['values'], lo=lo, hi=hi)}  "
                         f"({range_text})")
        if gpu.get("xids"):
            events = gpu["xids"]
            shown = ", ".join(f"{e['xid']} at {time.strftime('%H:%M:%S', time.gmtime(e['t']))}Z" for e in events[:5])
            more = f" and {len(events) - 5} more" if len(events) > 5 else ""
            lines.append(f"    Xid     {shown}{more}")

    lines += ["", "Findings"]
    if not doc["findings"]:
        lines.append("  none so far" if state == "running" else "  none")
    for finding in doc["findings"]:
        lines.append(f"  {finding['code']}  {finding['title']}")
        if finding.get("message"):
            lines.append(f"          {finding['message']}")
    for note in (doc["telemetry_notes"] if doc["gpus"] else []) + doc["notes"]:
        lines.append(f"  note: {note}")
    return "\n".join(lines) + "\n"

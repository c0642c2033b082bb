"""Read a probe folder (`<record>/probe`): the `probe.*` series of gpufix.series.SERIES, the
exceptions the job raised, the facts (versions, placement, loader settings, CUDA use), and what
an experiment's knobs did.

Files (docs/probe.md): `probe-<pid>.jsonl` per probed process, `worker-<pid>.jsonl` per DataLoader
worker that caught an exception, plus `oom-<pid>.pickle`, `faults-<pid>.log`, `stacks-<pid>.txt`.
A torn or unreadable line is skipped (the job may have been killed mid-write). No torch here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpufix.evidence import ExceptionRecord, LineRef
from gpufix.series import SERIES, Sample

# Step-record field -> series name. data_wait_frac is derived (data_wait_s / step_time_s), and so
# are amp_steps (the record's `amp_steps`, else `n`, where it has `skipped`) and amp_skipped_frac.
STEP_SERIES = {
    "step_time_s": "probe.step_time_s",
    "data_wait_s": "probe.data_wait_s",
    "compute_s": "probe.compute_s",
    "cuda_allocated_mib": "probe.cuda_allocated_mib",
    "cuda_reserved_mib": "probe.cuda_reserved_mib",
    "cuda_peak_mib": "probe.cuda_peak_mib",
    "batch_size": "probe.batch_size",
    "num_workers": "probe.num_workers",
    "rss_mib": "probe.rss_mib",  # read only once SERIES names it (host memory per rank: leaks)
    "skipped": "probe.amp_skipped",  # steps AMP's GradScaler skipped (inf/NaN gradients)
    "amp_scale": "probe.amp_scale",
}
DATA_WAIT_FRAC = "probe.data_wait_frac"
AMP_STEPS = "probe.amp_steps"
AMP_SKIPPED_FRAC = "probe.amp_skipped_frac"
_STEP_SERIES_KNOWN = {field: name for field, name in STEP_SERIES.items() if name in SERIES}
_WORKER_MESSAGE = re.compile(r"^Caught (\w+) in DataLoader worker process (\d+)")


def probe_files(probe_dir: str | Path) -> list[Path]:
    """The JSONL files of a probe folder: workers' first (their exceptions come first), by pid."""
    folder = Path(probe_dir)
    if not folder.is_dir():
        return []

    def order(path: Path) -> tuple[int, int]:
        pid = path.stem.rsplit("-", 1)[-1]
        return (0 if path.name.startswith("worker-") else 1, int(pid) if pid.isdigit() else 0)

    # regular files only: a FIFO or device put in a record must not block or never end a read
    return sorted([p for p in (*folder.glob("worker-*.jsonl"), *folder.glob("probe-*.jsonl")) if p.is_file()], key=order)


def iter_records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) for each readable line of one probe file."""
    try:
        data = path.read_bytes()
    except OSError:
        return
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("kind"), str):
            yield number, record


def _ranked_records(path: Path) -> Iterator[tuple[int, dict[str, Any], int | None]]:
    """(line number, record, rank) of one probe file, the rank known so far from its `start` and
    `distributed` records (None for a process with no rank: a launcher, a single-process job)."""
    start: dict[str, Any] = {}
    rank: int | None = None
    for number, record in iter_records(path):
        kind = record["kind"]
        if kind == "start":
            start = record
        elif kind == "distributed" and isinstance(record.get("rank"), int):
            rank = record["rank"]
        known = rank if rank is not None else start.get("rank")
        yield number, record, known if isinstance(known, int) else None


def _group(rank: int | None) -> str:
    """A series' rank group: the rank, "0" when the process has none."""
    return str(rank) if rank is not None else "0"


def read_probe_series(probe_dir: str | Path) -> dict[str, list[Sample]]:
    """The `probe.*` series, one sample per step record, grouped by rank ("0" when unknown)."""
    series: dict[str, list[Sample]] = {}
    for path in probe_files(probe_dir):
        if not path.name.startswith("probe-"):
            continue
        source = str(path)
        for number, record, rank in _ranked_records(path):
            group = _group(rank)
            if record["kind"] != "step" or not isinstance(record.get("t"), (int, float)):
                continue
            t = float(record["t"])
            for field, name in _STEP_SERIES_KNOWN.items():
                value = record.get(field)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    series.setdefault(name, []).append(Sample(t, float(value), group, source, number))
            step_time, wait = record.get("step_time_s"), record.get("data_wait_s")
            if isinstance(step_time, (int, float)) and isinstance(wait, (int, float)) and step_time > 0:
                frac = min(1.0, max(0.0, wait / step_time))
                series.setdefault(DATA_WAIT_FRAC, []).append(Sample(t, frac, group, source, number))
            skipped, judged = record.get("skipped"), _amp_steps(record)
            if _is_number(skipped) and judged:
                series.setdefault(AMP_STEPS, []).append(Sample(t, float(judged), group, source, number))
                frac = min(1.0, max(0.0, skipped / judged))
                series.setdefault(AMP_SKIPPED_FRAC, []).append(Sample(t, frac, group, source, number))
    return series


def nonfinite_lines(probe_dir: str | Path) -> dict[str, list[tuple[int, str]]]:
    """The first non-finite loss or gradient each process saw (finite.py), as text lines for the
    rules (NUM010), by probe file: {path: [(line number in that file, text)]}.

    `gpufix probe: the loss became nan at optimizer step 37 (rank 0)`
    `gpufix probe: the gradient of fc.weight (shape [64, 1]) became inf at optimizer step 25 (rank 1)`
    """
    out: dict[str, list[tuple[int, str]]] = {}
    for path in probe_files(probe_dir):
        for number, record, rank in _ranked_records(path):
            group = _group(rank)
            if record["kind"] != "nonfinite" or record.get("value") not in ("nan", "inf"):
                continue
            step = record.get("step")
            if not _is_number(step):
                continue
            what = "the loss"
            if record.get("what") == "gradient":
                shape = record.get("shape")
                shape_text = f" (shape {list(shape)})" if isinstance(shape, list) else ""
                name = record.get("param")
                what = f"the gradient of {name}{shape_text}" if isinstance(name, str) else f"a gradient{shape_text}"
            text = f"gpufix probe: {what} became {record['value']} at optimizer step {int(step)} (rank {group})"
            out.setdefault(str(path), []).append((number, text))
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _amp_steps(record: dict[str, Any]) -> int:
    """The steps of a step record that a GradScaler judged (0 when it has no `skipped`)."""
    if not _is_number(record.get("skipped")):
        return 0
    judged = record.get("amp_steps", record.get("n", 1))
    return int(judged) if _is_number(judged) and judged > 0 else 0


def read_probe_exceptions(probe_dir: str | Path) -> list[ExceptionRecord]:
    """Every exception the probe saw, oldest of each chain first; `cause` indexes this list.

    A DataLoader worker's original exception comes before the main process's "Caught X in
    DataLoader worker process N", which names it as its cause.
    """
    out: list[ExceptionRecord] = []
    worker_index: dict[tuple[str, int], int] = {}  # (type, worker id) -> index of the worker's exception
    for path in probe_files(probe_dir):
        source = str(path)
        for number, record, rank in _ranked_records(path):
            if record["kind"] == "exception":
                offset = len(out)
                for item in record.get("exceptions") or []:
                    if not isinstance(item, dict):
                        continue
                    type_name = str(item.get("type", "?"))
                    message = str(item.get("message", ""))
                    first_line = message.split("\n", 1)[0]
                    text = f"{type_name}: {first_line}" if first_line else type_name
                    cause = item.get("cause")
                    cause = offset + cause if isinstance(cause, int) and 0 <= cause < len(out) - offset else None
                    worker = _WORKER_MESSAGE.match(message)
                    if cause is None and worker:
                        cause = worker_index.get((worker.group(1), int(worker.group(2))))
                    out.append(ExceptionRecord(type_name, message, LineRef(source, number, text, rank), cause))
                    if record.get("where") == "dataloader_worker" and isinstance(record.get("worker_id"), int):
                        short = type_name.rsplit(".", 1)[-1]
                        worker_index[(short, record["worker_id"])] = len(out) - 1
    return out


def collective_lines(probe_dir: str | Path) -> dict[str, list[tuple[int, str]]]:
    """When the ranks' exceptions were raised inside different collectives (rank 0 in all_reduce,
    rank 1 in broadcast: a timeout or a closed connection is then how the mismatch ended), lines
    for the rules (DST047), by probe file, at each exception's line there:

    `[rank0]: # gpufix-collectives: ranks failed in different collectives: rank 0 in all_reduce at main (train.py:18); ...`
    `[rank1]: # gpufix-collectives: rank 1 failed in broadcast at main (train.py:23)`
    """
    from gpufix.watchdog.analyze import collective_frame

    failed: dict[int, tuple[str, int, str, str]] = {}  # rank -> (probe file, line, op, user frame)
    for path in probe_files(probe_dir):
        for number, record, rank in _ranked_records(path):
            if record["kind"] != "exception" or rank is None or rank in failed:
                continue
            for item in record.get("exceptions") or []:
                found = collective_frame(item.get("frames") or []) if isinstance(item, dict) else None
                if found:
                    failed[rank] = (str(path), number, *found)
                    break
    if len(failed) < 2 or len({op for _p, _n, op, _w in failed.values()}) < 2:
        return {}
    summary = "; ".join(f"rank {rank} in {op} at {where}" for rank, (_p, _n, op, where) in sorted(failed.items()))
    out: dict[str, list[tuple[int, str]]] = {}
    first = min(failed)
    for rank, (path, number, op, where) in sorted(failed.items()):
        # one line per exception (a line of evidence per place): the first rank's carries the summary
        text = (f"ranks failed in different collectives: {summary}" if rank == first else
                f"rank {rank} failed in {op} at {where}")
        out.setdefault(path, []).append((number, f"[rank{rank}]: # gpufix-collectives: {text}"))
    return out


def read_probe_facts(probe_dir: str | Path) -> dict[str, Any]:
    """What the probe established about the job, for rules and reports.

    Per process under `processes`; summed up at the top level over the processes that trained
    (took optimizer steps), or all of them when none did.
    """
    folder = Path(probe_dir)
    processes = [_process_facts(path) for path in probe_files(folder) if path.name.startswith("probe-")]
    trained = [p for p in processes if p["steps"]] or processes
    facts: dict[str, Any] = {"probe_dir": str(folder), "found": bool(processes), "processes": processes}
    first = trained[0] if trained else {}
    for key in ("torch", "cuda_build", "cuda_available", "device_count", "cuda_visible_devices", "open_files_limit"):
        facts[key] = first.get(key)
    facts["steps"] = sum(p["steps"] for p in trained)
    facts["ranks"] = sorted({p["rank"] for p in trained if p["rank"] is not None})
    facts["world_size"] = first.get("world_size")
    facts["param_devices"] = sorted({d for p in trained for o in p["optimizers"] for d in o.get("param_devices") or {}})
    facts["batch_devices"] = sorted({d for p in trained for b in p["batches"] for d in b.get("devices") or {}})
    facts["loaders"] = [loader for p in trained for loader in p["loaders"]]
    facts["cuda_initialized"] = any(p["cuda_initialized"] for p in trained) if trained else None
    facts["cuda_ever_allocated"] = any(p["cuda_ever_allocated"] for p in trained) if trained else None
    peaks = [p["cuda_peak_mib"] for p in trained if p.get("cuda_peak_mib") is not None]
    facts["cuda_peak_mib"] = max(peaks) if peaks else None
    precisions = [p["precision"] for p in trained if p.get("precision")]
    facts["precision"] = precisions[0] if precisions else None
    fracs = [p["data_wait_frac"] for p in trained if p.get("data_wait_frac") is not None]
    facts["data_wait_frac"] = max(fracs) if fracs else None
    amp = [p for p in trained if p["amp_steps"]]
    facts["amp_steps"] = sum(p["amp_steps"] for p in amp) if amp else None
    facts["amp_skipped_steps"] = sum(p["amp_skipped_steps"] for p in amp) if amp else None
    scales = [p["amp_scale_min"] for p in amp if p.get("amp_scale_min") is not None]
    facts["amp_scale_min"] = min(scales) if scales else None
    facts["oom_snapshots"] = sorted(str(p) for p in folder.glob("oom-*.pickle"))
    facts["fault_logs"] = sorted(str(p) for p in folder.glob("faults-*.log") if p.stat().st_size > 0)
    facts["stack_dumps"] = sorted(str(p) for p in folder.glob("stacks-*.txt"))
    facts["probe_errors"] = [e for p in processes for e in p["probe_errors"]]
    facts["exceptions"] = len(read_probe_exceptions(folder))
    return facts


def read_probe_knobs(probe_dir: str | Path) -> dict[str, Any]:
    """What an experiment's knobs (GPUFIX_EXPERIMENT, docs/probe.md) did, over every probed process.

    `applied` and `not_applied` mirror the request: `{"stop_after_steps": 5, "dataloader":
    {"batch_size": 16}, "autocast": "bf16", ...}` with the values in force, and the same keys with
    the reason each was not applied. A DataLoader setting applied to one loader and not to
    another is in both. `stopped` is the first stop record (`reason`: "steps" or "seconds",
    `step`, `elapsed_s`), None when the job was not stopped by the probe; `redirected` the
    distinct writes sent to the redirect folder (`from`, `to`, `writer`). Also: `requested` (the
    first process's request), `loaders` (per loader: `loader`, `applied`, `not_applied`),
    `autocast` (the decision per device) and `skipped` (writers not run).
    """
    applied: dict[str, Any] = {}
    not_applied: dict[str, Any] = {}
    out: dict[str, Any] = {"applied": applied, "not_applied": not_applied, "stopped": None, "redirected": [],
                           "requested": None, "loaders": [], "autocast": [], "skipped": []}
    seen: set[tuple[Any, ...]] = set()
    for path in probe_files(probe_dir):
        if not path.name.startswith("probe-"):
            continue
        for _number, record in iter_records(path):
            kind = record["kind"]
            if kind == "stopped":
                if out["stopped"] is None:
                    out["stopped"] = _without(record, "kind", "t")
                continue
            if kind != "knobs":
                continue
            if "loader" in record:
                _merge_loader_knobs(out, record)
            elif isinstance(record.get("autocast"), dict):
                decision = record["autocast"]
                out["autocast"].append(decision)
                short = {"bfloat16": "bf16", "float16": "fp16"}.get(str(decision.get("dtype")), decision.get("dtype"))
                if decision.get("applied"):
                    applied["autocast"] = short
                else:
                    not_applied.setdefault("autocast", decision.get("reason") or "not applied")
            elif isinstance(record.get("redirected"), dict):
                entry = record["redirected"]
                key = ("redirected", entry.get("from"), entry.get("to"))
                if key not in seen:
                    seen.add(key)
                    out["redirected"].append(entry)
            elif isinstance(record.get("skipped"), dict):
                key = ("skipped", record["skipped"].get("writer"))
                if key not in seen:
                    seen.add(key)
                    out["skipped"].append(record["skipped"])
            else:  # the first record of a process: the request and the knobs in force from the start
                if out["requested"] is None:
                    out["requested"] = record.get("requested")
                for key, value in (record.get("applied") or {}).items():
                    applied[key] = value
                for key, value in (record.get("not_applied") or {}).items():
                    if isinstance(value, dict):
                        for name, reason in value.items():
                            _section(not_applied, key).setdefault(name, reason)
                    else:
                        not_applied.setdefault(key, value)
    return out


def read_state_dict_loads(probe_dir: str | Path) -> list[dict[str, Any]]:
    """The `Module.load_state_dict` calls the knobs `state_dict_keys` / `state_dict_rename` saw, in
    order, over every probed process: `module` (class name), and with `state_dict_keys`
    `model_count`, `checkpoint_count`, `missing` and `unexpected` (the keys, in their order; at
    most 5000 each, `truncated` past that); with `state_dict_rename`, `renamed` (keys renamed)."""
    out: list[dict[str, Any]] = []
    for path in probe_files(probe_dir):
        if not path.name.startswith("probe-"):
            continue
        for _number, record in iter_records(path):
            if record["kind"] == "state_dict_load":
                load = _without(record, "kind", "t")
                load.setdefault("missing", [])
                load.setdefault("unexpected", [])
                out.append(load)
    return out


def _merge_loader_knobs(out: dict[str, Any], record: dict[str, Any]) -> None:
    """One loader's knobs record: its DataLoader settings under `dataloader`; `cache_batches`
    (a loader whose batches are still loaded) at the top, as it was asked."""
    loader_applied = record.get("applied") if isinstance(record.get("applied"), dict) else {}
    loader_not = record.get("not_applied") if isinstance(record.get("not_applied"), dict) else {}
    out["loaders"].append({"loader": record.get("loader"), "applied": loader_applied, "not_applied": loader_not})
    for key, value in loader_applied.items():
        _section(out["applied"], "dataloader")[key] = value
    for key, reason in loader_not.items():
        if key == "cache_batches":
            out["not_applied"].setdefault(key, reason)
        else:
            _section(out["not_applied"], "dataloader").setdefault(key, reason)


def _section(mapping: dict[str, Any], key: str) -> dict[str, Any]:
    """mapping[key] as a dict (a reason given for the whole section stays, under "")."""
    value = mapping.get(key)
    if not isinstance(value, dict):
        value = {} if value is None else {"": value}
        mapping[key] = value
    return value


def _process_facts(path: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"file": str(path), "pid": None, "role": None, "torch": None, "cuda_build": None,
                           "rank": None, "world_size": None, "steps": 0, "optimizers": [], "loaders": [],
                           "batches": [], "cuda_available": None, "device_count": None,
                           "cuda_initialized": None, "cuda_ever_allocated": None, "cuda_peak_mib": None,
                           "probe_errors": [], "ended": False, "amp_steps": 0, "amp_skipped_steps": 0,
                           "amp_scale_min": None, "amp_scale_last": None, "autocast": []}
    step_time = wait = 0.0
    amp_steps = amp_skipped = 0
    peak = None
    for number, record in iter_records(path):
        kind = record["kind"]
        out["last_line"] = number
        if kind == "start":
            for key in ("pid", "role", "torch", "cuda_build", "rank", "world_size", "local_rank", "argv0",
                        "python", "torch_import_s", "faulthandler", "open_files_limit"):
                out[key] = record.get(key)
            env = record.get("env") or {}
            out["cuda_visible_devices"] = env.get("CUDA_VISIBLE_DEVICES")
            out["env"] = env
        elif kind == "distributed":
            out["rank"], out["world_size"] = record.get("rank"), record.get("world_size")
        elif kind == "cuda":
            _cuda_facts(out, record)
        elif kind == "optimizer":
            out["optimizers"].append(_without(record, "kind", "t"))
        elif kind == "loader":
            out["loaders"].append(_without(record, "kind", "t"))
        elif kind == "batch":
            out["batches"].append(_without(record, "kind", "t"))
        elif kind == "autocast":
            out["autocast"].append(_without(record, "kind", "t"))
        elif kind == "step":
            out["steps"] = max(out["steps"], int(record.get("step") or 0))
            n = int(record.get("n") or 1)
            if isinstance(record.get("step_time_s"), (int, float)) and isinstance(record.get("data_wait_s"), (int, float)):
                step_time += record["step_time_s"] * n
                wait += record["data_wait_s"] * n
            if isinstance(record.get("cuda_peak_mib"), (int, float)):
                peak = max(peak or 0.0, record["cuda_peak_mib"])
            if _amp_steps(record):
                amp_steps += _amp_steps(record)
                amp_skipped += int(record["skipped"])
            if _is_number(record.get("amp_scale")):
                out["amp_scale_last"] = record["amp_scale"]
                if out["amp_scale_min"] is None or record["amp_scale"] < out["amp_scale_min"]:
                    out["amp_scale_min"] = record["amp_scale"]
        elif kind == "probe_error":
            out["probe_errors"].append(_without(record, "kind"))
        elif kind == "end":
            out["ended"] = True
            out["steps"] = max(out["steps"], int(record.get("steps") or 0))
            out["cuda_initialized"] = record.get("cuda_initialized")
            out["cuda_ever_allocated"] = record.get("cuda_ever_allocated")
            if isinstance(record.get("cuda_peak_mib"), (int, float)):
                peak = max(peak or 0.0, record["cuda_peak_mib"])
            if isinstance(record.get("cuda"), dict):
                _cuda_facts(out, record["cuda"])
            out["rss_peak_mib"] = record.get("rss_peak_mib")
            for key in ("amp_steps", "amp_skipped_steps", "amp_scale_min", "amp_scale_last"):
                if _is_number(record.get(key)):
                    out[key] = record[key]
    out["cuda_peak_mib"] = peak
    if not out["amp_steps"]:  # no end record (killed): what the step records say
        out["amp_steps"], out["amp_skipped_steps"] = amp_steps, amp_skipped
    if out["cuda_ever_allocated"] is None and peak is not None:
        out["cuda_ever_allocated"] = peak > 0
    out["data_wait_frac"] = round(wait / step_time, 4) if step_time > 0 else None
    out["data_wait_total_s"] = round(wait, 4) if step_time > 0 else None
    out["precision"] = _precision(out)
    return out


def _precision(process: dict[str, Any]) -> str | None:
    """fp16, bf16 or fp32: what the process trained in, from its autocast regions, its parameters'
    dtype and whether a GradScaler judged its steps (None before any optimizer step)."""
    if not process["steps"] and not process["optimizers"]:
        return None
    dtypes = {str(a.get("dtype")) for a in process["autocast"] if a.get("enabled") is not False}
    params: dict[str, int] = {}
    for optimizer in process["optimizers"]:
        for dtype, count in (optimizer.get("param_dtypes") or {}).items():
            params[dtype] = params.get(dtype, 0) + int(count)
    main_param = max(params, key=lambda d: params[d]) if params else None
    if "float16" in dtypes or main_param == "float16":
        return "fp16"
    if "bfloat16" in dtypes or main_param == "bfloat16":
        return "bf16"
    if process["amp_steps"]:  # a GradScaler without autocast the probe saw: apex-style fp16
        return "fp16"
    return "fp32" if main_param in ("float32", None) else main_param


def _cuda_facts(out: dict[str, Any], record: dict[str, Any]) -> None:
    for key in ("available", "device_count"):
        if record.get(key) is not None:
            out["cuda_available" if key == "available" else key] = record[key]
    if record.get("initialized"):
        out["cuda_initialized"] = True
    for key in ("nvml_device_count", "device_name", "source"):
        if record.get(key) is not None:
            out[f"cuda_{key}" if not key.startswith("cuda") else key] = record[key]


def _without(record: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in keys}

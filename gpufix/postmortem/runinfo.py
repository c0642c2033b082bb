"""What a run's record and logs say around the failure: meta.json / result.json, the moment of a
byte in output.log (from output.idx), the lines around an evidence line, and the environment
(host, driver, CUDA, torch, NCCL, GPU, Python, packages, training variables).
"""

from __future__ import annotations

import os
from collections import deque
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from gpufix.postmortem.times import parse_iso
from gpufix.record.layout import OUTPUT_INDEX, iter_chunks
from gpufix.safeio import is_regular, open_regular

if TYPE_CHECKING:
    from collections.abc import Iterator

    from gpufix.postmortem.analyze import FileResult
    from gpufix.safeio import BoundedReader

CONTEXT_BEFORE = 200
CONTEXT_AFTER = 50
CONTEXT_LINE_CHARS = 2000
_SKIP_BYTES = 1 << 20  # the rest of a long line is read past in pieces of this size
ENV_KEYS = ("host", "driver", "cuda", "torch", "nccl", "gpu", "python")
# gpufix's own variables in a record's environment: GPUFIX_* (GPUFIX_PROBE_DIR, set per record,
# differs between any two runs) and the probe's folder, which `gpufix run` puts first on the job's
# PYTHONPATH (gpufix.probe.probe_environb). The path is that of the installation that made the
# record, so any `.../gpufix/probe/inject` entry is gpufix's, whichever venv it lives in.
OWN_VARIABLE_PREFIX = "GPUFIX_"
_PROBE_ENTRY_TAIL = ("gpufix", "probe", "inject")


def read_record(record_dir: str) -> dict[str, Any]:
    """`{"meta": dict|None, "result": dict|None}` of a record (through record.reader); a missing or
    unreadable file is None."""
    from gpufix.record.reader import Record

    record = Record(record_dir)
    return {"meta": record.meta or None, "result": record.result or None}


def _bounded_lines(f: BoundedReader) -> Iterator[tuple[bytes, int]]:
    """Each line of `f` as (its first CONTEXT_LINE_CHARS bytes, its full length in bytes).

    The rest of a longer line is read and dropped in bounded pieces: iterating the reader would
    hold a whole line (twice, while it is joined), and one line of a log can be gigabytes long.
    """
    while True:
        head = f.readline(CONTEXT_LINE_CHARS)
        if not head:
            return
        length = len(head)
        if length == CONTEXT_LINE_CHARS and not head.endswith(b"\n"):
            while True:
                rest = f.readline(_SKIP_BYTES)
                length += len(rest)
                if not rest or rest.endswith(b"\n"):
                    break
        yield head, length


def line_context(path: str, line: int) -> tuple[int | None, list[str], list[str]]:
    """(byte offset of `line`, up to 200 lines before it, up to 50 after), streaming the file once
    and holding at most CONTEXT_LINE_CHARS bytes of any one line."""
    before: deque[str] = deque(maxlen=CONTEXT_BEFORE)
    after: list[str] = []
    offset = None
    position = 0
    try:
        with open_regular(path) as f:
            for number, (head, length) in enumerate(_bounded_lines(f), 1):
                text = head.decode("utf-8", "replace")
                if number < line:
                    before.extend(text.replace("\r", "\n").splitlines() or [""])
                elif number == line:
                    offset = position
                elif len(after) < CONTEXT_AFTER:
                    after.extend(text.replace("\r", "\n").splitlines() or [""])
                else:
                    break
                position += length
    except OSError:
        return None, [], []
    return offset, list(before), after


def record_time_at(record_dir: str, offset: int, record: dict[str, Any]) -> datetime | None:
    """The moment the byte at `offset` of output.log was written: meta start_utc + output.idx `t`."""
    start = parse_iso((record.get("meta") or {}).get("start_utc"))
    if start is None or not is_regular(os.path.join(record_dir, OUTPUT_INDEX)):
        return None
    moment = None
    for chunk in iter_chunks(record_dir):
        if chunk.offset <= offset:
            moment = chunk.time_s
        if chunk.offset <= offset < chunk.offset + chunk.length:
            break
    return start + timedelta(seconds=round(moment)) if moment is not None else None


def _first(*values: object) -> str | None:
    for value in values:
        if isinstance(value, (str, int, float)) and str(value).strip():
            return str(value).strip()
    return None


def _meta_gpu_driver(meta: dict[str, Any]) -> tuple[str | None, str | None]:
    """Driver and GPU name where a record's meta.json carries them (inventory-style keys)."""
    inventory = meta.get("inventory") if isinstance(meta.get("inventory"), dict) else meta
    driver = _first(inventory.get("driver_version"), meta.get("driver_version"))
    gpus = inventory.get("gpus") or meta.get("gpus")
    name = None
    if isinstance(gpus, list) and gpus and isinstance(gpus[0], dict):
        name = _first(gpus[0].get("name"))
    return driver, name


def environment(record: dict[str, Any], files: list[FileResult]) -> dict[str, Any]:
    """Host, driver, CUDA, torch, NCCL, GPU, Python, packages and variables, each None when unknown.

    meta.json comes first; banners in the logs (`nvidia-smi`, `NCCL version`, torch version
    lines) fill what it lacks.
    """
    meta = record.get("meta") or {}
    packages = meta.get("packages") if isinstance(meta.get("packages"), dict) else {}
    job_python = meta.get("job_python") if isinstance(meta.get("job_python"), dict) else {}
    python = meta.get("python") if isinstance(meta.get("python"), dict) else {}
    driver, gpu = _meta_gpu_driver(meta)
    nccl = next((v for k, v in sorted(packages.items()) if k.startswith("nvidia-nccl")), None)
    cuda = next((v for k, v in sorted(packages.items()) if k.startswith("nvidia-cuda-runtime")), None)
    logged: dict[str, str] = {}
    for f in files:
        for key, value in (f.facts.get("env") or {}).items():
            if f.role == "kernel" and key != "host":
                continue
            logged.setdefault(key, value)
    torch = _first(packages.get("torch"), logged.get("torch"))
    env: dict[str, Any] = {
        "host": _first(meta.get("host"), logged.get("host")),
        "driver": _first(driver, logged.get("driver")),
        "cuda": _first(logged.get("cuda"), cuda),
        "torch": torch,
        "nccl": _first(nccl, logged.get("nccl")),
        "gpu": _first(gpu, logged.get("gpu")),
        "python": _first(job_python.get("python"), python.get("version")),
        "packages": dict(packages) if packages else None,
        "variables": _variables(meta),
    }
    return env


def _variables(meta: dict[str, Any]) -> dict[str, Any] | None:
    """The job's recorded variables less those gpufix set for it (meta.json's `gpufix_env`; a record
    older than that list names none, and `users_variables` recognises gpufix's own by name). Its
    PYTHONPATH stays: gpufix only put the probe first on it, and `users_variables` takes that out."""
    variables = meta.get("environment")
    if not isinstance(variables, dict):
        return None
    own = meta.get("gpufix_env")
    own = {name for name in own if isinstance(name, str)} - {"PYTHONPATH"} if isinstance(own, list) else set()
    return {name: value for name, value in variables.items() if name not in own}


def _is_probe_entry(entry: str) -> bool:
    parts = [p for p in entry.replace("\\", "/").split("/") if p]
    return tuple(parts[-3:]) == _PROBE_ENTRY_TAIL


def users_variables(variables: dict[str, Any] | None) -> dict[str, Any]:
    """A record's variables less gpufix's own: no GPUFIX_*, and PYTHONPATH without the probe's
    entry (dropped when nothing else is on it), so only what the user set is compared."""
    out = {}
    for name, value in (variables or {}).items():
        if name.upper().startswith(OWN_VARIABLE_PREFIX):
            continue
        if name == "PYTHONPATH" and isinstance(value, str):
            entries = value.split(os.pathsep)
            kept = [entry for entry in entries if not _is_probe_entry(entry)]
            if len(kept) != len(entries):
                if not any(kept):
                    continue
                value = os.pathsep.join(kept)
        out[name] = value
    return out


def environment_diff(good: dict[str, Any], bad: dict[str, Any]) -> list[dict[str, Any]]:
    """What differs between two runs' environments: the main keys, then packages and variables
    (gpufix's own variables left out: `users_variables`)."""
    diff = []
    for key in ENV_KEYS:
        if good.get(key) != bad.get(key) and (good.get(key) or bad.get(key)):
            diff.append({"key": key, "last_good": good.get(key), "first_bad": bad.get(key)})
    shown = {"torch"} | {d["key"] for d in diff}
    for group, prefix in (("packages", "package "), ("variables", "variable ")):
        a, b = good.get(group) or {}, bad.get(group) or {}
        if group == "variables":
            a, b = users_variables(a), users_variables(b)
        if not a and not b:
            continue
        for name in sorted(set(a) | set(b)):
            if name in shown or a.get(name) == b.get(name):
                continue
            if group == "packages" and name.startswith("nvidia-nccl") and "nccl" in shown:
                continue
            diff.append({"key": prefix + name, "last_good": a.get(name), "first_bad": b.get(name)})
    return diff

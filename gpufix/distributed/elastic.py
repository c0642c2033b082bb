"""torchelastic's error files, kept in the run record.

torchrun gives each worker a `TORCHELASTIC_ERROR_FILE`; a worker whose entry point is wrapped in
`torch.distributed.elastic.multiprocessing.errors.record` writes its exception there (message,
traceback, time) and torchrun names the first one in its summary. The files live in torchrun's
temporary log folder, gone with the machine. After a failed run gpufix copies each rank's file
(the path is in the probe's record of the process) into `<record>/ranks/` and writes its traceback
as text beside it, so the diagnosis reads each rank's exception under its rank, even when the ranks'
output is interleaved.
"""

from __future__ import annotations

import json
import os
from typing import Any

from gpufix.record.layout import PROBE, RANKS
from gpufix.safeio import read_regular

ENV_ERROR_FILE = "TORCHELASTIC_ERROR_FILE"
MAX_ERROR_FILE_BYTES = 1 << 20


def error_text(data: dict[str, Any]) -> str | None:
    """The traceback (else the message) of an error file's JSON: {"message": {"message", "extraInfo":
    {"py_callstack", "timestamp"}}} in torch >= 1.9, {"message": "..."} in older versions."""
    message = data.get("message")
    if isinstance(message, dict):
        extra = message.get("extraInfo") or {}
        stack = extra.get("py_callstack") if isinstance(extra, dict) else None
        if isinstance(stack, str) and stack.strip():
            return stack
        message = message.get("message")
    return message if isinstance(message, str) and message.strip() else None


def collect_error_files(record_dir: str) -> list[str]:
    """Copy the error file each probed process was given (when it wrote one) into `<record>/ranks/`:
    `error-rank<R>.json` as written and `error-rank<R>.txt` with its traceback. Returns the text files."""
    from gpufix.probe.read import read_probe_facts

    probe_dir = os.path.join(record_dir, PROBE)
    if not os.path.isdir(probe_dir):
        return []
    written = []
    for process in read_probe_facts(probe_dir).get("processes") or []:
        path = (process.get("env") or {}).get(ENV_ERROR_FILE)
        if not isinstance(path, str) or not path:
            continue
        try:
            raw = read_regular(path, MAX_ERROR_FILE_BYTES)
            data = json.loads(raw)
        except (OSError, ValueError):
            continue  # the rank wrote none (no @record, or it did not fail), or it is unreadable
        text = error_text(data) if isinstance(data, dict) else None
        if text is None:
            continue
        rank = process.get("rank")
        name = f"error-rank{rank}" if isinstance(rank, int) else f"error-pid{process.get('pid')}"
        folder = os.path.join(record_dir, RANKS)
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            with open(os.path.join(folder, name + ".json"), "wb") as f:
                f.write(raw)
            with open(os.path.join(folder, name + ".txt"), "w", encoding="utf-8") as f:
                # each line under torchrun's own rank prefix, so the diagnosis attributes it to the rank
                prefix = f"[rank{rank}]:" if isinstance(rank, int) else ""
                f.write(f"# gpufix: torchelastic error file of rank {rank} ({path})\n"
                        + "".join(f"{prefix}{line}\n" for line in text.rstrip().splitlines()))
        except OSError:
            continue
        written.append(os.path.join(folder, name + ".txt"))
    return written

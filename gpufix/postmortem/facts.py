"""Facts about one log file read from its first and last 256 KiB: time range, environment banners,
exit and success markers, torchrun's own "Root Cause" rank, whether it is a kernel log.

The rules scan finds failures; this finds the context a post-mortem needs around them, cheaply
(two bounded reads whatever the file's size), as a JSON-ready dict that the index caches with
the scan.
"""

from __future__ import annotations

import re
from typing import Any

from gpufix.diagnosis.inputs import BINARY_SNIFF_BYTES, looks_binary
from gpufix.safeio import NotRegularFile, open_regular
from gpufix.postmortem.times import file_mtime, iso, parse_line_time

EDGE_BYTES = 256 * 1024
XID_MARK = re.compile(rb"NVRM: Xid")

_ENV = {
    "driver": re.compile(r"Driver Version:\s*([\d.]+)"),
    "cuda": re.compile(r"CUDA Version:\s*([\d.]+)"),
    "gpu": re.compile(r"\|\s+\d+\s+((?:NVIDIA|Tesla|Quadro) [^|]*?)\s{2,}(?:On|Off)\s+\|"),
    "nccl": re.compile(r"NCCL version ([\d.]+)"),
    "torch": re.compile(r"\b(?:torch|PyTorch)(?:==| version:? | )v?(\d+\.\d+(?:\.\d+)?(?:\+\w+)?)\b"),
}
_SYSLOG_HOST = re.compile(r"^\w{3} +\d+ \d\d:\d\d:\d\d (\S+) kernel:", re.M)
_SRUN_EXIT = re.compile(r"srun: error: (\S+): tasks? ([\d,-]+): Exited with exit code (\d+)")
_ELASTIC_EXIT = re.compile(r"exitcode\s*:\s*(-?\d+)")
_FAILED_MARKS = re.compile(
    r"ChildFailedError|slurmstepd: error: \*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED"
)
_SUCCESS_MARKS = re.compile(
    r"[Tt]raining (?:completed|complete|finished|done)|Finished training|Done training|"
    r"'train_runtime'|Trainer\.fit` stopped: `max_(?:epochs|steps)=\d+` reached|"
    r"exit(?:ed with)? (?:code|status) 0\b|Job finished successfully"
)
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):")
_RC_RANK = re.compile(r"rank\s*:\s*(\d+)")
_RC_TIME = re.compile(r"time\s*:\s*(\S+)")


def _edges(path: str) -> tuple[bytes, bytes, int]:
    """The first and last 256 KiB of a regular file (the size stat-ed at open bounds every read)."""
    with open_regular(path) as f:
        size = f.size
        head = f.read(EDGE_BYTES)
        if size <= 2 * EDGE_BYTES:
            return head + f.read(), b"", size
        f.seek(size - EDGE_BYTES)
        tail = f.read(EDGE_BYTES)
    tail = tail[tail.find(b"\n") + 1:]  # a torn first line
    return head, tail, size


def _times(text: str, year: int | None, reverse: bool) -> str | None:
    lines = text.splitlines()
    for line in (reversed(lines) if reverse else lines):
        moment = parse_line_time(line, year)
        if moment:
            return iso(moment)
    return None


def file_facts(path: str) -> dict[str, Any]:
    """JSON-ready facts about one file (see the module docstring); never raises.

    A file that cannot be read, or is not a regular file, gets `{"error": why, "size": 0}` (`why`
    is a phrase for a note: `cannot read (Permission denied)`, `a FIFO (named pipe), ...`).
    """
    try:
        head, tail, size = _edges(path)
    except NotRegularFile as exc:  # a FIFO, a device, a socket: never read; the caller notes it
        return {"error": exc.strerror, "size": 0}
    except OSError as exc:  # permission denied, gone: the caller notes it
        return {"error": f"cannot read ({exc.strerror or exc})", "size": 0}
    facts: dict[str, Any] = {"size": size}
    if looks_binary(head[:BINARY_SNIFF_BYTES]):
        facts["binary"] = True
        return facts
    mtime = file_mtime(path)
    year = mtime.year if mtime else None
    head_text = head.decode("utf-8", "replace").replace("\r", "\n")
    tail_text = tail.decode("utf-8", "replace").replace("\r", "\n") if tail else head_text
    facts["first_time"] = _times(head_text, year, reverse=False)
    facts["last_time"] = _times(tail_text, year, reverse=True) or _times(head_text, year, reverse=True)
    facts["kernel"] = bool(XID_MARK.search(head))
    env: dict[str, str] = {}
    for key, regex in _ENV.items():
        m = regex.search(head_text)
        if m:
            env[key] = m.group(1).strip()
    host = _SYSLOG_HOST.search(head_text)
    if host:
        env["host"] = host.group(1)
    facts["env"] = env
    both = head_text + "\n" + tail_text if tail else head_text
    srun = _SRUN_EXIT.search(tail_text)
    if srun:
        facts["exit_status"] = int(srun.group(3))
        facts["failed_node"] = srun.group(1)
    elastic = _ELASTIC_EXIT.search(tail_text)
    if elastic and "exit_status" not in facts:
        facts["exit_status"] = int(elastic.group(1))
    facts["failed_marker"] = bool(_FAILED_MARKS.search(tail_text))
    facts["success_marker"] = bool(_SUCCESS_MARKS.search(tail_text))
    rc = _ROOT_CAUSE.search(both)
    if rc:
        block = both[rc.end():rc.end() + 800]
        rank, when = _RC_RANK.search(block), _RC_TIME.search(block)
        facts["torchrun_rank"] = int(rank.group(1)) if rank else None
        facts["torchrun_time"] = iso(parse_line_time(when.group(1))) if when else None
    return facts

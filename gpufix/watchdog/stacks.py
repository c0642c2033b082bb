"""Stack dumps of a job's processes, without changing the job: `py-spy dump` where it is
installed and allowed to attach (ptrace), else what /proc shows to anyone (each thread's state
and kernel wait channel, the kernel stack when readable). No signal is sent to the job, so a
dump never changes its behaviour; the /proc fallback is honest about what it cannot see (the
Python frames) and says how to get them.

Each process's dump goes to `<dir>/<UTC time>-<pid>.txt`, headed by `#` lines that name the
process, the tool, the tree, and gpufix's reading of the stacks (`# gpufix-hang:` lines, which
the rules in rules/hangs/ match, so `gpufix explain` diagnoses a dump file as well).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

from gpufix.watchdog.analyze import annotate
from gpufix.watchdog.proctree import ProcInfo, cmdline, is_python, job_tree, rank_of, wchan

PYSPY_TIMEOUT_S = 10.0
MAX_PROCESSES = 64


@dataclass(frozen=True)
class StackDump:
    """One process's dump: where it was written and how it was taken."""

    pid: int
    path: str
    tool: str  # "py-spy", "py-spy (no --native)", "/proc"
    text: str


def pyspy_path() -> str | None:
    """py-spy on PATH, or next to this interpreter (a venv's bin, not on PATH when not activated)."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return beside if os.access(beside, os.X_OK) else None


def _pyspy(exe: str, pid: int) -> tuple[str | None, str]:
    """(dump, tool) or (None, why it failed). --native first: it shows lock waits."""
    why = ""
    for args, tool in ((["--native"], "py-spy --native"), ([], "py-spy")):
        try:
            proc = subprocess.run([exe, "dump", "--pid", str(pid), *args], capture_output=True,
                                  timeout=PYSPY_TIMEOUT_S, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            why = f"{type(exc).__name__}: {exc}"
            continue
        out = proc.stdout.decode("utf-8", "replace")
        if proc.returncode == 0 and "Thread " in out:
            return out, tool
        why = (proc.stderr.decode("utf-8", "replace").strip() or out.strip() or f"exit {proc.returncode}")[:300]
    return None, why


def proc_dump(pid: int) -> str:
    """What /proc tells about each thread of `pid` (no Python frames)."""
    lines = []
    try:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        tids = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                raw = f.read().decode("utf-8", "replace")
            name, state = raw[raw.find("(") + 1:raw.rfind(")")], raw[raw.rfind(")") + 2:].split(" ", 1)[0]
        except OSError:
            continue
        lines.append(f'Thread {tid} (state {state}): "{name}" waiting in kernel: {wchan(pid, tid) or "-"}')
        try:
            with open(f"/proc/{pid}/task/{tid}/stack", encoding="utf-8", errors="replace") as f:
                lines.extend("    " + ln.strip() for ln in f if ln.strip())
        except OSError:
            pass  # root only on most systems
    return "\n".join(lines) + "\n"


def dump_process(pid: int, tree: list[ProcInfo] | None = None, reason: str = "") -> tuple[str, str]:
    """(full text, tool) for one process: header, gpufix's reading, then the dump."""
    exe = pyspy_path()
    body, tool, why = None, "/proc", ""
    if is_python(pid):
        if exe:
            body, result = _pyspy(exe, pid)
            tool = result if body is not None else "/proc"
            why = "" if body is not None else f"py-spy could not attach: {result}"
        else:
            why = "py-spy is not installed (pip install py-spy) - Python frames not available"
    if body is None:
        body = proc_dump(pid)
    info = next((p for p in tree or () if p.pid == pid), None)
    head = [
        "# gpufix stack dump",
        f"# pid {pid} ({info.comm if info else '?'}, state {info.state if info else '?'}): {cmdline(pid)}",
        f"# time: {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}" + (f"  reason: {reason}" if reason else ""),
        f"# tool: {tool}" + (f" ({why})" if why else ""),
    ]
    if tree:
        head.append("# process tree (pid ppid state command):")
        head.extend(f"#   {p.pid} {p.ppid} {p.state} {cmdline(p.pid)[:120] or p.comm}" for p in tree[:MAX_PROCESSES])
    # processes are known by rank where a launcher gave them one, never by pid alone
    rank = rank_of(pid)
    who = f"pid {pid} ({rank})" if rank else f"pid {pid}"
    head.extend(f"# gpufix-hang: {who} {line}" for line in annotate(body))
    return "\n".join(head) + "\n\n" + body, tool


RELAY_NAME = "gpufix-relay"  # the probe's per-rank output relay (_gpufix_probe/ranklog.py): not the job's code


def dump_tree(root: int, pgid: int | None, out_dir: str, reason: str = "") -> list[StackDump]:
    """Dump every process of the job's tree into `out_dir` (created); [] when the job is gone."""
    tree = [p for p in job_tree(root, pgid) if p.comm != RELAY_NAME]
    if not tree:
        return []
    os.makedirs(out_dir, mode=0o700, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dumps = []
    for info in tree[:MAX_PROCESSES]:
        text, tool = dump_process(info.pid, tree, reason)
        path = os.path.join(out_dir, f"{stamp}-{info.pid}.txt")
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError:
            continue
        dumps.append(StackDump(info.pid, path, tool, text))
    return dumps
